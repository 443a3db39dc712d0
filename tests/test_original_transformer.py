"""The original Transformer for translation (Vaswani et al. 2017): base/big presets, label smoothing, the
"Noam" learning-rate schedule and checkpoint averaging."""

from __future__ import annotations

import math
from pathlib import Path

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


def test_scaled_token_embeddings_start_at_unit_size():
    """Vaswani et al. scale the token table by sqrt(d) and initialise it N(0, 1/d) (as fairseq does): scaled
    token vectors start at unit size, like the sinusoids added to them; unscaled tables keep GPT-2's 0.02."""
    torch.manual_seed(0)
    scaled = Transformer(ModelConfig.from_preset("transformer-base").replace(d_model=256, n_heads=4, d_ff=512))
    assert scaled.embed_tokens.weight.std().item() == pytest.approx(256 ** -0.5, rel=0.02)
    assert (scaled.embed_tokens.weight * 16).pow(2).mean().sqrt().item() == pytest.approx(1.0, rel=0.02)
    plain = Transformer(tiny_config(position="sinusoidal"))
    assert plain.embed_tokens.weight.std().item() == pytest.approx(plain.config.initializer_range, rel=0.1)


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


def test_model_loss_is_smoothed_on_seq2seq_labels_in_training_only():
    model = Transformer(tiny_config(arch="encoder-decoder", n_decoder_layers=1))  # dropout 0: train = eval maths
    src, labels = torch.randint(1, 97, (2, 6)), torch.randint(1, 97, (2, 5))
    labels[1, 3:] = -100
    decoder_input_ids = torch.randint(1, 97, (2, 5))
    logits = model(src, decoder_input_ids=decoder_input_ids).logits  # (B, T, V)
    model.label_smoothing = 0.1
    out = model.train()(src, decoder_input_ids=decoder_input_ids, labels=labels)
    keep = labels != -100
    torch.testing.assert_close(out.loss, F.cross_entropy(logits[keep], labels[keep], label_smoothing=0.1))
    # evaluation scores the plain cross-entropy: what eval_loss and eval_ppl mean with or without smoothing
    plain = model.eval()(src, decoder_input_ids=decoder_input_ids, labels=labels)
    torch.testing.assert_close(plain.loss, F.cross_entropy(logits[keep], labels[keep]))
    assert abs(float(plain.loss.detach()) - float(out.loss.detach())) > 1e-4
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


def test_finetuning_smooths_the_token_loss_of_generative_tasks_only(tmp_path):
    """--label-smoothing reaches a seq2seq fine-tune's loss (it was once accepted and ignored); a task with a
    head of its own refuses it before anything is loaded or written."""
    from lmforge.config import ConfigError
    from lmforge.tasks.finetune import finetune
    from lmforge.tasks.spec import TaskSpec

    rows = [{"en": f"word {i}", "es": f"palabra {i}", "label": str(i % 2)} for i in range(8)]
    seen = []

    def spy(task_model):
        seen.append(task_model.body.label_smoothing)
        return task_model

    config = TrainConfig(max_steps=1, batch_size=4, label_smoothing=0.1, eval_every=0, save_every=0, progress=False,
                         tensorboard=False, precision="fp32")
    from lmforge.tasks.data import Table

    table = Table(str(tmp_path / "pairs.jsonl"), rows, ["en", "es", "label"], list(range(1, 9)))
    tok = Path(__file__).parent / "fixtures" / "gpt2"
    seq2seq = TaskSpec(task="seq2seq", text_column="en", target_column="es", max_length=16, max_target_length=16)
    model = Transformer(tiny_config(arch="encoder-decoder", n_decoder_layers=1, vocab_size=50257))
    finetune(model, seq2seq, table, config=config, out=tmp_path / "s2s", tokenizer=tok, wrap=spy)
    assert seen == [0.1]
    classify = TaskSpec(task="classify", text_column="en", label_column="label")
    with pytest.raises(ConfigError, match="label_smoothing 0.1: smooths the token loss of the generative tasks"):
        finetune(model, classify, table, config=config, out=tmp_path / "cls", tokenizer=tok)
    assert not (tmp_path / "cls").exists()


def test_averaging_a_finished_finetuning_run_gives_a_folder_like_its_final_model(tmp_path):
    """A fine-tuning run's checkpoints hold the weights only; its RUN/model also has the tokenizer and
    task.json, which the average carries, so that it evaluates as a task folder like RUN/model does."""
    from lmforge.model_folder import save
    from lmforge.tokenization import Tokenizer

    _run_with_checkpoints(tmp_path / "run")
    tok = Tokenizer.load(Path(__file__).parent / "fixtures" / "gpt2")
    task = '{"task": "seq2seq", "text_column": "en"}\n'
    save(Transformer(tiny_config(arch="encoder-decoder", n_decoder_layers=1)), tmp_path / "run" / "model",
         tokenizer=tok, extra_files={"task.json": task})
    out = average_checkpoints(tmp_path / "run", last=2, dst=tmp_path / "avg")
    assert (out / "task.json").read_text(encoding="utf-8") == task
    assert Tokenizer.load(out).sha256() == tok.sha256()
    model_checkpoint.load(out)  # the manifest covers the carried files: it verifies


@pytest.mark.filterwarnings("ignore:train_data has no state_dict")  # a plain list: resume is not under test
def test_evaluation_reports_the_plain_cross_entropy_under_label_smoothing(tmp_path):
    from lmforge.objectives import CausalLM
    from lmforge.training import Trainer

    torch.manual_seed(0)
    model = Transformer(tiny_config(arch="decoder", head="lm"))
    model.label_smoothing = 0.1
    data = [[[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]]]
    cfg = TrainConfig(max_steps=1, eval_every=0, save_every=0, progress=False, tensorboard=False, precision="fp32")
    trainer = Trainer(model, CausalLM(pad_token_id=0), data, cfg, out=tmp_path / "run", eval_data=data)
    record = trainer.evaluate()
    batch = CausalLM(pad_token_id=0)(data[0])
    with torch.no_grad():
        logits = model.eval()(batch["input_ids"]).logits  # (B, T, V)
    keep = batch["labels"] != -100
    plain = F.cross_entropy(logits[keep], batch["labels"][keep])
    assert record["eval_loss"] == pytest.approx(float(plain), rel=1e-5)
    assert record["eval_ppl"] == pytest.approx(math.exp(float(plain)), rel=1e-5)
    smoothed = F.cross_entropy(logits[keep], batch["labels"][keep], label_smoothing=0.1)
    assert abs(record["eval_loss"] - float(smoothed)) > 1e-3  # near-uniform logits: close, but apart


def _wrapped_run(root, steps=(1, 2, 3)):
    """A permuted-LM run: the Trainer checkpoints the two-stream wrapper, whose tensors are ``model.*`` plus
    its own ``query_init``."""
    from lmforge.models.two_stream import TwoStreamLM

    torch.manual_seed(0)
    wrapper = TwoStreamLM(Transformer(tiny_config(arch="encoder", head="mlm", position="learned")))
    manager = CheckpointManager(root / "checkpoints", keep=5)
    states = []
    for step in steps:
        with torch.no_grad():
            for p in wrapper.parameters():
                p.add_(torch.randn_like(p))
        manager.save(step, wrapper, torch.optim.AdamW(wrapper.parameters()), {})
        states.append({k: v.clone() for k, v in wrapper.model.state_dict().items()})
    return states


def test_checkpoint_average_and_consolidate_unwrap_a_wrapped_run(tmp_path, capsys):
    from safetensors import safe_open

    from lmforge.training.dist_checkpoint import consolidate

    states = _wrapped_run(tmp_path / "run")
    weights = tmp_path / "run" / "checkpoints" / "step-00000003" / "model" / "model.safetensors"
    with safe_open(str(weights), framework="pt") as f:
        assert "model.embed_tokens.weight" in f.keys() and "query_init" in f.keys()  # the layout under test
    averaged = model_checkpoint.load(average_checkpoints(tmp_path / "run", last=2, dst=tmp_path / "avg"))
    for name, tensor in averaged.state_dict().items():
        torch.testing.assert_close(tensor, (states[1][name] + states[2][name]) / 2, rtol=0, atol=1e-6)
    newest = model_checkpoint.load(consolidate(tmp_path / "run", tmp_path / "newest"))
    for name, tensor in newest.state_dict().items():
        torch.testing.assert_close(tensor, states[2][name], rtol=0, atol=0)
    assert main(["checkpoint", "consolidate", str(tmp_path / "run"), str(tmp_path / "cli")]) == 0
    assert main(["checkpoint", "average", str(tmp_path / "run"), "--last", "3"]) == 0
    mean = sum(s["embed_tokens.weight"] for s in states) / 3
    loaded = model_checkpoint.load(tmp_path / "run" / "model-avg3")
    torch.testing.assert_close(loaded.embed_tokens.weight.detach(), mean, rtol=0, atol=1e-6)


def test_a_wrapped_sharded_checkpoint_consolidates(tmp_path):
    """The sharded (DCP) layout keys a wrapper's tensors ``model.model.*``: consolidation finds them too."""
    import json

    from lmforge.models.two_stream import TwoStreamLM
    from lmforge.training import dist_checkpoint as dc
    from lmforge.training.state import MODEL_DIR, write_manifest

    torch.manual_seed(0)
    wrapper = TwoStreamLM(Transformer(tiny_config(arch="encoder", head="mlm", position="learned")))
    folder = tmp_path / "checkpoints" / "step-00000001"
    with pytest.warns(UserWarning, match="single process"):
        dc._write_shards(folder / "dcp", wrapper, torch.optim.AdamW(wrapper.parameters()))
    (folder / MODEL_DIR).mkdir()
    (folder / MODEL_DIR / "config.json").write_text(json.dumps(wrapper.config.to_dict()))
    (folder / "trainer_state.json").write_text("{}")
    write_manifest(folder, 1, layout=dc.LAYOUT)
    model = dc.checkpoint_model(folder)
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, wrapper.model.state_dict()[name], rtol=0, atol=0)


def test_an_electra_run_averages_and_consolidates_to_its_discriminator(tmp_path):
    """ELECTRA's checkpoints hold the generator + discriminator pair (config under ``electra``, tensors under
    ``discriminator.`` and ``generator.``, the token embedding shared): the model folder is the discriminator,
    as the run's own RUN/model is."""
    from lmforge.models.electra import ElectraPretrainer
    from lmforge.training.dist_checkpoint import consolidate

    torch.manual_seed(0)
    pair = ElectraPretrainer.from_config(tiny_config(arch="encoder", head="mlm"))
    manager = CheckpointManager(tmp_path / "run" / "checkpoints", keep=5)
    states = []
    for step in (1, 2):
        with torch.no_grad():
            for p in pair.parameters():
                p.add_(torch.randn_like(p))
        manager.save(step, pair, torch.optim.AdamW(pair.parameters()), {})
        states.append({k: v.clone() for k, v in pair.discriminator.state_dict().items()})
    newest = model_checkpoint.load(consolidate(tmp_path / "run", tmp_path / "newest"))
    assert newest.config.head == "rtd"
    for name, tensor in newest.state_dict().items():
        torch.testing.assert_close(tensor, states[1][name], rtol=0, atol=0)
    averaged = model_checkpoint.load(average_checkpoints(tmp_path / "run", last=2, dst=tmp_path / "avg"))
    for name, tensor in averaged.state_dict().items():
        torch.testing.assert_close(tensor, (states[0][name] + states[1][name]) / 2, rtol=0, atol=1e-6)
