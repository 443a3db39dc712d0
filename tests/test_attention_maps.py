"""Attention maps: ``output_attentions=True`` returns every layer's and head's softmax weights, equal to Hugging Face's
``output_attentions`` on converted BERT, GPT-2 and T5 (padded batches); ``lmforge attention`` draws them."""

from __future__ import annotations

import pytest
import torch

import lmforge
from helpers import tiny_config
from lmforge.models.transformer import Transformer
from test_interop_hf_parity import _batch, _hf

ATOL = 1e-5


def _compare(ours: list[torch.Tensor], theirs, real_queries: torch.Tensor) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        rows = real_queries[:, None, :, None].expand_as(a)  # compare real query rows (padding rows are unused)
        assert (a - b)[rows].abs().max().item() <= ATOL


@pytest.mark.parametrize("case", ["bert", "gpt2-lm", "t5-v1.0"])
def test_attention_maps_equal_hugging_face(case):
    hf = _hf(case)
    model = lmforge.from_hf(hf).eval()
    hf.set_attn_implementation("eager")  # HF returns weights only from its eager attention
    inputs, real = _batch(model.config)
    with torch.no_grad():
        theirs = hf(**inputs, output_attentions=True)
        ours = model(**inputs, output_attentions=True)
        plain = model(**inputs)
    torch.testing.assert_close(ours.last_hidden_state, plain.last_hidden_state, atol=1e-5, rtol=1e-5)
    if model.config.arch == "encoder-decoder":
        src_real = inputs["attention_mask"].bool()
        _compare(ours.encoder_attentions, theirs.encoder_attentions, src_real)
        _compare(ours.attentions, theirs.decoder_attentions, real)
        _compare(ours.cross_attentions, theirs.cross_attentions, real)
        assert ours.cross_attentions[0].shape[-1] == inputs["input_ids"].shape[1]
    else:
        _compare(ours.attentions, theirs.attentions, real)
    weights = ours.attentions[0]
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights.sum(-1)))  # each row a distribution


def test_maps_only_when_asked_and_with_return_attentions_alias():
    model = Transformer(tiny_config(arch="decoder", n_layers=3, share_layers=True)).eval()
    ids = torch.randint(1, 97, (2, 6))
    assert model(ids).attentions is None
    maps = model(ids, return_attentions=True).attentions
    assert len(maps) == 3 and maps[0].shape == (2, 4, 6, 6)  # one map per depth, even with one shared layer
    assert torch.all(maps[1].triu(1) == 0)  # causal: nothing above the diagonal


# ------------------------------------------------------------------ lmforge attention
@pytest.fixture(scope="module", params=["bert", "gpt", "t5"])
def model_folder(request, tmp_path_factory):
    from task_helpers import body, tokenizer

    folder = tmp_path_factory.mktemp(request.param)
    tok = tokenizer(folder, request.param)
    body(request.param, tok).save(folder / "model", tokenizer=tok)
    return request.param, folder / "model"


def test_attention_cli_writes_a_map_per_layer_and_head_and_a_grid(model_folder, tmp_path):
    from lmforge.cli.main import main

    family, folder = model_folder
    args = ["attention", "--model", str(folder), "alice lives in paris", "--out", str(tmp_path / "maps")]
    if family == "t5":
        args += ["--target", "where does alice live"]
    assert main(args) == 0
    kinds = ["encoder", "decoder", "cross"] if family == "t5" else ["self"]
    for kind in kinds:
        heads = sorted(p.name for p in (tmp_path / "maps" / kind).iterdir())
        assert heads == [f"layer{layer:02d}-head{head:02d}.png" for layer in range(2) for head in range(2)]
        assert (tmp_path / "maps" / f"{kind}-grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (tmp_path / "maps").iterdir() if p.is_file()) == sorted(f"{k}-grid.png" for k in kinds)


def test_attention_cli_refuses_long_texts_and_writes_nothing(model_folder, tmp_path, capsys):
    from lmforge.cli.main import main

    _, folder = model_folder
    assert main(["attention", "--model", str(folder), "alice lives in paris " * 10, "--out", str(tmp_path / "maps"),
                 "--max-tokens", "8"]) != 0
    assert "more than the attention-map limit of 8" in capsys.readouterr().err
    assert not (tmp_path / "maps").exists()


def test_the_fast_path_never_writes_the_weights_out(monkeypatch):
    from lmforge.nn.attention import Attention

    model = Transformer(tiny_config(arch="encoder-decoder", n_decoder_layers=1)).eval()
    src, tgt = torch.randint(1, 97, (2, 6)), torch.randint(1, 97, (2, 4))
    expected = model(src, decoder_input_ids=tgt).logits

    def written_out(*args, **kwargs):
        raise AssertionError("softmax written out without output_attentions")

    monkeypatch.setattr(Attention, "_probs", written_out)
    torch.testing.assert_close(model(src, decoder_input_ids=tgt).logits, expected)  # SDPA only
    with pytest.raises(AssertionError, match="written out"):
        model(src, decoder_input_ids=tgt, output_attentions=True)
