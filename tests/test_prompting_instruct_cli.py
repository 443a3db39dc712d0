"""`lmforge finetune --task instruct` end to end: JSONL demonstrations in, a tuned model with its chat
template out."""

from __future__ import annotations

import json

import lmforge
from lmforge.cli.main import main
from tests.prompting_helpers import body, tokenizer


def test_finetune_task_instruct_cli(tmp_path):
    tok = tokenizer(tmp_path, "gpt")
    base = body("gpt-tiny", tok).save(tmp_path / "base", tokenizer=tok)
    rows = [{"instruction": "Is this review positive or negative?", "input": text, "output": word}
            for text, word in [("a great film", "positive"), ("a dull plot", "negative")] * 8]
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "run"
    code = main(["finetune", "--task", "instruct", "--model", str(base), "--train", str(data), "--out", str(out),
                 "--max-steps", "3", "--batch-size", "4", "--pack", "--precision", "fp32", "--no-progress"])
    assert code == 0
    assert (out / "model" / "chat_template.json").is_file()
    assert lmforge.load(out / "model").config.arch == "decoder"
