"""The shipped ``demo-instructions`` set: its files are their documented rebuild, its rows say what their sources
say, and ``lmforge finetune --task instruct --train demo-instructions`` gives a folder ``lmforge chat`` uses."""

from __future__ import annotations

import gzip
import hashlib
import io
import re
import sys
from collections import Counter

import pytest

from lmforge import datasets
from lmforge.cli.main import main
from lmforge.datasets import instructions
from lmforge.prompting.instruct import CHAT_TEMPLATE_FILE, default_eval, read_instructions
from tests.prompting_helpers import body, tokenizer


def test_shipped_files_are_their_documented_rebuild():
    sources_md = (datasets.FILES.parent / "SOURCES.md").read_text(encoding="utf-8")
    built = instructions.files()
    assert set(built) == set(datasets.info("demo-instructions").files.values())
    for name, data in built.items():
        packed = (datasets.FILES / name).read_bytes()
        assert data == packed, name
        assert hashlib.sha256(gzip.decompress(packed)).hexdigest() in sources_md, name


@pytest.fixture(scope="module")
def rows():
    return {split: datasets.load("demo-instructions", split) for split in ("train", "dev")}


def _answer(problem: str) -> int:
    """A word problem's answer, read off its sentences (independent of the generator's solver)."""
    total = int(re.search(r"has (\d+)", problem).group(1))
    for verb, n in re.findall(r"(gets|gives away) (\d+)", problem):
        total += int(n) if verb == "gets" else -int(n)
    return total


def test_rows_are_what_their_sources_say(rows):
    for split, split_rows in rows.items():
        counts = Counter(r["kind"] for r in split_rows)
        assert counts == {k: n[split == "dev"] for k, n in instructions.COUNTS.items()}, split
        assert all(r["input"] and r["output"] and len(r["input"]) + len(r["output"]) <= 170 for r in split_rows)
        assert all(r["instruction"] in instructions.INSTRUCTIONS[r["kind"]] for r in split_rows)
        verses = datasets.load("kjv-rv1909", split)
        en_es = {(v["en"], v["es"]) for v in verses}
        kjv = [v["en"] for v in verses]
        following = set(zip(kjv, kjv[1:]))  # consecutive rows (a chapter's last verse pairs with the next's first)
        for r in split_rows:
            if r["kind"] == "translate-es":
                assert (r["input"], r["output"]) in en_es
            elif r["kind"] == "translate-en":
                assert (r["output"], r["input"]) in en_es
            elif r["kind"] == "next-verse":
                assert (r["input"], r["output"]) in following
            elif r["kind"] == "arithmetic":
                assert r["output"].endswith(f"The answer is {_answer(r['input'])}.")
            elif r["kind"] == "novel":
                assert r["output"].removesuffix(".") in dict(instructions.NOVELS)
    # held out: no input of dev is an input of train; no review text of rt-sentiment is used
    assert not {r["input"] for r in rows["dev"]} & {r["input"] for r in rows["train"]}
    reviews = {r["text"] for split in ("train", "dev", "test") for r in datasets.load("rt-sentiment", split)}
    assert not reviews & {r[c] for split_rows in rows.values() for r in split_rows for c in ("input", "output")}


def test_names_resolve_to_conversations_and_the_dev_split_is_the_default_eval():
    assert default_eval("demo-instructions") == "demo-instructions:dev"
    assert default_eval("demo-instructions:train") is None  # a split named by hand: the user chose
    dev = read_instructions("demo-instructions:dev")
    assert len(dev) == 215 and [m["role"] for m in dev[0]] == ["user", "assistant"]
    first = datasets.load("demo-instructions", "dev")[0]
    assert dev[0][0]["content"] == f"{first['instruction']}\n\n{first['input']}"
    assert dev[0][1]["content"] == first["output"]


def test_a_mistyped_name_suggests_the_shipped_set_in_one_line(tmp_path, capsys):
    tok = tokenizer(tmp_path, "gpt")
    base = body("gpt-tiny", tok).save(tmp_path / "base", tokenizer=tok)
    code = main(["finetune", "--task", "instruct", "--model", str(base), "--train", "demo-instruction",
                 "--out", str(tmp_path / "run"), "--max-steps", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert "demo-instruction: no such file" in err and "did you mean 'demo-instructions'?" in err
    assert not (tmp_path / "run").exists()


def test_finetune_on_demo_instructions_then_chat(tmp_path, capsys, monkeypatch):
    tok = tokenizer(tmp_path, "gpt")
    base = body("gpt-tiny", tok).save(tmp_path / "base", tokenizer=tok)
    out = tmp_path / "run"
    code = main(["finetune", "--task", "instruct", "--model", str(base), "--train", "demo-instructions",
                 "--out", str(out), "--max-steps", "2", "--batch-size", "4", "--eval-every", "2", "--pack",
                 "--precision", "fp32", "--no-progress"])
    assert code == 0
    assert (out / "model" / CHAT_TEMPLATE_FILE).is_file()
    metrics = (out / "metrics.jsonl").read_text(encoding="utf-8")
    assert '"eval_loss"' in metrics  # the dev split was evaluated without --eval
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.StringIO("Translate to Spanish: In the beginning.\n"))
    assert main(["chat", "--model", str(out / "model"), "--temperature", "0", "--max-new-tokens", "3"]) == 0
    captured = capsys.readouterr()
    assert "not instruction-tuned" not in captured.err  # it chats through the template it was tuned with
    assert captured.out.count("\n") == 1  # one answer to the one line it was given
