"""lm-evaluation-harness on an lmforge folder (``lmforge evaluate --harness``, lmforge.evaluation.harness_lm).

The model class is checked against hand computations on a full forward pass, and its rolling loglikelihood
against ``lmforge evaluate``'s own next-token loss; then the CLI end to end and its one-line refusals.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is the [harness] extra (pip install 'lmforge[harness]')")

import serve_helpers as sh  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402

from lmforge.checkpoint import read_model_folder  # noqa: E402
from lmforge.cli.main import main  # noqa: E402
from lmforge.errors import UserInputError  # noqa: E402
from lmforge.evaluation import harness  # noqa: E402
from lmforge.evaluation.harness_lm import LmforgeLM  # noqa: E402
from lmforge.evaluation.length_extrapolation import position_losses  # noqa: E402
from lmforge.generation import generate  # noqa: E402

TEXT = ("the cat sat on the mat and the dog ran to a big red house by the river where john lives in paris "
        "and mary lives in london playing a small game")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    # 512 positions: the shipped tasks' verses run to a few hundred tokens of this 300-token vocabulary.
    return sh.gpt_folder(tmp_path_factory.mktemp("harness"), max_seq_len=512)


@pytest.fixture(scope="module")
def loaded(folder):
    return read_model_folder(folder)


def _request(kind: str, *args) -> Instance:
    return Instance(kind, {}, args, 0)


def _forward_logp(model, ids: list[int]) -> torch.Tensor:
    """(len(ids) - 1,) log p(ids[t + 1] | ids[:t + 1]) from one unpadded forward pass."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]  # (T, V)
    return F.log_softmax(logits.float(), -1)[:-1].gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_loglikelihood_is_the_sum_of_the_continuations_token_logprobs(loaded):
    model, tok = loaded
    lm = LmforgeLM(model=model, tokenizer=tok, batch_size=3, max_length=40)
    pairs = [("the cat sat", " on the mat"), ("a", " big red house by the river"), ("john lives in", " paris"),
             ("mary", " lives in london playing a small game and the dog ran"), ("", " the dog"),
             (TEXT, " by the river")]  # the last is longer than max_length: its context is cut from the left
    got = lm.loglikelihood([_request("loglikelihood", c, x) for c, x in pairs])
    for (context, continuation), (logp, _) in zip(pairs, got):
        if context:
            ctx = tok.encode(context, add_special_tokens=False)
            whole = tok.encode(context + continuation, add_special_tokens=False)
        else:  # an empty context is the prefix token (GPT: EOS)
            ctx = [tok.special_token_ids()["eos_token_id"]]
            whole = ctx + tok.encode(continuation, add_special_tokens=False)
        n = len(whole) - len(ctx)
        whole = whole[-41:]  # max_length + 1 tokens: the inputs and the last target
        want = float(_forward_logp(model, whole)[-n:].sum())
        assert logp == pytest.approx(want, rel=1e-5, abs=1e-5)


def test_is_greedy_marks_the_argmax_continuation(loaded):
    model, tok = loaded
    lm = LmforgeLM(model=model, tokenizer=tok)
    ctx = tok.encode("the cat sat on", add_special_tokens=False)
    with torch.no_grad():
        best = int(model(torch.tensor([ctx])).logits[0, -1].argmax())
    other = (best + 1) % tok.vocab_size
    (_, greedy), (_, not_greedy) = lm.score([(ctx, [best]), (ctx, [other])])
    assert greedy and not not_greedy


def test_rolling_loglikelihood_is_evaluates_loss_times_tokens(folder, loaded, tmp_path, capsys):
    """One window: ``lmforge evaluate --seq-len m`` on "<EOS> text" scores exactly the m tokens that
    loglikelihood_rolling predicts from the prefix token (EOS), so loss x m = -log p(text)."""
    model, tok = loaded
    eos = tok.special_token("eos")
    data = tmp_path / "text.txt"
    data.write_text(eos + TEXT + "\n", encoding="utf-8")
    ids = tok.encode(TEXT, add_special_tokens=False)
    assert tok.encode(eos + TEXT, add_special_tokens=False) == [tok.boundary_id] + ids
    assert main(["evaluate", "--model", str(folder), "--data", str(data), "--seq-len", str(len(ids))]) == 0
    loss = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["loss"]
    (rolling,) = LmforgeLM(model=model, tokenizer=tok).loglikelihood_rolling([_request("loglikelihood_rolling",
                                                                                         TEXT)])
    assert -rolling == pytest.approx(loss * len(ids), rel=1e-5)


def test_rolling_windows_score_every_token_once_with_evaluates_loss(loaded):
    """Several windows (max_length 16 on ~40 tokens): the total is evaluate's per-position next-token loss
    summed over each window's scored (last) positions, and the windows predict every token exactly once."""
    model, tok = loaded
    lm = LmforgeLM(model=model, tokenizer=tok, batch_size=2, max_length=16)
    ids = tok.encode(TEXT, add_special_tokens=False)
    windows = lm.rolling_windows(ids)
    assert len(windows) >= 3 and [t for _, cont in windows for t in cont] == ids
    want = 0.0
    for context, continuation in windows:
        block = (context + continuation)[-17:]  # 16 inputs + the last target
        nll, _ = position_losses(model, block, seq_len=len(block) - 1)
        want += float(nll[-len(continuation):].sum())
    (rolling,) = lm.loglikelihood_rolling([_request("loglikelihood_rolling", TEXT)])
    assert -rolling == pytest.approx(want, rel=1e-5)


def test_generate_until_is_greedy_generation_cut_at_the_stop_string(loaded):
    model, tok = loaded
    lm = LmforgeLM(model=model, tokenizer=tok, batch_size=2)
    prompts = ["the cat sat on", "mary lives in", "a big"]
    got = lm.generate_until([_request("generate_until", p, {"until": ["the"], "max_gen_toks": 12})
                             for p in prompts])
    out = generate(model, [tok.encode(p, add_special_tokens=False) for p in prompts], max_new_tokens=12)
    assert got == [tok.decode(ids).split("the")[0] for ids in out.tolist()]


def test_registered_with_lm_eval_beside_its_own_models(folder):
    from lm_eval.api.registry import get_model

    from lmforge.evaluation.harness_lm import register

    assert register() is get_model("lmforge") is LmforgeLM
    assert get_model("hf").__name__ == "HFLM"  # registering first must not hide lm_eval's lazily listed models
    lm = get_model("lmforge").create_from_arg_string(f"pretrained={folder},max_length=32", {"batch_size": 2})
    assert (lm.max_length, lm.batch_size) == (32, 2)


def test_cli_end_to_end_with_limit(folder, loaded, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["evaluate", "--model", str(folder), "--harness", "lmforge_next_verse,lmforge_austen_ppl",
                 "--limit", "3", "--batch-size", "4"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    (written,) = tmp_path.glob("harness_*.json")  # the default --output
    results = json.loads(written.read_text(encoding="utf-8"))
    assert lines[-2] == f"lm_eval results: {written.name}"
    assert lines[0].startswith("lmforge_next_verse (0-shot, 3 docs): acc ")
    assert json.loads(lines[-1]) == harness.metrics(results)
    assert results["n-samples"]["lmforge_austen_ppl"]["effective"] == 3
    # acc by hand: the choice with the highest log-likelihood after "context ", by full forward passes
    model, tok = loaded
    rows = [json.loads(line) for line in (harness.TASK_FOLDER / "next_verse_test.jsonl").open()][:3]
    right = 0
    for row in rows:
        ctx = tok.encode(row["context"], add_special_tokens=False)
        scores = []
        for choice in row["choices"]:
            whole = tok.encode(row["context"] + " " + choice, add_special_tokens=False)
            scores.append(float(_forward_logp(model, whole)[len(ctx) - 1:].sum()))
        right += int(max(range(4), key=scores.__getitem__) == row["label"])
    assert results["results"]["lmforge_next_verse"]["acc,none"] == pytest.approx(right / 3)
    # word perplexity as lm_eval defines it: exp(-sum log p / words), from the model class's rolling scores
    texts = [json.loads(line)["text"] for line in (harness.TASK_FOLDER / "austen_passages.jsonl").open()][:3]
    lls = LmforgeLM(model=model, tokenizer=tok).loglikelihood_rolling(
        [_request("loglikelihood_rolling", t) for t in texts])
    words = sum(len(re.split(r"\s+", t)) for t in texts)
    assert results["results"]["lmforge_austen_ppl"]["word_perplexity,none"] == pytest.approx(
        float(torch.tensor(-sum(lls) / words, dtype=torch.float64).exp()), rel=1e-6)


def test_unknown_task_names_list_close_matches(folder):
    with pytest.raises(UserInputError, match=r"unknown task 'lmforge_next_vers'.*did you mean lmforge_next_verse"):
        harness.evaluate(folder, ["lmforge_next_vers"], lm_eval_tasks=False)
    with pytest.raises(UserInputError, match=r"unknown task 'zzqx'"):
        harness.evaluate(folder, ["zzqx"], lm_eval_tasks=False)
    manager = harness.task_manager(["lmforge_*"], lm_eval_tasks=False)  # a glob names the tasks it matches
    assert harness.expand(manager, ["lmforge_*", "lmforge_next_verse"]) == ["lmforge_austen_ppl", "lmforge_next_verse"]


def test_a_task_whose_data_is_missing_names_the_file(folder, tmp_path, capsys):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "mine.yaml").write_text(
        "task: my_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: gone.jsonl\n"
        "output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n",
        encoding="utf-8")
    assert main(["evaluate", "--model", str(folder), "--harness", "my_ppl", "--include-path", str(tasks)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"data file {tasks / 'gone.jsonl'} not found" in err
    # a Hub data set that is not in the cache: offline, so nothing is fetched, and the line names it
    (tasks / "hub.yaml").write_text(
        "task: hub_ppl\ndataset_path: lmforge-test/no-such-set\noutput_type: loglikelihood_rolling\n"
        "test_split: test\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n", encoding="utf-8")
    assert main(["evaluate", "--model", str(folder), "--harness", "hub_ppl", "--include-path", str(tasks)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "lmforge-test/no-such-set" in err and "not on disk" in err


def test_a_users_task_reads_data_beside_its_yaml(folder, tmp_path, capsys):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "mine.jsonl").write_text(json.dumps({"text": TEXT}) + "\n", encoding="utf-8")
    (tasks / "mine.yaml").write_text(
        "task: my_ppl\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: mine.jsonl\n"
        "output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\n"
        "metric_list:\n  - metric: byte_perplexity\n", encoding="utf-8")
    out = tmp_path / "r.json"
    assert main(["evaluate", "--model", str(folder), "--harness", "my_ppl", "--include-path", str(tasks),
                 "--output", str(out)]) == 0
    assert json.loads(out.read_text())["results"]["my_ppl"]["byte_perplexity,none"] > 1
