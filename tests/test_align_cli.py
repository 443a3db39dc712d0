"""``lmforge align`` and ``make-pairs`` from the command line: exact resume after SIGKILL (DPO, and PPO with its
rollout generator and mid-rollout position), the reward task, make-pairs, and one-line refusals that write
nothing."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from align_helpers import policy, write_jsonl  # noqa: F401
from lmforge import checkpoint
from lmforge.align.data import read_pairs
from lmforge.cli.main import main
from task_helpers import body, tokenizer, write_sentiment
from test_training_resume import _latest, _spawn, _wait_for, assert_same_weights, curve, weights

N = 6
TESTS = Path(__file__).resolve().parent
COMMON = ["--precision", "fp32", "--no-progress", "--no-tensorboard", "--lr", "1e-3", "--seed", "3"]


def dpo_args(folder, pairs, out, steps=3 * N) -> list[str]:
    return ["align", "--method", "dpo", "--policy", str(folder), "--train", str(pairs), "--out", str(out),
            "--max-steps", str(steps), "--save-every", str(N), "--batch-size", "4", "--grad-accum", "2", *COMMON]


def ppo_args(folder, prompts, out) -> list[str]:
    # 4 sequences a rollout, minibatches of 2, 2 PPO epochs: a rollout lasts 4 steps, so step 6 is mid-rollout
    return ["align", "--method", "ppo", "--policy", str(folder), "--prompts", str(prompts), "--reward",
            "align_helpers:vowel_share", "--n-prompts", "4", "--ppo-epochs", "2", "--max-new-tokens", "5",
            "--kl-target", "2", "--out", str(out), "--max-steps", str(3 * N), "--save-every", str(N),
            "--batch-size", "2", *COMMON]


def _kill_after_checkpoint(args: list[str], out: Path) -> None:
    proc = _spawn(args)
    _wait_for(lambda: _latest(out) == f"step-{N:08d}", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _latest(out) == f"step-{N:08d}" and not (out / "model").exists()


@pytest.fixture
def importable_helpers(monkeypatch):
    """The subprocess imports the tests' reward function (align_helpers:vowel_share) too."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.parametrize("method", ["dpo", "ppo"])
def test_align_resumes_exactly_after_sigkill(method, policy, tmp_path, importable_helpers):  # noqa: F811
    folder, _, pairs, prompts = policy
    args = (lambda out: dpo_args(folder, pairs, out)) if method == "dpo" else (lambda out: ppo_args(folder, prompts,
                                                                                                    out))
    assert main(args(tmp_path / "ref")) == 0
    out = tmp_path / "killed"
    _kill_after_checkpoint(args(out), out)
    assert main(["align", "--out", str(out), "--resume", "--no-progress"]) == 0
    keys = ("step", "loss", "grad_norm", "margin", "accuracy") if method == "dpo" else \
        ("step", "loss", "grad_norm", "reward_mean", "kl_ref", "kl_coef", "clip_fraction", "value_loss", "entropy")
    assert curve(out, keys) == curve(tmp_path / "ref", keys) and len(curve(out)) == 3 * N
    assert_same_weights(weights(out / "model"), weights(tmp_path / "ref" / "model"))


def test_reward_task_make_pairs_and_dpo_on_them(policy, tmp_path):  # noqa: F811
    folder, _, pairs, prompts = policy
    rm = tmp_path / "rm"
    assert main(["finetune", "--task", "reward", "--model", str(folder), "--train", str(pairs), "--eval", str(pairs),
                 "--out", str(rm), "--max-steps", "20", "--eval-every", "10", "--batch-size", "8", "--lr", "3e-3",
                 "--precision", "fp32", "--no-progress", "--no-tensorboard"]) == 0
    task = json.loads((rm / "best" / "task.json").read_text())
    assert task["spec"]["task"] == "reward" and task["best"]["metric"] == "pairwise_accuracy"
    assert task["best"]["value"] > 0.9
    assert main(["evaluate", "--model", str(rm / "best"), "--data", str(pairs)]) == 0  # lmforge evaluate scores it
    out = tmp_path / "made.jsonl"
    assert main(["align", "make-pairs", "--policy", str(folder), "--prompts", str(prompts), "--reward",
                 str(rm / "best"), "--k", "4", "--max-new-tokens", "4", "--out", str(out)]) == 0
    made = read_pairs(out)
    assert made and all(json.loads(line)["chosen_score"] > json.loads(line)["rejected_score"]
                        for line in out.read_text().splitlines())
    assert main(dpo_args(folder, out, tmp_path / "dpo", steps=2)) == 0
    assert (tmp_path / "dpo" / "model" / "config.json").is_file()


def test_a_classifier_serves_as_the_reward(tmp_path):
    from lmforge.align.scorers import ModelReward
    from lmforge.tasks import TaskSpec
    from lmforge.tasks.finetune import finetune
    from task_helpers import train_config

    tok = tokenizer(tmp_path, "gpt")
    train = write_sentiment(tmp_path / "train.tsv", 48)
    finetune(body("gpt", tok), TaskSpec(task="classify"), str(train), str(train), config=train_config(20),
             out=tmp_path / "clf", tokenizer=tok)
    prob = ModelReward(tmp_path / "clf" / "model", "prob", "1")
    logp = ModelReward(tmp_path / "clf" / "model", "logprob", "1")
    margin = ModelReward(tmp_path / "clf" / "model", "margin", "0")
    p, lp, m = (f(["the film was"] * 2, [" great", " awful"]) for f in (prob, logp, margin))
    assert p[0] > p[1] and all(0 < x < 1 for x in p)
    assert lp == pytest.approx([__import__("math").log(x) for x in p], abs=1e-5)
    # two classes: label 0's margin is logit0 - logit1 = log(p0 / p1)
    assert m == pytest.approx([__import__("math").log((1 - x) / x) for x in p], abs=1e-4)


# ---------------------------------------------------------------------------------- refusals
def _refused(args, capsys, *words):
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    line = [x for x in err if "error:" in x]
    assert len(line) == 1, err
    for w in words:
        assert w in line[0], line[0]
    return line[0]


def test_bad_pairs_are_refused_in_one_line_and_nothing_is_written(policy, tmp_path, capsys):  # noqa: F811
    folder, _, _, _ = policy
    good = {"prompt": "the film", "chosen": " good", "rejected": " bad"}
    missing = write_jsonl(tmp_path / "missing.jsonl", [good, {"prompt": "a", "chosen": " good"}])
    _refused(dpo_args(folder, missing, tmp_path / "o1"), capsys, "missing.jsonl", "row 2", "'rejected'", "missing")
    same = write_jsonl(tmp_path / "same.jsonl", [good, good, {"prompt": "a", "chosen": " ok", "rejected": " ok"}])
    _refused(dpo_args(folder, same, tmp_path / "o2"), capsys, "same.jsonl", "row 3", "same text")
    long = write_jsonl(tmp_path / "long.jsonl", [good, {"prompt": "the film " * 80, "chosen": " a", "rejected": " b"}])
    _refused(dpo_args(folder, long, tmp_path / "o3"), capsys, "long.jsonl", "row 2", "context")
    for k in (1, 2, 3):
        assert not (tmp_path / f"o{k}").exists()


def test_bad_policies_rewards_and_prompts_are_refused(policy, tmp_path, capsys):  # noqa: F811
    folder, tok, pairs, prompts = policy
    encoder_folder = tmp_path / "bert"
    bert_tok = tokenizer(tmp_path, "bert")
    checkpoint.save(body("bert", bert_tok), encoder_folder, tokenizer=bert_tok)
    _refused(dpo_args(encoder_folder, pairs, tmp_path / "o1"), capsys, str(encoder_folder), "not a decoder")
    other = tmp_path / "other"
    checkpoint.save(body("gpt", bert_tok), other, tokenizer=bert_tok)  # a decoder over another vocabulary
    _refused(dpo_args(folder, pairs, tmp_path / "o2") + ["--reference", str(other)], capsys, "--reference",
             "tokenizer")
    _refused(ppo_args(folder, prompts, tmp_path / "o3") + ["--reward", str(folder)], capsys,
             "--reward", "not a task folder")
    no_tok = tmp_path / "notok"
    checkpoint.save(body("gpt", tok), no_tok)
    _refused(dpo_args(no_tok, pairs, tmp_path / "o4"), capsys, "--policy", "tokenizer")
    _refused(["align", "make-pairs", "--policy", str(folder), "--prompts", str(prompts), "--reward",
              "align_helpers:vowel_share", "--k", "1", "--out", str(tmp_path / "p.jsonl")], capsys, "--k 1")
    for k in (1, 2, 3, 4):
        assert not (tmp_path / f"o{k}").exists()
    assert not (tmp_path / "p.jsonl").exists()


def test_a_reward_model_with_another_tokenizer_and_a_long_prompt_are_refused(policy, tmp_path, capsys):  # noqa: F811
    from lmforge.tasks import TaskSpec
    from lmforge.tasks.finetune import finetune
    from task_helpers import train_config

    folder, tok, _, prompts = policy
    train = write_sentiment(tmp_path / "train.tsv", 16)
    finetune(body("gpt", tok), TaskSpec(task="classify"), str(train), str(train), config=train_config(1),
             out=tmp_path / "clf", tokenizer=tok)
    tokenizer(tmp_path, "bert").save(tmp_path / "clf" / "model")  # the reward model's text would be other ids
    pairs_out = tmp_path / "p.jsonl"
    _refused(["align", "make-pairs", "--policy", str(folder), "--prompts", str(prompts), "--reward",
              str(tmp_path / "clf" / "model"), "--out", str(pairs_out)], capsys, "tokenizer.json")
    assert not pairs_out.exists()
    long = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "the film"}, {"prompt": "the plot " * 40}])
    _refused(ppo_args(folder, long, tmp_path / "o1"), capsys, "long.jsonl", "row 2", "context")
    assert not (tmp_path / "o1").exists()
