"""Weight-only int8/int4 inference: kernels against a dequantised reference, quantised folders, precision flags,
and the quality bounds on a tiny GPT trained on Austen."""

from __future__ import annotations

import json
import platform

import pytest
import torch

import lmforge
from lmforge import checkpoint
from lmforge.cli.main import main
from lmforge.errors import UserInputError
from lmforge.models.quantize import (
    QUANT_FILE,
    apply_precision,
    precision,
    quantization_of,
    quantize_model,
    save_quantized,
)
from lmforge.nn import weight_only
from lmforge.nn.weight_only import WeightOnlyEmbedding, WeightOnlyLinear, quantize_int4, quantize_int8, unpack_int4
from lmforge.tasks.quantize import measure, quantize_folder
from lmforge.tokenization import Tokenizer
from test_training_pretrain import data_root, prepared, pretrain_args  # noqa: F401


# ------------------------------------------------------------------------------------------- kernels
def test_int8_rounding_matches_the_formula_by_hand():
    w = torch.tensor([[1.0, -0.5, 0.25], [0.0, 2.0, -2.0]])
    q, s = quantize_int8(w)
    assert torch.equal(s, torch.tensor([1 / 127, 2 / 127]))
    assert q.tolist() == [[127, -64, 32], [0, 127, -127]]  # round(-63.5) = -64 (half to even), 31.75 -> 32


def test_int4_packs_two_nibbles_per_byte_low_first():
    w = torch.zeros(1, 32)
    w[0, 0], w[0, 1], w[0, 2] = 7.0, -7.0, 1.0  # scale 1 -> nibbles 15, 1, 9
    packed, s = quantize_int4(w, 32)
    assert s.tolist() == [[1.0]] and packed.shape == (1, 16)
    assert packed[0, 0].item() == 15 | (1 << 4) and packed[0, 1].item() == 9 | (8 << 4)
    assert unpack_int4(packed)[0, :4].tolist() == [15, 1, 9, 8]


@pytest.fixture
def weight_only_int8(monkeypatch):
    """int8 layers on the exact weight-only kernel (activations not rounded), for the tests that hold every kernel
    to the dequantised reference within fp32 or bf16 rounding."""
    monkeypatch.setattr(weight_only, "INT8_DYNAMIC_ACTIVATIONS", False)


# Tolerances: fp32 activations compute with the dequantised weight exactly (up to sum order, ~1e-5 of the
# output scale); bf16 activations are rounded to 8 bits of mantissa, so ~1e-2 relative. The CPU's int4 kernel
# always computes in bf16 (see lmforge.nn.weight_only), so int4 is held to the bf16 tolerance.
@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("shape", [(64, 128), (24, 96)])  # (out, in): 24 rows pad int4's 16-row blocks
@pytest.mark.usefixtures("weight_only_int8")
def test_matmul_equals_the_dequantised_fp32_reference(mode, dtype, atol, shape):
    atol = max(atol, 3e-2) if mode == "int4" else atol
    torch.manual_seed(0)
    layer = torch.nn.Linear(shape[1], shape[0])
    q = WeightOnlyLinear.from_linear(layer, mode)
    x = torch.randn(2, 3, shape[1])  # (B, T, in)
    ref = torch.nn.functional.linear(x, q.dequantized(), layer.bias)  # fp32 reference
    y = q(x.to(dtype))
    assert y.dtype == dtype and y.shape == (2, 3, shape[0])
    torch.testing.assert_close(y.float(), ref, atol=atol * ref.abs().max().item(), rtol=0)
    # The rounding itself is bounded: half a step of each row (int8) or group (int4) scale.
    step = q.scales.max().item()
    assert (q.dequantized() - layer.weight).abs().max().item() <= step / 2 + 1e-7


@pytest.mark.usefixtures("weight_only_int8")
def test_cpu_kernel_and_dequantise_fallback_agree():
    torch.manual_seed(0)
    for mode in ("int8", "int4"):
        q = WeightOnlyLinear.from_linear(torch.nn.Linear(64, 32), mode)
        x = torch.randn(5, 64)
        assert q._cpu_kernel(x)
        fallback = torch.nn.functional.linear(x, q.dequantized(), q.bias)
        atol = 1e-5 if mode == "int8" else 3e-2 * fallback.abs().max().item()  # int4's kernel computes in bf16
        torch.testing.assert_close(q(x), fallback, atol=atol, rtol=0)


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.usefixtures("weight_only_int8")
def test_quantised_table_looks_up_and_projects_like_its_dequantised_rows(mode, dtype, atol):
    atol = max(atol, 3e-2) if mode == "int4" else atol
    torch.manual_seed(0)
    emb = torch.nn.Embedding(50, 64)  # 50 rows: not a multiple of int4's 16-row blocks
    q = WeightOnlyEmbedding.from_embedding(emb, mode)
    scales = q.scales.clone()
    q.to(dtype).scales.data = scales  # as apply_precision keeps them: fp32
    table = q.dequantized()  # (V, E) fp32
    ids = torch.tensor([[0, 49, 7], [7, 3, 3]])
    rows = q(ids)
    assert rows.dtype == dtype and rows.shape == (2, 3, 64)
    torch.testing.assert_close(rows.float(), table[ids], atol=atol * table.abs().max().item(), rtol=0)
    h = torch.randn(2, 5, 64)
    ref = h @ table.T  # (2, 5, 50)
    logits = q.project(h.to(dtype))
    assert logits.shape == (2, 5, 50)
    torch.testing.assert_close(logits.float(), ref, atol=atol * ref.abs().max().item(), rtol=0)
    assert (table - emb.weight).abs().max().item() <= q.scales.max().item() / 2 + 1e-7


# fbgemm's int8 GEMM rounds the activations to 7 bits per call, one scale and zero point over the input: on
# Gaussian inputs that is ~1.5% of the product's norm. 3% bounds it; a wrong scale or a transposed weight is ~100%.
def _fbgemm_here() -> bool:
    """fbgemm's int8 GEMM is there on every x86 CPU (asserted); elsewhere int8 layers stay weight-only."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    assert weight_only._fbgemm_int8_ready() == x86
    return x86


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dynamic_int8_matmul_is_within_the_activation_rounding_of_the_reference(dtype):
    torch.manual_seed(0)
    layer = torch.nn.Linear(96, 40)
    q = WeightOnlyLinear.from_linear(layer, "int8")
    x = torch.randn(2, 3, 96)
    assert q.dynamic_activations(x.to(dtype)) == _fbgemm_here()
    ref = torch.nn.functional.linear(x, q.dequantized(), layer.bias)
    y = q(x.to(dtype))
    assert y.dtype == dtype and y.shape == (2, 3, 40)
    assert ((y.float() - ref).norm() / ref.norm()).item() < 0.03
    q.qweight.mul_(-1)  # written in place: the packed copy is rebuilt, not reused
    flipped = q(x.to(dtype)).float() - (0 if layer.bias is None else layer.bias)
    assert ((flipped + (ref - layer.bias)).norm() / ref.norm()).item() < 0.03


def test_dynamic_int8_compiles_as_one_opaque_op():
    _fbgemm_here()
    torch.manual_seed(0)
    q = WeightOnlyLinear.from_linear(torch.nn.Linear(64, 24), "int8")
    x = torch.randn(3, 64)
    compiled = torch.compile(q, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), q(x), atol=0, rtol=0)


def test_compiled_int8_decoding_equals_eager_and_is_not_frozen(trained):
    """An fbgemm int8 model's compiled decode step calls the same kernel as its eager layers (so the same tokens),
    and is compiled unfrozen: a graph inductor's FX graph cache can keep for the next process."""
    fbgemm = _fbgemm_here()
    from lmforge.generation.compiled import _STEPS

    model = lmforge.load(trained).eval()
    quantize_model(model, "int8")
    ids = torch.tensor([[5, 17, 42, 7, 99], [3, 8, 13, 21, 34]])
    with torch.no_grad():
        eager = model.generate(ids, max_new_tokens=12, ignore_eos=True).sequences
        compiled = model.generate(ids, max_new_tokens=12, ignore_eos=True, compile=True).sequences
    assert torch.equal(compiled, eager)
    assert [step.freeze for step in _STEPS[model].values()] == [not fbgemm]


def test_compiled_int4_layer_calls_the_packed_kernel_and_equals_eager():
    """Under torch.compile an int4 layer calls tinygemm's int4 matmul on its packed weight (traced with the
    packing, which a frozen step folds into constants) rather than a dequantised full-precision weight."""
    torch.manual_seed(0)
    q = WeightOnlyLinear.from_linear(torch.nn.Linear(64, 40), "int4", group_size=32)  # 40: padded to 48 rows
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(2, 64, dtype=dtype)
        compiled = torch.compile(q, fullgraph=True, backend=backend)
        torch.testing.assert_close(compiled(x), q(x), atol=0, rtol=0)
        torch._dynamo.reset()
    ops = {str(n.target) for gm in graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert any("_weight_int4pack_mm_for_cpu" in op for op in ops), ops


@pytest.mark.parametrize("quantize", [None, "int8", "int4"])
def test_compiled_decoding_in_bf16_at_batch_1_equals_eager(trained, quantize):
    """In bf16 at one row, a compiled step's products run what eager decoding's do, so the same tokens (eager's where
    the two agree to bf16 rounding).
    - bf16: lmforge's bf16 kernel, one opaque op per matmul, so the step is compiled unfrozen.
    - int8: lmforge's int8 kernel (q, k and v in one call among them), whose fp32 outputs the graph takes as fp32.
    - int4: compiled frozen, so its packing is folded once; unfrozen (as a bf16 model's step is, for the bf16
      kernel) it ran the packing at every step: 4x slower than eager."""
    from lmforge.generation.compiled import _STEPS
    from lmforge.nn import gemv

    model = apply_precision(lmforge.load(trained).eval(), "bf16", quantize)
    ids = torch.tensor([[5, 17, 42, 7, 99]])
    with torch.no_grad():
        eager = model.generate(ids, max_new_tokens=12, ignore_eos=True).sequences
        compiled = model.generate(ids, max_new_tokens=12, ignore_eos=True, compile=True).sequences
    assert torch.equal(compiled, eager)
    frozen = {None: not gemv.available(), "int4": True}
    if quantize in frozen:
        assert [step.freeze for step in _STEPS[model].values()] == [frozen[quantize]]


def test_tied_head_of_a_quantised_decoder_uses_the_quantised_table():
    torch.manual_seed(0)
    model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=64, n_heads=2, d_ff=128, vocab_size=200,
                                max_seq_len=32).eval()
    record = quantize_model(model, "int8")
    assert record["embeddings"] == ["embed_tokens"] and "embed_tokens" not in record["layers"]
    x = torch.randint(0, 200, (2, 9))
    with torch.no_grad():
        h = model(x).last_hidden_state  # (B, T, D), what the head multiplies
        torch.testing.assert_close(model(x).logits, model.embed_tokens.project(h), atol=1e-5, rtol=0)


def test_int4_keeps_layers_off_the_group_size_in_full_precision_and_says_so(capsys):
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 48), torch.nn.Linear(48, 8))
    record = quantize_model(model, "int4", group_size=32)
    assert record["layers"] == ["0", "1"] and list(record["kept"]) == ["2"]
    assert type(model[2]) is torch.nn.Linear
    notice = "2: kept in full precision (input width 48 is not a multiple of the group size 32)"
    assert notice in capsys.readouterr().err


# ---------------------------------------------------------------------------------- a trained tiny GPT
@pytest.fixture(scope="module")
def trained(data_root):  # noqa: F811
    """A 1-layer d_model-64 GPT pre-trained for 80 steps on Austen: real structure, so perplexity means something
    (and every linear layer's input width is a multiple of int4's group of 32)."""
    data = prepared(data_root, "gpt")
    out = data_root / "quant-run"
    if not (out / "model").is_dir():
        args = pretrain_args("clm", data, out, max_steps=80, batch_size=8, seq_len=64, eval_every=0, save_every=80,
                             lr=1e-2, warmup=10)
        args += ["--override", "d_model=64", "--override", "d_ff=256", "--override", "n_heads=4"]
        assert main(args) == 0
    return out / "model"


def test_trained_fixture_learned_something(trained):
    model, tok = checkpoint.read_model_folder(trained)
    report = measure(model, model, tok, "none")
    assert report.ppl_fp32 < 0.5 * tok.vocab_size  # far below the uniform guess
    assert report.agreement == 1.0 and report.ppl_change == 0.0


# Bounds. int8 per row: within 1% of fp32 perplexity (the requirement). int4 per group of 32 has 16 levels per
# group, about 18x coarser than int8's 254 per row, and published round-to-nearest int4 results on real LMs cost
# one to a few percent; 2% is the bound chosen for this fixture: it holds with a wide margin here, and still fails
# for a packing bug (swapping the two nibbles of each byte moves this model's perplexity by about 7% and makes
# greedy decoding disagree from the first token).
BOUNDS = {"int8": 0.01, "int4": 0.02}


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantize_cli_reports_quality_within_bounds_and_saves_a_folder(trained, tmp_path, mode, capsys):
    out = tmp_path / mode
    report_file = tmp_path / "report.json"
    assert main(["quantize", "--model", str(trained), "--to", mode, "--out", str(out),
                 "--report", str(report_file)]) == 0
    printed = capsys.readouterr().out
    assert "perplexity" in printed and "greedy" in printed
    report = json.loads(report_file.read_text())
    assert abs(report["ppl_change"]) <= BOUNDS[mode], report
    assert report["agreement"] >= (0.75 if mode == "int8" else 0.4), report
    assert json.loads((out / QUANT_FILE).read_text())["mode"] == mode
    assert QUANT_FILE in json.loads((out / "manifest.json").read_text())["files"]
    # The folder loads without re-quantising and gives the very logits of the model it was saved from.
    reference, _ = checkpoint.read_model_folder(trained)
    quantize_model(reference, mode)
    loaded = lmforge.load(out)
    assert quantization_of(loaded)["mode"] == mode
    x = torch.tensor([[5, 17, 42, 7, 99]])
    with torch.no_grad():
        assert torch.equal(loaded(x).logits, reference.eval()(x).logits)


def test_save_and_load_give_identical_logits(tmp_path):
    torch.manual_seed(0)
    model = lmforge.build_model("gpt-tiny", n_layers=1, d_model=64, n_heads=2, d_ff=128, vocab_size=200,
                                max_seq_len=32).eval()
    for mode in ("int8", "int4"):
        quantized = lmforge.build_model("gpt-tiny", n_layers=1, d_model=64, n_heads=2, d_ff=128, vocab_size=200,
                                        max_seq_len=32)
        quantized.load_state_dict(model.state_dict())
        quantize_model(quantized.eval(), mode)
        path = save_quantized(quantized, tmp_path / mode)
        loaded = lmforge.load(path)
        x = torch.randint(0, 200, (2, 9))
        with torch.no_grad():
            assert torch.equal(loaded(x).logits, quantized(x).logits)
        assert any(type(m) is WeightOnlyLinear for m in loaded.modules())
        assert type(loaded.embed_tokens) is WeightOnlyEmbedding  # the table the tied head multiplies by


def test_precision_block_reaches_load_and_bf16_runs(trained):
    with precision("bf16", "int8"):
        model = lmforge.load(trained)
    assert quantization_of(model)["mode"] == "int8"
    assert model.embed_tokens(torch.tensor([1, 2])).dtype == torch.bfloat16  # the tied table, quantised too
    assert next(p for p in model.parameters() if p.is_floating_point()).dtype == torch.bfloat16
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3]])).logits
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
    assert quantization_of(lmforge.load(trained)) is None  # outside the block: as saved


def test_bf16_without_cpu_support_or_kernel_warns_naming_the_fallback(monkeypatch):
    import warnings

    from lmforge.models import quantize as q
    from lmforge.nn import gemv
    monkeypatch.setattr(q, "native_bf16", lambda device: False)
    monkeypatch.setenv(gemv.ENV, "off")
    gemv.reset()
    try:
        with pytest.warns(UserWarning, match=f"kernel is unavailable \\({gemv.ENV}=off\\).*slower emulated fallback.*--dtype fp32"):
            apply_precision(torch.nn.Sequential(torch.nn.Linear(4, 4)), "bf16")
        monkeypatch.delenv(gemv.ENV)
        gemv.reset()
        if gemv.available():  # the kernel takes bf16 inference's matmuls: no slower fallback to warn of
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                apply_precision(torch.nn.Sequential(torch.nn.Linear(4, 4)), "bf16")
    finally:
        gemv.reset()


def test_generate_cli_takes_dtype_and_quantize(trained, capsys):
    assert main(["generate", "--model", str(trained), "--prompt", "She was", "--max-new-tokens", "5",
                 "--dtype", "bf16", "--quantize", "int4", "--no-stream"]) == 0
    assert capsys.readouterr().out.endswith("\n")
    with pytest.raises(SystemExit):  # argparse refuses other modes
        main(["generate", "--model", str(trained), "--prompt", "x", "--quantize", "int3"])


def test_quantised_folder_is_refused_for_training(trained, data_root, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "q8"
    quantize_folder(trained, "int8", out)
    with pytest.raises(UserInputError, match="for inference only.*--peft qlora"):
        checkpoint.load_body(str(out))
    data = prepared(data_root, "gpt")
    args = pretrain_args("clm", data, tmp_path / "run", max_steps=2)
    args[args.index("--model") + 1] = str(out)
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "int8-quantised model folder is for inference only" in err and not (tmp_path / "run").exists()


def test_quantize_refuses_an_existing_quantised_folder_and_same_out(trained, tmp_path, capsys):
    out = tmp_path / "q"
    quantize_folder(trained, "int8", out)
    assert main(["quantize", "--model", str(out), "--to", "int4", "--out", str(tmp_path / "q2")]) == 2
    assert "already quantised" in capsys.readouterr().err and not (tmp_path / "q2").exists()
    assert main(["quantize", "--model", str(trained), "--to", "int8", "--out", str(trained)]) == 2
    assert "is the --model folder" in capsys.readouterr().err


def test_embed_cli_takes_dtype_and_quantize_and_stays_close(trained, tmp_path):
    import numpy as np
    texts = tmp_path / "texts.txt"
    texts.write_text("She was happy.\nThe weather was fine.\n", encoding="utf-8")
    out = {}
    modes = {"fp32": [], "int8": ["--quantize", "int8"], "bf16-int4": ["--dtype", "bf16", "--quantize", "int4"]}
    for name, flags in modes.items():
        file = tmp_path / f"{name}.npy"
        assert main(["embed", "--model", str(trained), "--input", str(texts), "--output", str(file), "--quiet",
                     *flags]) == 0
        out[name] = np.load(file).astype("float32")
    cos = lambda a, b: float((a * b).sum(-1).min())  # noqa: E731 (rows are unit-normalised)
    assert cos(out["fp32"], out["int8"]) > 0.999 and cos(out["fp32"], out["bf16-int4"]) > 0.95


def test_evaluate_cli_on_a_task_folder_in_bf16_int8(trained, tmp_path, capsys):
    from tests import task_helpers as th
    train = th.write_sentiment(tmp_path / "train.tsv", n=16)
    task = tmp_path / "task"
    assert main(["finetune", "--model", str(trained), "--task", "classify", "--train", str(train), "--out", str(task),
                 "--max-steps", "2", "--batch-size", "4", "--no-progress"]) == 0
    capsys.readouterr()
    for flags in ([], ["--dtype", "bf16", "--quantize", "int8"]):
        assert main(["evaluate", "--model", str(task), "--data", str(train), *flags]) == 0
    assert "accuracy" in capsys.readouterr().out


def test_quantize_a_short_context_model_and_a_failed_report_leaves_no_folder(trained, tmp_path, monkeypatch):
    """A 16-token context is shorter than the greedy check's prompt plus continuation: the check shrinks to fit.
    When the report cannot be made at all, --out is not written."""
    from lmforge import model_folder
    _, tok = checkpoint.read_model_folder(trained)
    torch.manual_seed(0)
    short = lmforge.build_model("gpt-tiny", n_layers=1, d_model=64, n_heads=2, d_ff=128,
                                vocab_size=tok.vocab_size, max_seq_len=16)
    model_folder.save(short, tmp_path / "short", tokenizer=tok)
    assert main(["quantize", "--model", str(tmp_path / "short"), "--to", "int8", "--out", str(tmp_path / "q")]) == 0
    assert json.loads((tmp_path / "q" / QUANT_FILE).read_text())["mode"] == "int8"

    def broken(*args, **kwargs):
        raise UserInputError("the quality report failed")
    monkeypatch.setattr("lmforge.tasks.quantize.measure", broken)
    with pytest.raises(UserInputError):
        quantize_folder(tmp_path / "short", "int8", tmp_path / "q2")
    assert not (tmp_path / "q2").exists()
