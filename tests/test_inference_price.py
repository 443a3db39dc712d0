"""The price tag of inference (lmforge.cost.inference): the FLOP count by hand and against PyTorch's
FlopCounterMode, every model-running command's stderr line and --price-tag file, ``lmforge cost`` reading it,
and serve's ``usage.price`` and /metrics counters."""

from __future__ import annotations

import json

import pytest
import torch

import lmforge
import serve_helpers as sh
from lmforge.cli.main import main
from lmforge.cost.inference import InferenceTag, forward_flops, generation_flops, stack_flops
from lmforge.nn.kv_cache import KVCache
from lmforge.tokenization import Tokenizer
from lmforge.training.price_tag import PriceSettings, counted_flops
from tests import task_helpers as th

L, D, H, F, V = 2, 64, 4, 256, 100


def _gpt(**overrides):
    torch.manual_seed(0)
    return lmforge.build_model("gpt-tiny", n_layers=L, d_model=D, n_heads=H, d_ff=F, vocab_size=V, max_seq_len=64,
                               **overrides).eval()


def _hand_n(m) -> int:
    """The weights a token multiplies by, counted from the module tree: every layer's and the final norm's
    parameters, plus the tied vocabulary projection (the token and position tables are lookups)."""
    return sum(p.numel() for name, p in m.named_parameters()
               if not name.endswith(("embed_tokens.weight", "positions.weight"))) + V * D


def test_forward_flops_by_hand_full_pass_and_cached_step():
    m = _gpt()
    n = _hand_n(m)
    T = 16
    assert forward_flops(m, 3, T) == 3 * T * (2 * n + L * 4 * D * T)  # each query charged all T keys
    assert forward_flops(m, 3, T) == 3 * m.train_flops(T) // 3  # a third of training's count
    # a cached step: one token's weights, the 21 keys in the cache
    assert forward_flops(m, 1, 1, keys=21) == 2 * n + L * 4 * D * 21
    # the vocabulary projection of the last position only
    assert forward_flops(m, 1, T, head_rows=1) == forward_flops(m, 1, T) - (T - 1) * 2 * V * D
    # a generation: the prompt, then a step per new token but the last
    assert generation_flops(m, 5, 3) == forward_flops(m, 1, 5, head_rows=1) + sum(
        2 * n + L * 4 * D * k for k in (6, 7))


def test_an_encoder_decoder_pays_its_encoder_once_and_its_decoder_per_token():
    torch.manual_seed(0)
    m = lmforge.build_model("t5-tiny", n_layers=1, n_decoder_layers=1, d_model=32, n_heads=2, head_dim=16, d_ff=64,
                            vocab_size=V).eval()
    S, T = 12, 5
    assert forward_flops(m, 1, T, source_len=S) == m.train_flops(S, T) // 3  # a whole pass: a third of training
    step = forward_flops(m, 1, 1, keys=T + 1, source_len=S, encoder=False)
    assert forward_flops(m, 1, T + 1, source_len=S) - forward_flops(m, 1, T, source_len=S) == step + (
        1 * 4 * 32 * T)  # one more target token also adds a key to each of the T earlier queries
    src, tgt = torch.randint(0, V, (2, S)), torch.randint(0, V, (2, T))
    with InferenceTag(measure_energy=False).watch(m) as tag, torch.no_grad():
        m(src, decoder_input_ids=tgt)
    assert tag.flops == 2 * m.train_flops(S, T) // 3


def test_a_sliding_window_caps_the_keys():
    m = _gpt(sliding_window=8)
    n = _hand_n(m)
    assert forward_flops(m, 1, 1, keys=30) == 2 * n + L * 4 * D * 8


def _counter():
    """FlopCounterMode (training's, with SDPA's CPU kernel) that also counts lmforge's fp32 GEMV kernel, which
    a decoding step's few rows run on (lmforge.nn.gemv): 2 FLOPs per weight and row."""
    from torch.utils import flop_counter as fc

    from lmforge.nn import gemv as gemv_kernel

    mode = counted_flops()
    try:
        if not gemv_kernel.available():  # loads it (as the first decoding step would)
            return mode
        gemv = torch.ops.lmforge.f32_gemv
    except (AttributeError, RuntimeError):  # the kernel is not built here: decoding uses addmm
        return mode

    def gemv_flops(x, weight, bias=None, *args, out_shape=None, **kwargs) -> int:
        return 2 * weight[0] * weight[1] * (torch.Size(x).numel() // x[-1])

    mode.flop_registry[gemv] = mode.flop_registry[gemv.default] = fc.shape_wrapper(gemv_flops)
    return mode


def test_analytic_matches_flop_counter_on_a_real_forward_and_a_cached_step():
    m = _gpt()
    ids = torch.randint(0, V, (2, 32))
    with torch.no_grad(), _counter() as counter:
        m(ids)
    # FlopCounterMode counts the matmuls and SDPA only (no norms, biases, GELU): the analytic count is a few
    # percent above it at this width
    assert 1.0 <= forward_flops(m, 2, 32) / counter.get_total_flops() < 1.05
    cache = KVCache()
    with torch.no_grad():
        m(ids, past_key_values=cache, use_cache=True)
        with _counter() as counter:
            m(ids[:, :1], past_key_values=cache, use_cache=True)
    assert 1.0 <= forward_flops(m, 2, 1, keys=33) / counter.get_total_flops() < 1.05


def test_the_tag_counts_forwards_a_cache_and_a_stack_alone():
    m = _gpt()
    ids = torch.randint(0, V, (2, 8))
    tag = InferenceTag(PriceSettings.resolve("cpu"), command="t", measure_energy=False).watch(m)
    with tag, torch.no_grad():
        cache = KVCache()
        m(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        m(ids[:, :1], past_key_values=cache, use_cache=True, logits_to_keep=1)
        m.decoder(m.embed_tokens(ids))  # a stack outside its model's forward (as Transformer.encode runs it)
    expected = (forward_flops(m, 2, 8, head_rows=1) + forward_flops(m, 2, 1, keys=9, head_rows=1)
                + stack_flops(m.decoder, 2, 8))
    assert (tag.flops, tag.tokens, tag.forwards) == (expected, 16 + 2 + 16, 3)
    s = tag.summary()
    assert s["kind"] == "inference" and s["total_flops"] == expected and s["device_s"] > 0
    assert s["cost_usd"] == pytest.approx(tag.price.device_s / 3600 * 0.05, rel=1e-4)  # device_s is rounded
    # the hooks are gone once the tag is closed, and no global forward hook was ever used
    assert not m._forward_hooks and not m._forward_pre_hooks and not m.decoder._forward_hooks
    assert not torch.nn.modules.module._global_forward_hooks


def test_a_model_built_while_the_tag_is_open_is_counted():
    with InferenceTag(measure_energy=False) as tag, torch.no_grad():
        m = _gpt()
        m(torch.zeros(1, 4, dtype=torch.long))
    assert tag.flops == forward_flops(m, 1, 4) and tag.forwards == 1


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("price")
    gpt = sh.gpt_folder(root / "gpt")
    enc = sh.encoder_folder(root / "enc")
    (root / "task").mkdir()
    tok = th.tokenizer(root / "task", "bert")
    train = th.write_sentiment(root / "train.tsv", 8)
    from lmforge.tasks.finetune import finetune
    from lmforge.tasks.spec import TaskSpec

    finetune(th.body("bert", tok), TaskSpec(task="classify"), train, config=th.train_config(steps=1),
             out=root / "run", tokenizer=tok)
    return {"root": root, "gpt": gpt, "enc": enc, "task": root / "run" / "model", "train": train}


def _line(err: str, command: str) -> str:
    lines = [x for x in err.splitlines() if x.startswith(f"lmforge {command}: price tag: ")]
    assert len(lines) == 1, err
    return lines[0]


def test_generate_prints_its_line_and_writes_a_tag_cost_reads(folders, tmp_path, capsys):
    tag_file = tmp_path / "gen.json"
    assert main(["generate", "--model", str(folders["gpt"]), "--prompt", "the cat", "--max-new-tokens", "6",
                 "--ignore-eos", "--price-tag", str(tag_file)]) == 0
    line = _line(capsys.readouterr().err, "generate")
    assert "FLOPs" in line and "g CO2e" in line and "$" in line
    tag = json.loads(tag_file.read_text())
    model = lmforge.load(folders["gpt"])
    prompt = len(Tokenizer.load(folders["gpt"]).encode("the cat"))
    assert tag["total_flops"] == generation_flops(model, prompt, 6) and tag["command"] == "generate"
    # cost reads the file, and sums a folder of them
    assert main(["cost", str(tag_file), "--json"]) == 0
    read = json.loads(capsys.readouterr().out)
    assert read["total_flops"] == tag["total_flops"] and read["cost_usd"] == pytest.approx(tag["cost_usd"], rel=1e-4)
    for name in ("a", "b"):
        (tmp_path / "sum" / name).mkdir(parents=True)
        (tmp_path / "sum" / name / "price_tag.json").write_text(tag_file.read_text())
    assert main(["cost", str(tmp_path / "sum"), "--json", "--region", "fr"]) == 0
    total = json.loads(capsys.readouterr().out)
    assert total["runs"] == 2 and total["total_flops"] == 2 * tag["total_flops"]
    assert total["co2e_kg"] == pytest.approx(2 * tag["energy_kwh"] * 55 / 1000, rel=1e-4)


def test_every_model_command_prints_its_line(folders, tmp_path, capsys, monkeypatch):
    texts = tmp_path / "in.txt"
    texts.write_text("hello world\nthe cat sat\n")
    runs = {
        "embed": ["embed", "--model", str(folders["enc"]), "--input", str(texts), "--output",
                  str(tmp_path / "v.npy"), "--quiet"],
        "predict": ["predict", "--model", str(folders["task"]), "--data", str(folders["train"]), "--output",
                    str(tmp_path / "p.jsonl")],
        "evaluate": ["evaluate", "--model", str(folders["task"]), "--data", str(folders["train"])],
        "prompt classify": ["prompt", "classify", "--model", str(folders["gpt"]), "--template", "{x} It was {z}.",
                            "--verbalizer", '{"negative": ["bad"], "positive": ["good"]}', "--data",
                            str(folders["train"])],
        "prompt generate": ["prompt", "generate", "--model", str(folders["gpt"]), "--task", "arithmetic", "--shots",
                            "1", "--limit", "1", "--max-new-tokens", "2"],
    }
    for command, argv in runs.items():
        assert main([*argv, "--price-tag", str(tmp_path / "t.json")]) == 0, command
        line = _line(capsys.readouterr().err, command)
        tag = json.loads((tmp_path / "t.json").read_text())
        assert tag["total_flops"] > 0 and tag["command"] == command, (command, line)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("hi\n"))
    assert main(["chat", "--model", str(folders["gpt"]), "--max-new-tokens", "3", "--seed", "0"]) == 0
    _line(capsys.readouterr().err, "chat")
    # --no-price-tag: no line
    assert main([*runs["embed"], "--no-price-tag"]) == 0
    assert "price tag" not in capsys.readouterr().err


def test_a_bad_region_is_one_line_and_nothing_runs(folders, tmp_path, capsys):
    assert main(["generate", "--model", str(folders["gpt"]), "--prompt", "x", "--region", "mars",
                 "--price-tag", str(tmp_path / "t.json")]) == 2
    assert "--region 'mars'" in capsys.readouterr().err and not (tmp_path / "t.json").exists()
    assert main(["serve", "--model", f"gpt={folders['gpt']}", "--grid-intensity", "-1"]) == 2
    assert "--grid-intensity -1" in capsys.readouterr().err


def test_serve_usage_price_parses_with_openai_and_feeds_metrics(folders):
    pytest.importorskip("fastapi")
    pytest.importorskip("prometheus_client")
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app
    from lmforge.serve.limits import Limits
    from lmforge.serve.served import load_served

    limits = Limits(max_batch=2, max_queue=4)
    served = {"gpt": load_served("gpt", folders["gpt"], limits)}
    try:
        client = TestClient(create_app(served, limits, price={"grid_intensity": 500.0, "power_watts": 100.0}))
        body = {"model": "gpt", "prompt": "the cat", "max_tokens": 4, "temperature": 0, "ignore_eos": True}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200
        usage = r.json()["usage"]
        price = usage["price"]
        m = served["gpt"].model
        assert price["flops"] == generation_flops(m, usage["prompt_tokens"], usage["completion_tokens"])
        assert price["energy_j"] == pytest.approx(price["device_s"] * 100, rel=1e-3, abs=1e-6)
        assert price["co2e_g"] == pytest.approx(price["energy_j"] / 3.6e6 * 500, rel=1e-3, abs=1e-9)
        assert price["cost_usd"] == pytest.approx(price["device_s"] / 3600 * 0.05, rel=1e-3, abs=1e-12)
        openai = pytest.importorskip("openai")
        parsed = openai.types.Completion.model_validate(r.json())  # the official client's model still parses
        assert parsed.usage.completion_tokens == 4 and parsed.usage.model_extra["price"]["flops"] == price["flops"]
        streamed = client.post("/v1/completions", json={**body, "stream": True})
        assert streamed.status_code == 200
        metrics = client.get("/metrics").text
        values = {line.split("{")[0]: float(line.split()[-1]) for line in metrics.splitlines()
                  if line.startswith("lmforge_") and 'model="gpt"' in line}
        assert values["lmforge_inference_flops_total"] == 2 * price["flops"]
        for name in ("lmforge_device_seconds_total", "lmforge_energy_joules_total", "lmforge_co2e_grams_total",
                     "lmforge_cost_dollars_total"):
            assert values[name] > 0, name
    finally:
        served["gpt"].close()
