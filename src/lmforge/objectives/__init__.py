"""Pre-training objectives as seeded batch transforms (collators), one file each.

Every objective is built from plain ids and options, never from a tokenizer, and turns a list of
tokenised examples into model inputs: ``objective(examples) -> dict[str, Tensor]``. Labels are aligned
with the predictions (the loss is CE(logits[:, t], labels[:, t]), with -100 ignored), padding is on the
right, and ``state_dict()`` / ``load_state_dict()`` restore the random stream for exact resume.

==========================  =============================  ==================  ==========================
name                        class                          architecture        paper
==========================  =============================  ==================  ==========================
``mlm``                     ``MaskedLM``                   encoder             BERT; SpanBERT
``nsp``                     ``NextSentencePrediction``     encoder             BERT (off unless asked)
``mlm+nsp``                 ``MaskedLMAndNSP``             encoder             BERT (MLM + NSP; RoBERTa §4.2)
``clm``                     ``CausalLM``                   decoder             GPT
``prefix-lm``               ``PrefixLM``                   decoder             T5 §3.2; UniLM
``span-corruption``         ``SpanCorruption``             enc-dec; decoder    T5 (Table 2: LM, prefix LM rows)
``denoising``               ``BartDenoising``              enc-dec; decoder    BART
``enc-dec-lm``              ``EncDecLM``                   encoder-decoder     T5 §3.3.1 (prefix LM baseline)
``bilm``                    ``BiLMObjective``              bilstm              ELMo (forward + backward LM)
``electra``                 ``ReplacedTokenDetection``     encoder             ELECTRA (generator + discriminator)
``mass``                    ``Mass``                       encoder-decoder     MASS (masked fragment, decoded)
``permuted-lm``             ``PermutedLM``                 encoder             XLNet (two-stream attention)
``unilm``                   ``UniLM``                      encoder             UniLM (per-row attention masks)
``multilingual-denoising``  ``MultilingualDenoising``      encoder-decoder     mBART (language ids, many languages)
``ul2``                     ``UL2``                        enc-dec; decoder    UL2 (mixture of denoisers, mode tokens)
==========================  =============================  ==================  ==========================

Example::

    >>> from lmforge.objectives import build_objective, check_architecture
    >>> clm = build_objective("clm", pad_token_id=0)
    >>> clm([[5, 6, 7]])["labels"].tolist()
    [[6, 7]]
    >>> check_architecture("enc-dec-lm", "decoder")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lmforge.errors.UserInputError: objective 'enc-dec-lm' does not fit arch='decoder': ...; it needs arch='encoder-decoder'
"""

from __future__ import annotations

from lmforge.objectives.bilm import BiLMObjective
from lmforge.objectives.clm import CausalLM
from lmforge.objectives.denoising import BartDenoising
from lmforge.objectives.enc_dec_lm import EncDecLM
from lmforge.objectives.electra import ReplacedTokenDetection
from lmforge.objectives.mass import Mass
from lmforge.objectives.mlm import MaskedLM
from lmforge.objectives.multilingual_denoising import MultilingualDenoising
from lmforge.objectives.nsp import MaskedLMAndNSP, NextSentencePrediction
from lmforge.objectives.permuted_lm import PermutedLM
from lmforge.objectives.prefix_lm import PrefixLM
from lmforge.objectives.span_corruption import SpanCorruption, compute_input_and_target_lengths
from lmforge.objectives.ul2 import UL2
from lmforge.objectives.unilm import UniLM
from lmforge.errors import UserInputError

# The values of ModelConfig.arch, plus "bilstm": ELMo's biLM (lmforge.models.bilstm_lm), which is no Transformer.
ARCHITECTURES = ("encoder", "decoder", "encoder-decoder", "bilstm")

OBJECTIVES = {
    "mlm": MaskedLM,
    "nsp": NextSentencePrediction,
    "mlm+nsp": MaskedLMAndNSP,
    "clm": CausalLM,
    "prefix-lm": PrefixLM,
    "span-corruption": SpanCorruption,
    "denoising": BartDenoising,
    "enc-dec-lm": EncDecLM,
    "bilm": BiLMObjective,
    "electra": ReplacedTokenDetection,
    "mass": Mass,
    "permuted-lm": PermutedLM,
    "unilm": UniLM,
    "multilingual-denoising": MultilingualDenoising,
    "ul2": UL2,
}

# objective -> (architectures it trains, why), so a mismatch can be explained, not just refused.
FITS = {
    "mlm": (("encoder",), "it predicts tokens from bidirectional context at the input positions"),
    "nsp": (("encoder",), "it classifies a sentence pair from the [CLS] output of a bidirectional encoder"),
    "mlm+nsp": (("encoder",), "it predicts masked tokens and classifies the sentence pair from the [CLS] output "
                              "of a bidirectional encoder"),
    "clm": (("decoder",), "it trains next-token prediction under a causal mask"),
    "prefix-lm": (("decoder",), "it passes a (B, T, T) prefix mask to a single decoder stack"),
    # On a decoder (T5 Table 2's "Language model" and "Prefix LM" rows) input and target are concatenated:
    # layout decoder | prefix-lm, see lmforge.objectives.decoder_layout.
    "span-corruption": (
        ("encoder-decoder", "decoder"),
        "it produces targets from a corrupted input (for a decoder: concatenated after it)",
    ),
    "denoising": (
        ("encoder-decoder", "decoder"),
        "it produces targets from a corrupted input (for a decoder: concatenated after it)",
    ),
    "enc-dec-lm": (("encoder-decoder",), "it feeds a prefix to an encoder and decodes the rest of the text"),
    "bilm": (("bilstm",), "it trains separate forward and backward LMs, i.e. ELMo's biLM (--model elmo-tiny)"),
    "electra": (("encoder",), "its discriminator labels every token of a bidirectional encoder's input"),
    "mass": (("encoder-decoder",), "the encoder reads the sentence with a fragment masked and the decoder "
                                   "predicts exactly that fragment"),
    "permuted-lm": (("encoder",), "it runs XLNet's content and query streams through one encoder stack "
                                  "(lmforge.models.two_stream)"),
    "unilm": (("encoder",), "it gives one encoder stack a (B, T, T) bidirectional, left-to-right, right-to-left "
                            "or seq2seq mask per row"),
    "multilingual-denoising": (("encoder-decoder",), "its encoder reads the noised text and language id, and the "
                                                     "decoder, started by the language id, writes the original"),
    "ul2": (
        ("encoder-decoder", "decoder"),
        "it produces targets from a corrupted input or a prefix (for a decoder: concatenated after it)",
    ),
}


def _canonical(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    if key not in OBJECTIVES:
        raise UserInputError(f"unknown objective {name!r}; choose one of {sorted(OBJECTIVES)}")
    return key


def build_objective(name: str, **options):
    """Construct an objective by name (a key of :data:`OBJECTIVES`).

    ``options`` are the class's keyword arguments: special-token ids, rates and ``seed``.
    """
    return OBJECTIVES[_canonical(name)](**options)


def architectures_for(name: str) -> tuple[str, ...]:
    """The model architectures an objective can train, e.g. ``("encoder-decoder",)``."""
    return FITS[_canonical(name)][0]


def check_architecture(name: str, architecture: str) -> None:
    """Raise ValueError, with the reason, when objective ``name`` cannot train an ``architecture`` model."""
    if architecture not in ARCHITECTURES:
        raise UserInputError(f"unknown architecture {architecture!r}; choose one of {list(ARCHITECTURES)}")
    key = _canonical(name)
    fits, why = FITS[key]
    if architecture not in fits:
        raise UserInputError(
            f"objective {key!r} does not fit arch={architecture!r}: {why}; it needs arch="
            + " or ".join(repr(a) for a in fits)
        )


__all__ = [
    "ARCHITECTURES",
    "FITS",
    "OBJECTIVES",
    "BartDenoising",
    "BiLMObjective",
    "CausalLM",
    "EncDecLM",
    "Mass",
    "MaskedLM",
    "MaskedLMAndNSP",
    "MultilingualDenoising",
    "NextSentencePrediction",
    "PermutedLM",
    "PrefixLM",
    "ReplacedTokenDetection",
    "SpanCorruption",
    "UL2",
    "UniLM",
    "architectures_for",
    "build_objective",
    "check_architecture",
    "compute_input_and_target_lengths",
]
