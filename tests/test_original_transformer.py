"""The original Transformer for translation (Vaswani et al. 2017): base/big presets, label smoothing, the
"Noam" learning-rate schedule and checkpoint averaging."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import tiny_config
from lmforge import checkpoint as model_checkpoint
from lmforge.cli.main import main
from lmforge.config import ModelConfig
from lmforge.errors import UserInputError
from lmforge.models.transformer import Transformer
from lmforge.nn.loss import cross_entropy
from lmforge.training import TrainConfig
from lmforge.training.checkpoint_average import average_checkpoints
from lmforge.training.schedules import Schedule, noam_lr
from lmforge.training.state import CheckpointManager

VOCAB = 37_000  # the paper's shared source-target BPE vocabulary (WMT 2014 EN-DE), §5.1


def _hand_count(d: int, d_ff: int, layers: int = 6, vocab: int = VOCAB) -> int:
    """One shared embedding = pre-softmax matrix (V d); per layer attention 4 (d^2 + d), FFN 2 d d_ff + d_ff + d,
    LayerNorms 2 d each (two per encoder layer, three per decoder layer), the decoder's cross-attention;
    sinusoidal positions have no parameters."""
    attn, ffn, norm = 4 * (d * d + d), 2 * d * d_ff + d_ff + d, 2 * d
    return vocab * d + layers * (attn + ffn + 2 * norm) + layers * (2 * attn + ffn + 3 * norm)


@pytest.mark.parametrize("name, d, d_ff, paper", [("transformer-base", 512, 2048, 65e6),
                                                   ("transformer-big", 1024, 4096, 213e6)])
def test_presets_have_the_papers_shapes_and_size(name, d, d_ff, paper):
    cfg = ModelConfig.from_preset(name)
    assert (cfg.d_model, cfg.d_ff, cfg.n_layers, cfg.decoder_layers, cfg.vocab_size) == (d, d_ff, 6, 6, VOCAB)
    assert cfg.n_heads == d // 64 and cfg.position == "sinusoidal" and cfg.norm_position == "post"
    with torch.device("meta"):
        n = Transformer(cfg).num_parameters()
    assert n == _hand_count(d, d_ff)
    # Table 3 rounds (and its counting conventions are not stated): 63.1M vs 65M, 214.2M vs 213M.
    assert abs(n - paper) / paper < 0.04, f"{name}: {n:,} parameters"


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("eps", [0.1, 0.3])
def test_label_smoothing_equals_torch(fused, eps):
    torch.manual_seed(0)
    z = torch.randn(40, 29, requires_grad=True)
    y = torch.randint(0, 29, (40,))
    ours = cross_entropy(z, y, fused=fused, label_smoothing=eps)
    ours.backward()
    grad, z.grad = z.grad.clone(), None
    ref = F.cross_entropy(z, y, label_smoothing=eps)
    ref.backward()
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(grad, z.grad)
    with torch.no_grad():
        torch.testing.assert_close(cross_entropy(z, y, label_smoothing=eps), ref)
    # Per-row weights multiply each row's smoothed loss.
    w = torch.rand(40)
    ref_rows = F.cross_entropy(z, y, label_smoothing=eps, reduction="none")
    torch.testing.assert_close(cross_entropy(z, y, weight=w, fused=fused, label_smoothing=eps), (w * ref_rows).sum())


def test_label_smoothing_chunks_and_bf16():
    torch.manual_seed(1)
    z = torch.randn(300, 1000)  # more rows than one chunk holds
    y = torch.randint(0, 1000, (300,))
    torch.testing.assert_close(cross_entropy(z.requires_grad_(), y, label_smoothing=0.1),
                               F.cross_entropy(z, y, label_smoothing=0.1))
    zb = z.detach().bfloat16()
    torch.testing.assert_close(cross_entropy(zb, y, label_smoothing=0.1),
                               F.cross_entropy(zb.float(), y, label_smoothing=0.1), atol=1e-3, rtol=1e-3)
    with pytest.raises(ValueError, match="label_smoothing=1.5"):
        cross_entropy(z, y, label_smoothing=1.5)


def test_model_loss_is_smoothed_on_seq2seq_labels():
    model = Transformer(tiny_config(arch="encoder-decoder", n_decoder_layers=1)).eval()
    src, labels = torch.randint(1, 97, (2, 6)), torch.randint(1, 97, (2, 5))
    labels[1, 3:] = -100
    decoder_input_ids = torch.randint(1, 97, (2, 5))
    logits = model(src, decoder_input_ids=decoder_input_ids).logits  # (B, T, V)
    model.label_smoothing = 0.1
    out = model(src, decoder_input_ids=decoder_input_ids, labels=labels)
    keep = labels != -100
    torch.testing.assert_close(out.loss, F.cross_entropy(logits[keep], labels[keep], label_smoothing=0.1))
    with pytest.raises(Exception, match="label_smoothing"):
        TrainConfig.from_dict({"label_smoothing": 1.0})


def test_inverse_sqrt_is_the_noam_schedule():
    d, W, T = 512, 4000, 100_000
    sched = Schedule("inverse-sqrt", max_steps=T, warmup=W)
    peak = noam_lr(d, W)
    for s in (1, 10, 3999, 4000, 4001, 20_000, 100_000):
        paper = d**-0.5 * min(s**-0.5, s * W**-1.5)
        assert math.isclose(peak * sched(s), paper, rel_tol=1e-12), s


def _run_with_checkpoints(root, steps=(1, 2, 3)):
    torch.manual_seed(0)
    model = Transformer(tiny_config(arch="encoder-decoder", n_decoder_layers=1))
    manager = CheckpointManager(root / "checkpoints", keep=5)
    states = []
    for step in steps:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        manager.save(step, model, torch.optim.AdamW(model.parameters()), {})
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    return states


def test_checkpoint_average_is_the_mean_of_the_tensors(tmp_path):
    states = _run_with_checkpoints(tmp_path / "run")
    out = average_checkpoints(tmp_path / "run", last=2, dst=tmp_path / "avg")
    averaged = model_checkpoint.load(out)
    for name, tensor in averaged.state_dict().items():
        torch.testing.assert_close(tensor, (states[1][name] + states[2][name]) / 2, rtol=0, atol=1e-6)
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())  # no temporary left beside it


def test_checkpoint_average_cli(tmp_path, capsys):
    states = _run_with_checkpoints(tmp_path / "run")
    assert main(["checkpoint", "average", str(tmp_path / "run"), "--last", "3"]) == 0
    loaded = model_checkpoint.load(tmp_path / "run" / "model-avg3")
    mean = sum(s["embed_tokens.weight"] for s in states) / 3
    torch.testing.assert_close(loaded.embed_tokens.weight.detach(), mean, rtol=0, atol=1e-6)
    assert main(["checkpoint", "average", str(tmp_path / "run"), "--last", "4"]) != 0
    err = capsys.readouterr().err
    assert "--last 4 asks for more checkpoints than the 3 it holds" in err
    with pytest.raises(UserInputError, match="no such run folder"):
        average_checkpoints(tmp_path / "nothing", 1, tmp_path / "x")
