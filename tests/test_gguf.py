"""``lmforge convert to-gguf``: llama.cpp runs the file as lmforge runs the model.

- logits of the GGUF file in llama-cpp-python equal lmforge's (<= 1e-3 at f32; measured 4e-6 for the Llama
  shapes, 8e-4 for GPT-2, whose gap is llama.cpp's fp16 GELU table) for GPT-2-, Llama-, Qwen2- and
  Mistral-shaped decoders whose weights give unit-variance outputs (init's 0.02 would leave attention nearly
  uniform and hide a wrong q/k layout: the Llama file written without the RoPE row interleave is checked to be
  off by more than 0.05; it is off by 4.5);
- the tokenizer inside the file gives lmforge's prompt ids (BOS added exactly when lmforge adds it);
- f16 and q8_0 files load and stay close;
- refusals are one line, exit 2, and write nothing.

The llama-cpp tests skip (with the reason) only when llama_cpp is not installed; the rest need only gguf.
"""

from __future__ import annotations

import gzip
import importlib.util

import numpy as np
import pytest
import torch

from lmforge.cli.main import main
from lmforge.datasets import FILES
from lmforge.generation.generate import encode_prompt
from lmforge.interop import gguf as lmforge_gguf
from lmforge.interop.gguf import GGUFExportError, convert_to_gguf, to_gguf
from lmforge.model_folder import save
from lmforge.models import build_model
from lmforge.models.quantize import quantize_model, save_quantized
from lmforge.tokenization import train_tokenizer

gguf = pytest.importorskip("gguf", reason="the gguf package is not installed (pip install 'lmforge[gguf]')")
needs_llama_cpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                     reason="llama-cpp-python is not installed (pip install llama-cpp-python)")

PROMPTS = ["It is a truth universally acknowledged, that a single man",
           "Elinor,  this eldest daughter's advice -- was 3.14 times\n\nbetter!",
           "Mrs. Dashwood née Smith: café, naïve, 1811; «quoi?»"]
TEXTS = PROMPTS + ["  leading spaces", "tabs\tand\nnewlines\r\n", "digits 1234567 and 0.001",
                   "emoji 🚀🦙 日本語", "they're I'll we've 'RE 'D", "trailing space ", "a  b   c    d"]
SHAPES = {  # (preset, overrides): one per llama.cpp arch, and Mistral's window
    "gpt2": ("gpt-tiny", dict(d_ff=144)),  # 144: ffn_down rows are not whole q8_0 blocks (kept f16)
    "llama": ("llama-tiny", dict()),
    "qwen2": ("llama-tiny", dict(qkv_bias=True, o_bias=False)),
    "mistral": ("llama-tiny", dict(sliding_window=64)),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "austen.txt"
    with gzip.open(FILES / "austen.txt.gz", "rt", encoding="utf-8") as f:
        path.write_text(f.read(200_000) + "\n\n" + "\n".join(TEXTS) * 3, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def tok(corpus):
    return train_tokenizer([corpus], kind="byte-bpe", vocab_size=600, family="gpt", show_progress=False)


def _sharpened(model, seed: int = 0):
    """Weights of unit-variance outputs (N(0, 1/fan_in); init's 0.02 leaves attention nearly uniform, which hides a
    wrong q/k layout); norms around 1, biases around 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() == 1:
                p.copy_((1.0 if "norm" in name else 0.0) + 0.1 * noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)
    return model.eval()


def _model(shape: str, tok):
    preset, overrides = SHAPES[shape]
    return _sharpened(build_model(preset, n_layers=2, d_model=64, n_heads=4, vocab_size=tok.vocab_size,
                                  max_seq_len=128, dropout=0.0, **{"d_ff": 128, **overrides}))


def _llama(path, **kw):
    import llama_cpp

    # f32 KV cache: the default f16 cache rounds keys and values to 3 decimal digits.
    return llama_cpp.Llama(model_path=str(path), logits_all=True, verbose=False, n_ctx=128, n_threads=2,
                           n_threads_batch=2, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, **kw)


def _llama_logits(llm, ids: list[int]) -> np.ndarray:
    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)])  # (T, V)


def _lmforge_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()  # (T, V)


def _logit_errors(model, tok, path) -> tuple[float, float, float]:
    """(max |difference|, RMS difference / RMS logit, share of positions with the same argmax) over PROMPTS."""
    llm = _llama(path)
    theirs, ours = [], []
    for prompt in PROMPTS:
        ids = encode_prompt(model, tok, prompt)
        assert llm.tokenize(prompt.encode(), add_bos=True, special=False) == ids
        theirs.append(_llama_logits(llm, ids))
        ours.append(_lmforge_logits(model, ids))
    a, b = np.concatenate(theirs), np.concatenate(ours)  # (sum T, V)
    rel = float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))
    return float(np.abs(a - b).max()), rel, float(np.mean(a.argmax(-1) == b.argmax(-1)))


def _max_logit_error(model, tok, path) -> float:
    return _logit_errors(model, tok, path)[0]


def _ggml_gelu(x: torch.Tensor) -> torch.Tensor:
    """ggml's CPU GELU: the tanh form looked up in a table by the input rounded to fp16, the value stored in fp16
    (ggml-cpu/vec.h, GGML_GELU_FP16), and exact outside [-10, 10]."""
    table = torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
    return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, table))


# ------------------------------------------------------------------------------------------------ llama.cpp
@needs_llama_cpp
@pytest.mark.parametrize("shape", list(SHAPES))
def test_f32_logits_match_lmforge(shape, tok, tmp_path):
    model = _model(shape, tok)
    out = to_gguf(model, tmp_path / "m.gguf", tokenizer=tok)
    assert out.arch == {"mistral": "llama"}.get(shape, shape) and out.family == shape
    spread = float(np.std(_lmforge_logits(model, tok.encode(PROMPTS[0]))))
    assert spread > 0.5  # the logits are not a near-constant that any file would match
    assert _max_logit_error(model, tok, out.path) <= 1e-3


@needs_llama_cpp
def test_gpt2_gap_is_ggml_gelu_table(tok, tmp_path):
    # GPT-2's f32 gap (~1e-3, the others' is ~1e-5) is llama.cpp's fp16 GELU table: with it in lmforge it shrinks.
    model = _model("gpt2", tok)
    out = to_gguf(model, tmp_path / "m.gguf", tokenizer=tok)
    plain = _max_logit_error(model, tok, out.path)
    for layer in model.decoder.layers:
        layer.ffn.act = _ggml_gelu
    assert _max_logit_error(model, tok, out.path) < plain / 2


@needs_llama_cpp
def test_llama_file_without_the_rope_interleave_is_far_off(tok, tmp_path, monkeypatch):
    # The check above can fail: a Llama file whose q/k rows keep our rotate-half order does not match.
    model = _model("llama", tok)
    monkeypatch.setattr(lmforge_gguf, "_interleave_halves", lambda rows, n_heads: rows)
    out = to_gguf(model, tmp_path / "wrong.gguf", tokenizer=tok)
    assert _max_logit_error(model, tok, out.path) > 0.05


@needs_llama_cpp
@pytest.mark.parametrize("shape", ["gpt2", "llama"])
@pytest.mark.parametrize("outtype, max_error, rel_error, argmax", [("f16", 0.02, 0.005, 0.97),
                                                                   ("q8_0", 0.6, 0.06, 0.85)])
def test_f16_and_q8_0_load_and_stay_close(shape, outtype, max_error, rel_error, argmax, tok, tmp_path):
    # q8_0 also rounds the activations to 8 bits in llama.cpp's CPU matmul, so it is the looser of the two.
    model = _model(shape, tok)
    out = to_gguf(model, tmp_path / f"m-{outtype}.gguf", tokenizer=tok, outtype=outtype)
    assert out.path.stat().st_size < 0.6 * to_gguf(model, tmp_path / "f32.gguf", tokenizer=tok).path.stat().st_size
    worst, rel, same_argmax = _logit_errors(model, tok, out.path)
    # Measured: f16 max 3e-3 (gpt2) / 8e-3 (llama), q8_0 7e-2 / 0.36, relative RMS 1.1% / 3.4% for q8_0.
    assert 1e-4 < worst <= max_error and rel <= rel_error and same_argmax >= argmax, (worst, rel, same_argmax)


@needs_llama_cpp
@pytest.mark.parametrize("family", ["gpt", "roberta"])
def test_tokenizer_inside_gives_lmforge_prompt_ids(family, corpus, tmp_path):
    tok = train_tokenizer([corpus], kind="byte-bpe", vocab_size=600, family=family, show_progress=False)
    model = _model("llama", tok)
    llm = _llama(to_gguf(model, tmp_path / "m.gguf", tokenizer=tok).path, vocab_only=True)
    for text in TEXTS:
        ids = encode_prompt(model, tok, text)
        assert llm.tokenize(text.encode(), add_bos=True, special=False) == ids, text
        assert (ids[0] == tok.token_to_id("<s>")) == (family == "roberta")  # BOS exactly when lmforge adds one
    assert llm.token_eos() == tok.special_token_ids()["eos_token_id"]


# ------------------------------------------------------------------------------------------------ the file
def test_fields_tensors_and_tokenizer_in_the_file(tok, tmp_path):
    for shape in SHAPES:
        model = _model(shape, tok)
        chat = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
        reader = gguf.GGUFReader(str(to_gguf(model, tmp_path / f"{shape}.gguf", tokenizer=tok, outtype="q8_0",
                                             chat_template=chat).path))
        fields = {name: f.contents() for name, f in reader.fields.items()}
        assert fields["tokenizer.chat_template"] == chat
        arch = fields["general.architecture"]
        assert fields["tokenizer.ggml.model"] == "gpt2" and fields["tokenizer.ggml.pre"] == "gpt-2"
        assert fields["tokenizer.ggml.tokens"] == [tok.id_to_token(i) for i in range(tok.vocab_size)]
        eos = tok.token_to_id("<|endoftext|>")
        assert fields["tokenizer.ggml.token_type"][eos] == gguf.TokenType.CONTROL
        assert fields["tokenizer.ggml.eos_token_id"] == eos and fields["tokenizer.ggml.add_bos_token"] is False
        assert len(fields["tokenizer.ggml.merges"]) == len(tok.backend.get_vocab()) - 256 - 1  # all but bytes, special
        assert fields[f"{arch}.block_count"] == 2 and fields[f"{arch}.embedding_length"] == 64
        assert fields[f"{arch}.context_length"] == (64 if shape == "mistral" else 128)
        types = {t.name: t.tensor_type.name for t in reader.tensors}
        assert ("output.weight" in types) == (not model.config.tie_embeddings)
        assert types["blk.0.attn_norm.weight"] == "F32" and types["token_embd.weight"] == "Q8_0"
        if shape == "gpt2":
            assert types["blk.0.attn_qkv.weight"] == "Q8_0" and types["blk.0.ffn_down.weight"] == "F16"
        if shape == "qwen2":
            assert "blk.0.attn_q.bias" in types and "blk.0.attn_output.bias" not in types


def test_rope_interleave_keeps_scores():
    # Rotating adjacent pairs of the interleaved rows gives the scores rotating halves gives the original rows.
    torch.manual_seed(0)
    n_heads, hd, T = 2, 8, 5
    q, k = torch.randn(n_heads * hd, 3), torch.randn(n_heads * hd, 3)
    x = torch.randn(T, 3)
    angles = torch.arange(T)[:, None] * 10000.0 ** (-torch.arange(hd // 2) / (hd // 2))  # (T, hd/2)
    cos, sin = angles.cos(), angles.sin()

    def halves(v):  # (T, hd): pairs (i, i + hd/2)
        a, b = v[:, : hd // 2], v[:, hd // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=1)

    def pairs(v):  # (T, hd): pairs (2i, 2i + 1)
        a, b = v[:, 0::2], v[:, 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=2).reshape(T, hd)

    def scores(wq, wk, rope):
        qs, ks = (x @ wq.t()).view(T, n_heads, hd), (x @ wk.t()).view(T, n_heads, hd)
        return torch.stack([rope(qs[:, h]) @ rope(ks[:, h]).t() for h in range(n_heads)])

    permuted = [lmforge_gguf._interleave_halves(w, n_heads) for w in (q, k)]
    torch.testing.assert_close(scores(*permuted, pairs), scores(q, k, halves))
    assert not torch.allclose(scores(q, k, pairs), scores(q, k, halves), atol=1e-3)


def test_hf_folder_converts_too(tok, tmp_path):
    from lmforge.interop.hf import to_hf

    model = _model("gpt2", tok)
    out = convert_to_gguf(to_hf(model, tmp_path / "hf", tokenizer=tok), tmp_path / "m.gguf")
    assert out.arch == "gpt2" and out.n_tokens == tok.vocab_size


# ------------------------------------------------------------------------------------------------ the CLI
def test_cli_writes_one_file_and_refuses_to_overwrite(tok, tmp_path, capsys):
    save(_model("llama", tok), tmp_path / "m", tokenizer=tok)
    dst = tmp_path / "out.gguf"
    assert main(["convert", "to-gguf", str(tmp_path / "m"), str(dst), "--outtype", "f16"]) == 0
    assert "llama.cpp arch llama" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "out.gguf"]  # no temporary sibling left
    before = dst.read_bytes()
    assert main(["convert", "to-gguf", str(tmp_path / "m"), str(dst)]) == 2
    assert "already exists" in capsys.readouterr().err and dst.read_bytes() == before
    assert main(["convert", "to-gguf", str(tmp_path / "m"), str(dst), "--overwrite"]) == 0
    assert dst.read_bytes() != before


def _refused_folders(tok, root):
    """name -> (model folder, words the one-line error must hold)."""
    other = train_tokenizer([root / "corpus.txt"], kind="bpe", vocab_size=300, show_progress=False)
    cases = {
        "encoder": (build_model("bert-tiny", n_layers=1), tok, "is an encoder"),
        "encoder-decoder": (build_model("bart-tiny", n_layers=1), tok, "is an encoder-decoder"),
        "alibi": (build_model("gpt-tiny", n_layers=1, position="alibi"), tok, "ALiBi"),
        "shaw": (build_model("gpt-tiny", n_layers=1, position="relative"), tok, "Shaw relative positions"),
        "exact gelu": (build_model("gpt-tiny", n_layers=1, activation="gelu"), tok, "activation='gelu'"),
        "layer-scaled": (build_model("gpt-tiny", n_layers=1, attn_scale_by_layer=True), tok, "attn_scale_by_layer"),
        "no family": (build_model("gpt-tiny", n_layers=1, norm="rmsnorm"), tok, "no Hugging Face architecture"),
        "spm tokenizer": (build_model("gpt-tiny", n_layers=1, vocab_size=other.vocab_size), other, "kind 'bpe'"),
        "no tokenizer": (build_model("gpt-tiny", n_layers=1), None, "no tokenizer.json"),
    }
    folders = {}
    for name, (model, tokenizer, words) in cases.items():
        folders[name] = (save(model, root / name.replace(" ", "-"), tokenizer=tokenizer), words)
    quantised = build_model("gpt-tiny", n_layers=1, vocab_size=tok.vocab_size)
    quantize_model(quantised, "int8")
    folders["quantised"] = (save_quantized(quantised, root / "int8", tokenizer=tok), "int8-quantised")
    return folders


def test_refusals_are_one_line_and_write_nothing(tok, corpus, tmp_path, capsys):
    (tmp_path / "corpus.txt").write_text(corpus.read_text(encoding="utf-8")[:50_000], encoding="utf-8")
    folders = _refused_folders(tok, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    for name, (folder, words) in folders.items():
        capsys.readouterr()
        assert main(["convert", "to-gguf", str(folder), str(out / "x.gguf")]) == 2, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err and "Traceback" not in err, (name, err)
        assert list(out.iterdir()) == [], name
    with pytest.raises(GGUFExportError, match="outtype 'q4_0'"):
        to_gguf(_model("gpt2", tok), out / "x.gguf", tokenizer=tok, outtype="q4_0")
    assert list(out.iterdir()) == []
