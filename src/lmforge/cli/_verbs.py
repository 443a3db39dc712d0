"""The verb table: each ``lmforge`` verb, the module under :mod:`lmforge.cli` that registers it, and its one-line
help.

``lmforge``, ``lmforge --help`` and a mistyped verb are answered from this table alone: importing every verb
module (and through them torch and the optional extras) took far longer than the answer. ``lmforge VERB ...``
imports only ``VERB``'s module. A new verb is a new module *and* a row here; ``tests/test_cli_lazy.py`` checks
that the rows and the modules' own ``add_parser(..., help=...)`` agree, so neither can drift.

Example::

    >>> VERBS["fill-mask"].module
    'fill_mask'
    >>> VERBS["finetune"].help.startswith("fine-tune a model on a task")
    True
"""

from __future__ import annotations

from typing import NamedTuple


class Verb(NamedTuple):
    module: str  # under lmforge.cli
    help: str


# In module-name order: the order ``lmforge --help`` has always listed them in.
VERBS: dict[str, Verb] = {
    "align": Verb("align", "align a policy: DPO on preference pairs, RLHF with PPO, GRPO; make-pairs"),
    "attention": Verb("attention", "draw a model's attention maps (every layer and head) on one text"),
    "bench": Verb("bench", "run the speed/memory benchmarks and print lmforge vs reference ratios"),
    "benchmark": Verb("benchmark", "fine-tune and evaluate every task of a suite (glue): its table, average and "
                                   "test submission files"),
    "chat": Verb("chat", "chat with a decoder in the terminal (streaming, history, /reset, /system)"),
    "checkpoint": Verb("checkpoint", "work with training checkpoints (consolidate to a model)"),
    "convert": Verb("convert", "convert Hugging Face model folders to lmforge and back; write GGUF for llama.cpp"),
    "cost": Verb("cost", "the price tag of a run or experiment (FLOPs, kWh, CO2e, $), or an estimate before "
                         "running"),
    "data": Verb("data", "tokenise corpora into shards for training"),
    "datasets": Verb("datasets", "list and locate the demo data sets shipped with lmforge"),
    "distill": Verb("distill", "distil a teacher into a smaller student (DistilBERT pre-training, or a fine-tuned "
                               "task)"),
    "embed": Verb("embed", "sentence embeddings of a text file -> .npy"),
    "evaluate": Verb("evaluate", "score a fine-tuned model on labelled data (table, then a JSON line)"),
    "experiment": Verb("experiment", "run a grid of runs (axes x seeds) and report it as a table"),
    "fill-mask": Verb("fill_mask", "top-k fillers of a [MASK] with their probabilities (cloze probe)"),
    "finetune": Verb("finetune", "fine-tune a model on a task (classify, regress, multilabel, tag, qa, "
                                 "multiple-choice, seq2seq, text2text, reward)"),
    "generate": Verb("generate", "generate text from a model folder (greedy, beam search, sampling)"),
    "index": Verb("index", "build and search a dense retrieval index"),
    "model": Verb("model", "inspect models (presets and checkpoint folders)"),
    "neighbors": Verb("neighbors", "contextual nearest neighbours of a word vs a static baseline"),
    "peft": Verb("peft", "parameter-efficient fine-tuning adapters: info, merge, export-hf"),
    "plan": Verb("plan", "compute-optimal parameters and tokens for a FLOP or time budget (Chinchilla)"),
    "predict": Verb("predict", "write a fine-tuned model's predictions (with probabilities) for a data file"),
    "pretrain": Verb("pretrain", "pre-train a model (MLM, MLM + NSP, ELECTRA, causal LM, prefix LM, span "
                                 "corruption, denoising, encoder-decoder LM, ELMo biLM)"),
    "probe": Verb("probe", "per-layer linear probes on frozen representations; cloze knowledge probes (P@1, "
                           "P@10); bias probes on minimal pairs (CrowS-Pairs)"),
    "prompt": Verb("prompt", "prompt a frozen model: zero/few-shot classification"),
    "quantize": Verb("quantize", "convert a model folder to int8/int4 weights and report its quality vs fp32"),
    "quickstart": Verb("quickstart", "the whole paradigm on the bundled data in a time budget, with an HTML "
                                     "report"),
    "scaling": Verb("scaling", "IsoFLOP sweeps and Chinchilla scaling-law fits"),
    "serve": Verb("serve", "serve models over an OpenAI-compatible HTTP API (continuous batching, playground at "
                           "/)"),
    "tasks": Verb("tasks", "list the tasks lmforge knows by name (GLUE, SuperGLUE, SQuAD, SNLI, RACE, IMDb ... "
                  "and the shipped ones)"),
    "tokenizer": Verb("tokenizer", "train a tokenizer, encode/decode text"),
}
