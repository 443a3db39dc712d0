"""``lmforge quickstart``: the whole paradigm on the shipped demo data, in a time budget, with a report.

It pre-trains a small model of each family (causal LM, masked LM, span corruption), fine-tunes the
encoder on sentiment from those weights and from scratch (and with LoRA, and MiniLM when installed),
prompts the decoder zero- and few-shot, generates text, fine-tunes the encoder-decoder to translate,
embeds and searches, and probes each layer; then writes ``report.json`` and a self-contained
``report.html``.

    module       what
    stages       the stage list, in order (each stage lives in its own module below)
    corpora      stages tokenizers + data          pretraining  stage pretrain-{gpt,bert,t5}
    finetuning   stages finetune-*                  prompting    stage prompting
    generation   stage generation                   translation  stage translation
    retrieval    stage retrieval                    probing      stage probing
    budget       the time budget and its split      probe        throughput probes -> step counts
    folder       the run folder, finished-stage records, resume
    context      what a stage is handed             runs         shared steps of training stages
    runner       runs the stages, then the report   report/html/plots   report.json, report.html, figures

Example (a sketch: about a minute on two CPU cores)::

    from lmforge.quickstart import run_quickstart
    report = run_quickstart("quickstart-run", minutes=1)
    report["stages"]["finetune-bert"]["test"]["accuracy"]
"""

from lmforge.quickstart.runner import run_quickstart

__all__ = ["run_quickstart"]
