"""DeBERTa's disentangled attention (``position="deberta"``): the buckets and the logits against their
formulas, HF parity beyond the exact and the bucketed range, the refusals, and a short MLM pre-training run.

Padding invariance and KV-cache equality for this position live with the other positions in
tests/test_model_properties.py; the basic HF cases in tests/test_interop_hf_parity.py.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import transformers as tf  # noqa: E402
from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position  # noqa: E402

import lmforge  # noqa: E402
from lmforge.cli.main import main  # noqa: E402
from lmforge.config import ConfigError, ModelConfig  # noqa: E402
from lmforge.interop.hf import HFConversionError  # noqa: E402
from lmforge.models import build_model  # noqa: E402
from lmforge.nn.attention import Attention, AttentionContext  # noqa: E402
from lmforge.nn.positions.deberta import RelativeEmbeddings, log_bucket_position, relative_index  # noqa: E402
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: E402,F401
from tests.helpers import tiny_config  # noqa: E402

HF_TINY = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=64, relative_attention=True, position_biased_input=False,
               pos_att_type="p2c|c2p", position_buckets=8, max_relative_positions=16, share_att_key=True,
               norm_rel_ebd="layer_norm")


def _bucket(d: int, buckets: int, max_position: int) -> int:
    """The v2 log bucket written out in float64 (He et al.'s code, make_log_bucket_position)."""
    mid = buckets // 2
    if abs(d) <= mid:
        return d
    far = mid + math.ceil(math.log(abs(d) / mid) / math.log((max_position - 1) / mid) * (mid - 1))
    return int(math.copysign(far, d))


@pytest.mark.parametrize("buckets, max_position", [(8, 16), (256, 512), (32, 128), (6, 100), (2, 3)])
def test_log_buckets_equal_the_reference_exactly(buckets, max_position):
    distances = torch.arange(-3 * max_position, 3 * max_position)
    ours = log_bucket_position(distances, buckets, max_position)
    assert torch.equal(ours, make_log_bucket_position(distances, buckets, max_position).long())
    if buckets == 8:  # bucket edges away from rounding ties: the float64 formula agrees too
        assert ours.tolist() == [_bucket(d, buckets, max_position) for d in distances.tolist()]
    mid = buckets // 2
    assert torch.equal(ours[distances.abs() <= mid], distances[distances.abs() <= mid])  # exact near the query
    assert ours[distances == max_position - 1].item() == buckets - 1  # the far edge reaches the last bucket


def test_relative_index_clips_beyond_the_table():
    idx = relative_index(torch.arange(40), torch.arange(40), buckets=0, max_position=6)  # exact distances, k = 6
    assert idx[10, 10].item() == 6 and idx[10, 7].item() == 9 and idx[10, 13].item() == 3  # row = i - j + k
    assert idx[30, 0].item() == 11 and idx[0, 30].item() == 0  # clipped to [0, 2k - 1]


def test_attention_logits_follow_the_papers_three_terms():
    """A_ij = (Qc_i.Kc_j + Qc_i.Kr_d + Kc_j.Qr_d) / sqrt(3 hd), d = bucketed i - j, with W_k,r = W_k, W_q,r = W_q."""
    torch.manual_seed(0)
    cfg = tiny_config(arch="encoder", position="deberta", n_heads=2, position_buckets=8, max_relative_positions=16)
    attn, rel = Attention(cfg).eval(), RelativeEmbeddings(cfg)
    with torch.no_grad():
        rel.norm.weight.normal_(1.0, 0.2)  # a LayerNorm that is not the identity, so dropping it would show
    T, hd, k = 12, cfg.dim_per_head, 8
    x = torch.randn(1, T, cfg.d_model)
    table, index = rel(torch.arange(T), torch.arange(T))
    with torch.no_grad():
        out = attn(x, AttentionContext(rel_index=index, rel_embeddings=table))[0]

        q, key, v = attn.q(x[0]), attn.k(x[0]), attn.v(x[0])  # (T, H*hd)
        pos_q, pos_k = attn.q(table), attn.k(table)  # share_att_key: positions through the layer's own W_q, W_k
        heads = []
        for h in range(cfg.n_heads):
            s = slice(h * hd, (h + 1) * hd)
            logits = torch.empty(T, T)
            for i in range(T):
                for j in range(T):
                    d = min(max(_bucket(i - j, 8, 16) + k, 0), 2 * k - 1)
                    c2c, c2p, p2c = q[i, s] @ key[j, s], q[i, s] @ pos_k[d, s], key[j, s] @ pos_q[d, s]
                    logits[i, j] = (c2c + c2p + p2c) / math.sqrt(3 * hd)
            heads.append(logits.softmax(-1) @ v[:, s])
        expected = attn.o(torch.cat(heads, dim=-1))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("terms, factor", [("c2p|p2c", 3), ("p2c", 2), ("c2p", 2)])
def test_scale_counts_the_position_terms(terms, factor):
    attn = Attention(tiny_config(arch="encoder", position="deberta", pos_att_type=terms))
    assert attn.scale == pytest.approx((attn.head_dim * factor) ** -0.5)


def test_share_att_key_adds_no_parameters_and_own_projections_follow_the_terms():
    def count(**kw) -> int:
        return build_model(tiny_config(arch="encoder", position="deberta", head="none", **kw)).num_parameters()

    shared, both, c2p = count(), count(share_att_key=False), count(share_att_key=False, pos_att_type="c2p")
    per_projection = 32 * 32 + 32
    assert both - shared == 2 * 2 * per_projection  # W_k,r and W_q,r in each of 2 layers
    assert c2p - shared == 2 * per_projection
    model = build_model(tiny_config(arch="encoder", position="deberta", n_layers=3))
    assert model.encoder.relative_positions.weight.shape == (16, 32)  # one (2k, D) table for all layers
    assert not any("relative_positions" in name for name, _ in model.encoder.layers.named_parameters())


def _padded(B: int = 3, T: int = 40, vocab: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (B, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor([T, T - 11, 5])[:, None]).long()
    return ids.masked_fill(mask == 0, 0), mask


@torch.no_grad()
def _perturb(model):
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.1)
    return model.eval()


@pytest.mark.parametrize("overrides", [{}, {"position_buckets": -1, "max_relative_positions": 10,
                                           "share_att_key": False}])
def test_from_hf_beyond_the_bucket_range(overrides):
    """40 tokens: distances past max_relative_positions (log buckets, then clipping), on a padded batch."""
    torch.manual_seed(0)
    hf = _perturb(tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(**(HF_TINY | overrides))))
    model = lmforge.from_hf(hf)
    ids, mask = _padded()
    with torch.no_grad():
        theirs, ours = hf(input_ids=ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits
    assert (theirs - ours)[mask.bool()].abs().max().item() <= 1e-4


def test_lmforge_deberta_to_hf_beyond_the_bucket_range(tmp_path):
    torch.manual_seed(0)
    model = _perturb(build_model("deberta-tiny", vocab_size=64, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                                 max_seq_len=64, position_buckets=8, max_relative_positions=16, pad_token_id=0))
    path = lmforge.to_hf(model, tmp_path / "hf")
    written = json.loads((path / "config.json").read_text())
    assert written["architectures"] == ["DebertaV2ForMaskedLM"] and written["pos_att_type"] == ["p2c", "c2p"]
    hf, info = tf.AutoModelForMaskedLM.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ids, mask = _padded()
    with torch.no_grad():
        theirs, ours = hf.eval()(input_ids=ids, attention_mask=mask).logits, model(ids, attention_mask=mask).logits
    assert (theirs - ours)[mask.bool()].abs().max().item() <= 1e-4


@pytest.mark.parametrize("change, field", [
    ({"position_biased_input": True}, "position_biased_input"),
    ({"relative_attention": False}, "relative_attention"),
    ({"conv_kernel_size": 3}, "conv_kernel_size"),
    ({"embedding_size": 16}, "embedding_size"),
    ({"pos_att_type": "p2c|c2p|p2p"}, "pos_att_type"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings"),
])
def test_from_hf_refuses_what_lmforge_cannot_express(change, field):
    config = {**HF_TINY, **change, "model_type": "deberta-v2", "architectures": ["DebertaV2ForMaskedLM"]}
    with pytest.raises(HFConversionError, match=field):
        lmforge.interop.hf._convert(config, {}, "config.json")


def test_to_hf_names_the_field_deberta_cannot_express(tmp_path):
    model = build_model("deberta-tiny", d_model=32, n_heads=4, d_ff=64, n_layers=1, vocab_size=64, norm_position="pre")
    with pytest.raises(HFConversionError, match=r"deberta-v2 cannot express norm_position='pre'"):
        lmforge.to_hf(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("change, message", [
    ({"pos_att_type": "c2c"}, r"ModelConfig.pos_att_type='c2c'"),
    ({"pos_att_type": "c2p|c2p"}, r"ModelConfig.pos_att_type='c2p\|c2p'"),
    ({"position_buckets": 1}, r"ModelConfig.position_buckets=1"),
    ({"position_buckets": 8, "max_relative_positions": 5}, r"ModelConfig.max_relative_positions=5"),
    ({"max_relative_positions": 0}, r"ModelConfig.max_relative_positions=0"),
])
def test_config_names_the_bad_deberta_field(change, message):
    with pytest.raises(ConfigError, match=message):
        tiny_config(arch="encoder", position="deberta", **change)
    tiny_config(arch="encoder", position="learned", **change)  # only checked where they mean something


def test_mlm_pretraining_with_deberta_positions_lowers_the_loss(data_root, tmp_path):
    data = prepared(data_root, "bert")
    out = tmp_path / "run"
    args = pretrain_args("mlm", data, out, max_steps=40, batch_size=8, lr=1e-2, warmup=4, eval_every=40,
                         save_every=40)
    for key, value in {"position": "deberta", "position_buckets": 8, "max_relative_positions": 32,
                       "type_vocab_size": 0, "dropout": 0.0, "attn_dropout": 0.0}.items():
        args += ["--override", f"{key}={value}"]
    assert main(args) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records]
    assert len(losses) == 40
    # A 20k-parameter model starts at ~log(vocab) and, in 40 steps, learns about as much as learned positions do.
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.2, (first, last)
    model = lmforge.load(out / "model")
    assert model.config.position == "deberta" and model.encoder.relative_positions is not None
    assert records[-1]["eval_loss"] < math.log(model.config.vocab_size) - 0.2
