"""``report.html``: one self-contained page (inline CSS, PNG figures embedded as base64 data URIs).

It reads only the report dictionary (:mod:`lmforge.quickstart.report`), so the page and ``report.json``
always agree. A stage that was skipped shows its reason instead of its section's numbers.
"""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path
from typing import Any

import lmforge.quickstart.plots as plots
from lmforge.cost.report import tag_line
from lmforge.quickstart.serving import chat_commands
from lmforge.utils.io import atomic_write_text

REPORT_HTML = "report.html"
CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1060px; margin: 2em auto;
       padding: 0 1.2em; color: #222; line-height: 1.45; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.8em; }
.meta { color: #555; font-size: 0.92em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f5f8; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; display: block; margin: 0.6em 0; }
pre { background: #f6f6f6; padding: 0.6em; white-space: pre-wrap; font-size: 0.88em; }
blockquote { border-left: 3px solid #3b6ea8; margin: 0.6em 0; padding: 0.2em 0.8em; background: #f7f9fc; }
.skipped { color: #8a5a00; }
"""


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def _img(png: bytes | None, alt: str) -> str:
    if not png:
        return ""
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _num(value: Any, fmt: str = "{:.3f}") -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return fmt.format(value)
    return escape(str(value))


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(
        f'<td class="num">{_num(c)}</td>' if isinstance(c, (int, float)) and not isinstance(c, bool)
        else f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _skipped(record: dict | None) -> str:
    if record is None:
        return '<p class="skipped">not run</p>'
    return f'<p class="skipped">skipped: {escape(record["skipped"])}</p>' if record.get("skipped") else ""


def _pretraining(stages: dict[str, dict], figs: dict[str, bytes | None]) -> str:
    runs = {n: r for n, r in stages.items() if n.startswith("pretrain-")}
    if not runs:
        return ""
    rows = [[r["model"], r["objective"], r["parameters"], r["steps"], r["tokens"], r.get("first_loss"),
             r.get("last_loss"), r.get("eval_loss"), r.get("eval_ppl"), r["plan"]["seconds_per_step"],
             r.get("seconds_per_step_measured")] for r in runs.values()]
    return ("<h2>Pre-training</h2><p>Each model trains for its share of the budget; the step count comes from a "
            "measured throughput probe, so each cosine schedule ends with its time.</p>"
            + _img(figs.get("pretraining"), "pre-training loss curves")
            + _table(["model", "objective", "parameters", "steps", "tokens", "first loss", "last loss",
                      "held-out loss", "held-out ppl", "s/step (probe)", "s/step (run, with evals)"], rows))


def _finetuning(stages: dict[str, dict], figs: dict[str, bytes | None]) -> str:
    runs = _sentiment_runs(stages)
    if not runs:
        return ""
    rows = [[label, r["steps"], f"{r['lr']:g}", r.get("trainable_parameters"), r.get("trainable_percent"),
             r["test"].get("accuracy"), r["test"].get("f1_macro"), r.get("test_examples")] for label, r in runs.items()]
    skipped = "".join(_skipped(stages.get(n)) for n in SENTIMENT_RUNS if stages.get(n, {}).get("skipped"))
    return ("<h2>Fine-tuning: what pre-training buys</h2><p>Sentiment of rt-sentiment reviews, scored on the same "
            "test reviews. From scratch and pre-trained differ only in the starting weights." + _gap(stages) + "</p>"
            + _img(figs.get("finetuning"), "pre-trained vs scratch accuracy")
            + _img(figs.get("finetuning_curves"), "fine-tuning loss curves")
            + _table(["run", "steps", "peak lr", "trainable params", "trainable %", "accuracy", "macro F1",
                      "test reviews"], rows) + skipped)


SENTIMENT_RUNS = {"finetune-bert-scratch": "bert-tiny, from scratch", "finetune-bert": "bert-tiny, pre-trained here",
                  "finetune-bert-lora": "bert-tiny + LoRA", "finetune-minilm": "all-MiniLM-L6-v2"}


def _sentiment_runs(stages: dict[str, dict]) -> dict[str, dict]:
    """The sentiment fine-tuning records that ran, by display name, weakest starting point first."""
    return {label: stages[n] for n, label in SENTIMENT_RUNS.items() if n in stages and not stages[n].get("skipped")}


def figures(report: dict[str, Any]) -> dict[str, bytes | None]:
    """Every figure of the page, as PNG bytes (None where a stage did not run)."""
    stages = report["stages"]
    pre = {f"{r['model']} ({r['objective']})": r.get("curve") for n, r in stages.items() if n.startswith("pretrain-")}
    runs = _sentiment_runs(stages)
    figs: dict[str, bytes | None] = {
        "pretraining": plots.loss_curves(pre, "pre-training loss"),
        "finetuning": plots.bars({k: r["test"]["accuracy"] for k, r in runs.items()}, "test accuracy",
                                 "rt-sentiment test accuracy", _majority(runs), limits=(0, 1)),
        "finetuning_curves": plots.overlaid_curves({k: r.get("curve") for k, r in runs.items()}, "fine-tuning loss"),
        "timings": plots.timings({n: s.get("budget_seconds") or 0.0 for n, s in report["timings"]["stages"].items()},
                                 {n: s["seconds"] for n, s in report["timings"]["stages"].items()}),
    }
    full, lora = stages.get("finetune-bert"), stages.get("finetune-bert-lora")
    if full and lora and not lora.get("skipped"):
        figs["peft"] = plots.peft_comparison(full, lora)
    prompting = stages.get("prompting")
    if prompting and not prompting.get("skipped"):
        acc = prompting["accuracy"]
        figs["prompting"] = plots.bars({"zero-shot": acc["zero_shot"], "zero-shot, calibrated":
                                        acc["zero_shot_calibrated"], f"{prompting['shots']}-shot": acc["few_shot"]},
                                       "accuracy", "prompted sentiment accuracy", prompting["majority_baseline"],
                                       limits=(0, 1))
    translation = stages.get("translation")
    if translation and not translation.get("skipped"):
        figs["translation"] = plots.loss_curves({"t5-tiny en->es": translation.get("curve")},
                                                "translation fine-tuning loss", 1)
    probing = stages.get("probing")
    if probing and not probing.get("skipped"):
        figs["probing"] = plots.probing(probing["layers"], probing.get("majority_baseline"))
    return figs


PRETRAINING_TEXT = {"reviews": " on the training reviews' text", "english": " on Austen and the training reviews"}


def _gap(stages: dict[str, dict]) -> str:
    """One sentence on what this run's pre-training was worth, from its own numbers."""
    pre, scratch, mlm = stages.get("finetune-bert"), stages.get("finetune-bert-scratch"), stages.get("pretrain-bert")
    if not pre or not scratch or not mlm or pre.get("skipped") or scratch.get("skipped"):
        return ""
    gap = 100 * (pre["test"]["accuracy"] - scratch["test"]["accuracy"])
    text = PRETRAINING_TEXT.get(mlm.get("corpus"), "")
    return (f" Here {mlm['steps']:,} steps ({mlm['tokens']:,} tokens) of masked-LM pre-training{text} moved test "
            f"accuracy by {gap:+.1f} points. A fine-tuning run varies by 1-2 points with its seed, and minutes of "
            f"pre-training on the task's own reviews buy a point at most; MiniLM shows what pre-training on far more "
            f"text buys.")


def _majority(runs: dict[str, dict]) -> float | None:
    return next((r["majority_baseline"] for r in runs.values() if r.get("majority_baseline") is not None), None)


def _peft(stages: dict[str, dict], figs: dict[str, bytes | None]) -> str:
    full, lora = stages.get("finetune-bert"), stages.get("finetune-bert-lora")
    if not full or not lora or lora.get("skipped"):
        return ""
    rows = [[label, r.get("trainable_parameters"), r.get("total_parameters"), r.get("trainable_percent"),
             r["test"]["accuracy"]] for label, r in (("full fine-tuning", full), ("LoRA r=8 on q, v + head", lora))]
    return ("<h2>PEFT: full fine-tuning vs LoRA</h2>" + _img(figs.get("peft"), "PEFT comparison")
            + _table(["run", "trainable", "total", "trainable %", "test accuracy"], rows))


def _prompting(record: dict | None, figs: dict[str, bytes | None]) -> str:
    if not record or record.get("skipped"):
        return "<h2>Prompting</h2>" + _skipped(record)
    prompts = record.get("prompts") or {}
    return ("<h2>Prompting the frozen gpt-tiny</h2>"
            f"<p>Template <code>{escape(record['template'])}</code>, answers "
            f"{escape(', '.join(f'{k} = {v}' for k, v in record['answers'].items()))}; {record['examples']} test "
            "reviews. Predictions: "
            + escape("; ".join(f"{k.replace('_', ' ')}: " + ", ".join(f"{n} x {record['answers'][label]}"
                                                                   for label, n in counts.items())
                               for k, counts in record["predicted"].items())) + "</p>"
            + _img(figs.get("prompting"), "prompting accuracy")
            + "".join(f"<p>{escape(k.replace('_', '-'))} prompt:</p><pre>{escape(v)}</pre>"
                      for k, v in prompts.items()))


def _generation(record: dict | None) -> str:
    if not record or record.get("skipped"):
        return "<h2>Generation</h2>" + _skipped(record)
    s = record["settings"]
    quotes = "".join(f"<blockquote><b>{escape(x['prompt'])}</b>{escape(x['text'])} <i>({x['decoding']})</i>"
                     "</blockquote>" for x in record["samples"])
    return (f"<h2>Generation with gpt-tiny</h2><p>{s['max_new_tokens']} new tokens; sampling: top-p {s['top_p']}, "
            f"temperature {s['temperature']}, repetition penalty {s['repetition_penalty']}, seed {s['seed']}. "
            f"{_num(record.get('tokens_per_second'), '{:.0f}')} tokens/s.</p>" + quotes)


def _chat(record: dict | None, root: Path | None) -> str:
    """How to chat with the pre-trained decoder now, and how to instruction-tune it first."""
    if not record or record.get("skipped") or not record.get("model_dir"):
        return ""
    c = chat_commands(record["model_dir"], root)
    where = "" if root is not None else " (QS: the run folder, which holds this page)"
    return (f"<h2>Chat with {escape(record['model'])}</h2><p>The pre-trained decoder can be served and chatted with "
            f"now{where}. It was not instruction-tuned (its folder has no chat_template.json), so it chats through "
            "the plain default template (<code>User:</code>/<code>Assistant:</code> lines) and continues the "
            "conversation as text rather than following instructions. Serve it (needs the serve extra: "
            "<code>pip install 'lmforge[serve]'</code>):</p>"
            f"<pre>{escape(c['serve'])}</pre><p>and open the playground at "
            f"<a href=\"{escape(c['playground'])}\">{escape(c['playground'])}</a> (another port: "
            f"<code>--port</code>), or chat in the terminal:</p><pre>{escape(c['chat'])}</pre>"
            "<p>To instruction-tune it on <code>demo-instructions</code>, the instruction set that ships with "
            "lmforge (translation, next verse, modern wording of Bible verses, Austen, worked arithmetic):</p>"
            f"<pre>{escape(c['finetune'])}</pre><p>The tuned folder holds chat_template.json, and chat uses "
            f"it:</p><pre>{escape(c['chat_tuned'])}</pre>")


def _translation(record: dict | None, figs: dict[str, bytes | None]) -> str:
    if not record or record.get("skipped"):
        return "<h2>Translation</h2>" + _skipped(record)
    rows = [[e["en"], e["reference"], e["output"] or "(nothing yet: the model ends at once)"]
            for e in record["examples"]]
    return (f"<h2>Translation en&rarr;es with t5-tiny</h2><p>Fine-tuned from the span-corruption weights for "
            f"{record['steps']} steps on {record['train_pairs']:,} verse pairs. "
            f"BLEU {_num(record['test'].get('bleu'), '{:.2f}')}, "
            f"chrF {_num(record['test'].get('chrf'), '{:.2f}')} on {record['test_examples']} test verses.</p>"
            + _img(figs.get("translation"), "translation loss")
            + _table(["English (KJV)", "reference (RV 1909)", "t5-tiny"], rows))


def _retrieval(record: dict | None) -> str:
    if not record or record.get("skipped"):
        return "<h2>Embeddings and retrieval</h2>" + _skipped(record)
    rows = [[name] + [v for k, v in s.items() if k != "seconds"] for name, s in record["encoders"].items()]
    keys = [k for k in next(iter(record["encoders"].values())) if k != "seconds"]
    answers = [[a["text"], a["cosine"]] for a in record["answers"]]
    return (f"<h2>Embeddings and retrieval</h2><p>{record['documents']} WEB verses indexed; each KJV wording of "
            "the same verse is a query.</p>" + _table(["encoder"] + keys, rows)
            + f"<p>Query (index of {escape(record['index_encoder'])}): <i>{escape(record['query'])}</i></p>"
            + _table(["nearest verses", "cosine"], answers))


def _probing(record: dict | None, figs: dict[str, bytes | None]) -> str:
    if not record or record.get("skipped"):
        return "<h2>Probing</h2>" + _skipped(record)
    rows = [[name, b["layer"], b["accuracy"]] for name, b in record["best"].items()]
    return (f"<h2>Probing: where sentiment lives</h2><p>One logistic regression per layer on "
            f"{record['train_examples']} training reviews, scored on {record['test_examples']} test reviews.</p>"
            + _img(figs.get("probing"), "probing plot")
            + _table(["encoder", "best layer", "accuracy"], rows))


def _timings(report: dict[str, Any], figs: dict[str, bytes | None]) -> str:
    t = report["timings"]
    rows = [[n, s.get("budget_seconds"), s["seconds"]] for n, s in t["stages"].items()]
    return ("<h2>Time budget</h2><p>Each stage gets the time left, split by fixed weights among the stages still to "
            "run, so early savings or overruns are passed on.</p>" + _img(figs.get("timings"), "timings")
            + _table(["stage", "budget share (s)", "took (s)"], rows))


def _price_tags(report: dict[str, Any]) -> str:
    tags = report.get("price_tags")
    if not tags:
        return ""
    rows = [[r["run"], f"{r.get('total_flops') or 0:.3g}", f"{r.get('total_tokens') or 0:,}",
             f"{(r.get('device_s') or 0) / 3600:.3g}", f"{r.get('energy_kwh') or 0:.3g}",
             f"{(r.get('co2e_kg') or 0) * 1000:.3g}", f"{r.get('cost_usd') or 0:.2g}"] for r in tags["runs"]]
    return ("<h2>Price tags</h2><p>What each training run cost (Schwartz et al., 2019): FLOPs counted per step, "
            "device-hours, energy (" + escape(str(tags["total"].get("energy_method"))) + "), CO2e and dollars. In "
            "all: " + escape(tag_line(tags["total"])) + ".</p>"
            + _table(["run", "FLOPs", "tokens", "device-h", "kWh", "g CO2e", "$"], rows))


def render(report: dict[str, Any], figs: dict[str, bytes | None] | None = None, root: Path | None = None) -> str:
    """The whole page (``figs``: from :func:`figures`, drawn here when not given; ``root``: the run folder, which
    the page's commands name, else they name paths relative to it)."""
    figs = figures(report) if figs is None else figs
    stages = report["stages"]
    t, m, s = report["timings"], report["machine"], report["settings"]
    summary = _table(["stage", "result", "time"], [[r["title"], r["result"], _clock(r["seconds"])]
                                                     for r in report["summary"]])
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items())
    head = (f"<h1>lmforge quickstart</h1><p class='meta'>{t['total_seconds'] / 60:.1f} minutes of a "
            f"{t['budget_seconds'] / 60:g}-minute budget on {escape(str(s.get('device')))} &middot; "
            f"{escape(str(m.get('cpu')))}, {m.get('cpu_count')} cores, {m.get('torch_threads')} torch threads &middot; "
            f"lmforge {escape(report['lmforge_version'])} &middot; {escape(versions)} &middot; "
            f"generated {escape(report['generated_at'])}</p>")
    body = (head + "<h2>Summary</h2>" + summary + _pretraining(stages, figs) + _finetuning(stages, figs)
            + _peft(stages, figs) + _prompting(stages.get("prompting"), figs) + _generation(stages.get("generation"))
            + _chat(stages.get("pretrain-gpt"), root)
            + _translation(stages.get("translation"), figs) + _retrieval(stages.get("retrieval"))
            + _probing(stages.get("probing"), figs) + _timings(report, figs) + _price_tags(report)
            + "<p class='meta'>Every number on this page was measured by this run; report.json beside this file "
              "holds all of them.</p>")
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>lmforge quickstart report</title>"
            f"<style>{CSS}</style></head><body>{body}</body></html>\n")


def write(report: dict[str, Any], folder: Path, figs: dict[str, bytes | None] | None = None) -> Path:
    path = Path(folder) / REPORT_HTML
    atomic_write_text(path, render(report, figs, Path(folder).resolve()))
    return path
