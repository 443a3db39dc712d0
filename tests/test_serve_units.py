"""The pieces under ``lmforge serve``: the slot decoder (rows join and leave; tokens equal ``generate``), the
per-job text and stop strings, the scheduler's failure isolation, the app's 413/500 answers in process,
``lmforge chat`` through a pipe, and the quickstart's serve command."""

from __future__ import annotations

import io
import random
import shutil
import sys

import pytest
import torch

import lmforge
import serve_helpers as sh
from lmforge.cli.main import main
from lmforge.generation import generate
from lmforge.generation.compiled import cached_steps
from lmforge.generation.slots import SlotBatch
from lmforge.prompting.instruct import ChatTemplate
from lmforge.quickstart.serving import serve_command
from lmforge.serve.batching.job import Job, visible_text
from lmforge.serve.batching.scheduler import Scheduler
from lmforge.tokenization import Tokenizer


def _model(**overrides):
    torch.manual_seed(0)
    cfg = dict(n_layers=2, d_model=32, n_heads=2, d_ff=64, vocab_size=300, max_seq_len=128, dropout=0.0)
    return lmforge.build_model("gpt-tiny", **{**cfg, **overrides}).eval()


def _decode_all(batch: SlotBatch, prompts, news) -> list[list[int]]:
    """Every prompt's greedy tokens through ``batch``: sequences join as rows free up and leave when done."""
    out, last, waiting = {}, {}, list(range(len(prompts)))
    with torch.inference_mode():
        while waiting or batch.keys:
            while waiting and batch.free:
                k = waiting.pop(0)
                last[k] = int(batch.join(k, prompts[k]).argmax())
                out[k] = [last[k]]
                if len(out[k]) == news[k]:
                    batch.leave(k)
            if batch.keys:
                logits = batch.step(torch.tensor([last[k] for k in batch.keys]))
                for k, row in zip(list(batch.keys), logits):
                    last[k] = int(row.argmax())
                    out[k].append(last[k])
                    if len(out[k]) == news[k]:
                        batch.leave(k)
    return [out[i] for i in range(len(prompts))]


def _jobs(model, seed: int, n: int, max_len: int):
    """Random prompts, their lengths to generate, and each one's greedy tokens generated alone."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(300) for _ in range(rng.randint(1, 30))] for _ in range(n)]
    news = [rng.randint(1, max_len - len(p) - 1) for p in prompts]
    solo = [generate(model, [p], max_new_tokens=k, ignore_eos=True).tolist()[0] for p, k in zip(prompts, news)]
    return prompts, news, solo


@pytest.mark.parametrize("rows, max_len", [(4, 64), (3, 48)])
def test_rows_joining_and_leaving_decode_the_tokens_of_each_sequence_alone(rows, max_len):
    """Interleaved joins/leaves, prompts longer than the write column (a shift) and a full buffer (a
    compaction) never change a sequence's greedy tokens."""
    model = _model()
    prompts, news, solo = _jobs(model, rows, 30, max_len)
    batch = SlotBatch(model, rows=rows, max_len=max_len)
    compactions, real_compact = [0], batch._compact

    def counted():
        compactions[0] += 1
        real_compact()

    batch._compact = counted
    assert _decode_all(batch, prompts, news) == solo
    assert compactions[0] > 0  # the buffers filled up at least once


def _sharp_model():
    model = _model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)  # sharp logits: fp32 rounding must not decide an argmax
    return model


@pytest.mark.slow  # two compiles (row buckets 1 and 4)
def test_compiled_rows_decode_the_tokens_of_each_sequence_alone():
    """Through the compiled step of each row bucket (compiled by warm_up, before any sequence joins), with
    shifts and compactions, the tokens are those of each sequence decoded alone."""
    model = _sharp_model()
    prompts, news, solo = _jobs(model, 7, 12, 48)
    batch = SlotBatch(model, rows=4, max_len=48, compile=True)
    with torch.inference_mode():
        assert batch.warm_up() and not batch.keys and batch.cur == 0
    assert sorted(key[0] for key in cached_steps(model)) == batch.buckets == [1, 4]
    assert _decode_all(batch, prompts, news) == solo
    assert batch.compiled  # no step fell back to eager


def test_a_failing_compile_falls_back_to_eager_steps_with_a_warning(monkeypatch):
    def broken(*args, **kwargs):
        def step(*a):
            raise RuntimeError("no C++ compiler")
        return step

    monkeypatch.setattr("lmforge.generation.slots.compiled_step", broken)
    model = _model()
    prompts, news, solo = _jobs(model, 3, 6, 48)
    with pytest.warns(UserWarning, match="decoding eagerly"):
        engine = Scheduler(model, max_batch=2, max_queue=8, max_len=48, compile=True).start()
    try:
        assert not engine.compile and not engine.rows.compiled
        events = [[] for _ in prompts]
        for p, k, got in zip(prompts, news, events):
            engine.submit(Job(p, k, decode=_decode, emit=got.append))
        assert engine.wait_idle(60)
    finally:
        engine.stop()
    assert [[e.id for e in got[:-1]] for got in events] == solo


def test_slot_batch_refuses_what_does_not_fit():
    batch = SlotBatch(_model(), rows=1, max_len=8)
    with pytest.raises(ValueError, match="max_len=8"):
        batch.join("a", list(range(8)))
    batch.join("a", [1, 2])
    with pytest.raises(RuntimeError, match="no free row"):
        batch.join("b", [1])
    with pytest.raises(lmforge.errors.UserInputError, match="decoder"):
        SlotBatch(lmforge.build_model("bert-tiny", n_layers=1), rows=1, max_len=8)


def test_visible_text_hides_stop_strings_and_their_possible_starts():
    assert visible_text("a b STOP c", ["STOP"]) == ("a b ", True)
    assert visible_text("a b ST", ["STOP"]) == ("a b ", False)
    assert visible_text("a b S", ["STOP", "XY"]) == ("a b ", False)
    assert visible_text("a b", ["STOP"]) == ("a b", False)
    assert visible_text("caf\ufffd", []) == ("caf", False)


def _decode(ids):
    return "".join(chr(97 + i % 26) for i in ids)


def test_streamed_pieces_join_to_the_text_before_the_stop_string():
    got = []
    job = Job([1], 50, decode=_decode, emit=got.append, stops=["de"])
    pieces, reason = [], None
    for token in [0, 1, 2, 3, 4, 5]:  # a b c d e f: "de" completes at e
        t, reason = job.choose(torch.nn.functional.one_hot(torch.tensor(token), 30).float() * 10)
        pieces.append(t.text)
        if reason:
            break
    assert "".join(pieces) == "abc" and reason == "stop" and job.generated == 5


def test_a_failing_job_fails_alone_and_the_scheduler_keeps_serving():
    model = _model()
    engine = Scheduler(model, max_batch=4, max_queue=8, max_len=64).start()
    try:
        events = {name: [] for name in ("ok", "bad", "after")}

        def bad_decode(ids):
            if len(ids) == 3:
                raise RuntimeError("boom")
            return _decode(ids)

        jobs = {"ok": Job([5, 6, 7], 10, decode=_decode, emit=events["ok"].append),
                "bad": Job([8, 9], 10, decode=bad_decode, emit=events["bad"].append)}
        for job in jobs.values():
            engine.submit(job)
        assert engine.wait_idle(60)
        engine.submit(Job([5, 6, 7], 10, decode=_decode, emit=events["after"].append))
        assert engine.wait_idle(60)
    finally:
        engine.stop()
    assert events["bad"][-1][0] == "error" and jobs["bad"].error_id
    assert events["ok"][-1] == ("done", "length") and len(events["ok"]) == 11
    assert [e.id for e in events["after"][:-1]] == [e.id for e in events["ok"][:-1]]  # same greedy tokens


@pytest.fixture(scope="module")
def gpt(tmp_path_factory):
    return sh.gpt_folder(tmp_path_factory.mktemp("units"))


def test_app_answers_413_for_a_big_body_and_500_with_an_error_id_then_keeps_serving(gpt, capsys):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app
    from lmforge.serve.limits import Limits
    from lmforge.serve.served import load_served

    limits = Limits(max_batch=2, max_queue=4, max_body=2000)
    served = {"gpt": load_served("gpt", gpt, limits)}
    try:
        client = TestClient(create_app(served, limits))
        r = client.post("/v1/completions", json={"model": "gpt", "prompt": "x" * 5000})
        assert r.status_code == 413 and r.json()["error"]["message"].startswith("request body over 2000 bytes")
        decode = served["gpt"].tokenizer.decode
        served["gpt"].tokenizer.decode = lambda ids, **kw: 1 / 0  # a bug while making the text
        r = client.post("/v1/completions", json={"model": "gpt", "prompt": "the cat", "max_tokens": 3})
        served["gpt"].tokenizer.decode = decode
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        eid = r.json()["error"]["code"]
        assert eid and eid in capsys.readouterr().out  # the log ties the id to the traceback
        r = client.post("/v1/completions", json={"model": "gpt", "prompt": "the cat", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        r = client.post("/v1/chat/completions", json={"model": "gpt", "messages": [{"role": "user", "content": "hi"}],
                                                      "max_tokens": 2})
        assert r.status_code == 200
        assert "lmforge playground" in client.get("/").text and client.get("/playground.js").status_code == 200
    finally:
        served["gpt"].close()


def test_chat_without_a_template_uses_the_default_with_a_notice(gpt, tmp_path, capsys, monkeypatch):
    # was a refusal; a base decoder now chats through the plain default template (tests/test_serve_chat_default.py)
    plain = tmp_path / "plain"
    shutil.copytree(gpt, plain)
    (plain / "chat_template.json").unlink()
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    assert main(["chat", "--model", str(plain), "--max-new-tokens", "2"]) == 0
    assert "not instruction-tuned" in capsys.readouterr().err


def test_chat_through_a_pipe_streams_answers_with_history_reset_and_system(gpt, capsys, monkeypatch):
    lines = ["hello", "/system be brief", "where is the cat", "and the dog", "/reset", "hello"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))  # not a TTY: no prompts
    assert main(["chat", "--model", str(gpt), "--temperature", "0", "--max-new-tokens", "4"]) == 0
    out = capsys.readouterr()
    model, tok, template = lmforge.load(gpt), Tokenizer.load(gpt), ChatTemplate.load(gpt)

    def answer(messages):
        ids = template.encode(tok, messages, add_generation_prompt=True)[0]
        text = tok.decode(generate(model, [ids], max_new_tokens=4).tolist()[0])
        return visible_text(text, ["<|user|>\n"])[0] if "<|user|>\n" in text else text

    a1 = answer([{"role": "user", "content": "hello"}])
    sys_msg = {"role": "system", "content": "be brief"}
    a2 = answer([sys_msg, {"role": "user", "content": "where is the cat"}])
    a3 = answer([sys_msg, {"role": "user", "content": "where is the cat"}, {"role": "assistant", "content": a2},
                 {"role": "user", "content": "and the dog"}])
    a4 = answer([sys_msg, {"role": "user", "content": "hello"}])  # /reset keeps the system message
    assert out.out == "".join(a + "\n" for a in (a1, a2, a3, a4))
    assert "conversation reset" in out.err


def test_quickstart_prints_a_serve_command_for_its_servable_models(gpt, tmp_path):
    shutil.copytree(gpt, tmp_path / "runs" / "pretrain-gpt" / "model")
    (tmp_path / "runs" / "translation" / "model").mkdir(parents=True)  # no config: not servable
    assert serve_command(tmp_path) == f"lmforge serve --model pretrain-gpt={tmp_path / 'runs/pretrain-gpt/model'}"


def test_app_times_out_long_requests_and_returns_every_choice(gpt):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app
    from lmforge.serve.limits import Limits
    from lmforge.serve.served import load_served

    limits = Limits(max_batch=4, max_queue=8, timeout=0.05)
    served = {"gpt": load_served("gpt", gpt, limits)}
    try:
        client = TestClient(create_app(served, limits))
        r = client.post("/v1/completions", json={"model": "gpt", "prompt": "the cat", "max_tokens": 200,
                                                 "ignore_eos": True})
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
        limits.timeout = 60
        body = {"model": "gpt", "prompt": ["the cat", "a dog"], "max_tokens": 3, "n": 2, "temperature": 1.0,
                "seed": 7, "logprobs": 1}
        r = client.post("/v1/completions", json=body)
        assert r.status_code == 200
        choices = r.json()["choices"]
        assert [c["index"] for c in choices] == [0, 1, 2, 3]
        assert all(len(c["logprobs"]["tokens"]) == len(c["logprobs"]["top_logprobs"]) for c in choices)
        again = client.post("/v1/completions", json=body).json()["choices"]
        assert [c["text"] for c in again] == [c["text"] for c in choices]  # seeded sampling repeats
    finally:
        served["gpt"].close()


def test_an_index_folder_is_served_for_search(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lmforge.embeddings.encoder import SentenceEncoder
    from lmforge.embeddings.index import build_index
    from lmforge.serve.app import create_app
    from lmforge.serve.limits import Limits
    from lmforge.serve.served import load_served

    encoder_dir = sh.encoder_folder(tmp_path / "enc")
    docs = ["the cat sat on the mat", "john lives in paris", "a red house by the river"]
    index = build_index(SentenceEncoder.load(encoder_dir), docs, meta={"model": str(encoder_dir)})
    index.save(tmp_path / "idx")
    limits = Limits()
    served = {"idx": load_served("idx", tmp_path / "idx", limits)}
    client = TestClient(create_app(served, limits))
    assert [m["kind"] for m in client.get("/v1/models").json()["data"]] == ["search"]
    hits = client.post("/v1/search", json={"model": "idx", "query": "john lives in paris", "k": 2}).json()["data"]
    assert hits[0]["text"] == "john lives in paris" and hits[0]["score"] == pytest.approx(1.0, abs=1e-4)
    assert [h["rank"] for h in hits] == [1, 2]
    r = client.post("/v1/completions", json={"model": "idx", "prompt": "x"})
    assert r.status_code == 400 and "/v1/search" in r.json()["error"]["message"]


def test_a_task_folder_is_served_for_classification_as_predict_gives(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from lmforge.serve.app import create_app
    from lmforge.serve.limits import Limits
    from lmforge.serve.served import load_served
    from lmforge.tasks import inference
    from lmforge.tasks.finetune import finetune
    from lmforge.tasks.spec import TaskSpec
    from tests import task_helpers as th

    tok = th.tokenizer(tmp_path, "bert")
    train = th.write_sentiment(tmp_path / "train.tsv", 16)
    finetune(th.body("bert", tok), TaskSpec(task="classify"), train, config=th.train_config(steps=2),
             out=tmp_path / "run", tokenizer=tok)
    folder = tmp_path / "run" / "model"
    texts = [t for t, _ in th.sentiment_rows(3, seed=5)]
    expected = inference.predict(folder, inference.Table("request", [{"text": t} for t in texts], ["text"]))
    limits = Limits()
    served = {"sst": load_served("sst", folder, limits)}
    client = TestClient(create_app(served, limits))
    r = client.post("/v1/classify", json={"model": "sst", "input": texts})
    assert r.status_code == 200, r.text
    got = r.json()["data"]
    assert [g["label"] for g in got] == [e["prediction"] for e in expected]
    assert [g["probabilities"] for g in got] == [e["prediction_probabilities"] for e in expected]


def test_prompts_of_one_length_prefill_together_as_they_would_alone():
    model = _model()
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12], [13, 14]]
    batch = SlotBatch(model, rows=4, max_len=32)
    with torch.inference_mode():
        batch.join("x", [1, 2, 3, 4, 5, 6])  # a row already there: the new ones go beside it
        together = batch.join_many([("a", prompts[0]), ("b", prompts[1])])  # (2, V)
        with pytest.raises(ValueError, match="one length"):
            batch.join_many([("c", prompts[0]), ("d", prompts[2])])
        alone = [model(torch.tensor([p])).logits[0, -1] for p in prompts[:2]]
    torch.testing.assert_close(together, torch.stack(alone), atol=1e-5, rtol=1e-5)
    assert batch.keys == ["x", "a", "b"] and batch.lengths == [6, 4, 4]
    greedy = [generate(model, [p], max_new_tokens=6, ignore_eos=True).tolist()[0] for p in prompts]
    engine = Scheduler(model, max_batch=4, max_queue=8, max_len=32)
    groups, join_many = [], engine.rows.join_many
    engine.rows.join_many = lambda items: groups.append(len(items)) or join_many(items)
    engine.start()
    try:
        events = [[] for _ in prompts]
        with engine.cond:  # all three wait together: the two of length 4 join in one forward
            for p, got in zip(prompts, events):
                engine.submit(Job(p, 6, decode=_decode, emit=got.append))
        assert engine.wait_idle(60)
    finally:
        engine.stop()
    assert [[e.id for e in got[:-1]] for got in events] == greedy and groups == [2, 1]


def test_serve_compile_reaches_the_scheduler_and_falls_back_when_compiling_fails(gpt, monkeypatch, capsys):
    from lmforge.serve.limits import Limits
    from lmforge.serve.served import load_served

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "--compile" in capsys.readouterr().out

    def broken(*args, **kwargs):
        def step(*a):
            raise RuntimeError("no C++ compiler")
        return step

    monkeypatch.setattr("lmforge.generation.slots.compiled_step", broken)
    with pytest.warns(UserWarning, match="decoding eagerly"):
        served = load_served("gpt", gpt, Limits(max_batch=2), compile=True)
    try:
        assert served.scheduler.rows.buckets == [1, 2] and not served.scheduler.compile
    finally:
        served.close()
