"""`GenerationConfig`: every decoding setting as plain, validated data.

    strategy   what picks the next token
    greedy     argmax of the (penalised) logits
    beam       beam search over ``num_beams`` hypotheses (``num_beams=1`` is greedy, as in HF)
    sample     a draw from softmax(processed logits / temperature), after top-k / top-p / min-p

Repetition penalty and no-repeat-n-gram apply to every strategy; the sampling filters only to
``sample``, and ``length_penalty``/``early_stopping`` only to ``beam``: a setting that the chosen strategy
ignores gets a warning naming it (:data:`ONLY_FOR`). ``None`` for ``eos_token_id``/``pad_token_id``/``decoder_start_token_id`` means "the
model's" (from its ModelConfig); ``ignore_eos=True`` always generates ``max_new_tokens``.

Example:
    >>> cfg = GenerationConfig(max_new_tokens=20, strategy="sample", top_p=0.9, seed=0)
    >>> cfg.replace(temperature=0.7).temperature
    0.7
    >>> GenerationConfig(top_p=1.5)
    Traceback (most recent call last):
    ...
    lmforge.config.ConfigError: GenerationConfig.top_p=1.5 must be in (0, 1]
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from typing import Any

from lmforge.config import ConfigBase, ConfigError

STRATEGIES = ("greedy", "beam", "sample")
# Settings that only one strategy reads, with the value that means "off".
ONLY_FOR = {"temperature": ("sample", (1.0,)), "top_k": ("sample", (None, 0)), "top_p": ("sample", (1.0,)),
            "min_p": ("sample", (None, 0)), "length_penalty": ("beam", (1.0,)), "early_stopping": ("beam", (False,))}


@dataclass
class GenerationConfig(ConfigBase):
    """Decoding settings (see the module docstring).

    Attributes:
        max_new_tokens: tokens to generate per sequence at most (EOS included).
        strategy: ``greedy``, ``beam`` or ``sample``; None = ``beam`` when ``num_beams > 1``, else greedy.
        num_beams: beam width.
        length_penalty: a finished hypothesis scores ``sum log p / n_new_tokens ** length_penalty``
            (HF's definition: > 0 favours longer outputs, < 0 shorter ones).
        early_stopping: True: a prompt is done once ``num_beams`` hypotheses finished. False: also
            stop when the best running beam, scored at its current length, cannot beat the worst
            finished one. ``"never"``: as False, but with a positive length penalty the running
            beam is scored at the maximum length (the canonical, slower test).
        num_return_sequences: outputs per prompt: the n best beams, or n independent samples.
        temperature, top_k, top_p, min_p: sampling filters; ``top_k=None``/0, ``top_p=1`` and
            ``min_p=None``/0 switch them off.
        repetition_penalty: CTRL's penalty (Keskar et al. 2019): the logit ``l`` of every token already
            in the sequence (prompt included) becomes ``l / p`` if positive, else ``l * p``.
        no_repeat_ngram_size: forbid any n-gram from occurring twice in a sequence (0 = off).
        eos_token_id: id(s) that end a sequence; None = the model's.
        ignore_eos: never stop at EOS.
        pad_token_id: fills sequences after they end; None = the model's pad, else EOS, else 0.
        decoder_start_token_id: first decoder token of encoder-decoders; None = the model's.
        stop_strings: end a sequence once its generated text contains one of these (needs a tokenizer).
        seed: seeds sampling (a private generator; the global RNG is left alone). None = global RNG.
        use_cache: decode incrementally over a KV cache (False re-runs the whole prefix every step).
        compile: run each token after the prompt through a ``torch.compile``-d step over a static KV
            cache (see :mod:`lmforge.generation.compiled`): faster per token, after a one-off compile of
            tens of seconds per model and (batch size, capacity). Decoders with learned, sinusoidal,
            RoPE or no positions only; needs ``use_cache``. ``"cached"``: the same where this machine's
            compile cache holds the step; where it does not, a step that compiles one layer for all (int8,
            and bf16 on lmforge's kernel) decodes eagerly instead of waiting, and its layer is packaged as
            the process exits, for the next one (a one-off process gains less from the compile than it
            costs); other steps compile as with ``True``. ``True`` compiles such steps whole at
            decoding's one or two rows: a longer compile, and faster tokens than one layer run for all.
    """

    max_new_tokens: int = 64
    strategy: str | None = None
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    num_return_sequences: int = 1
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float = 1.0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    eos_token_id: int | list[int] | None = None
    ignore_eos: bool = False
    pad_token_id: int | None = None
    decoder_start_token_id: int | None = None
    stop_strings: list[str] = field(default_factory=list)
    seed: int | None = None
    use_cache: bool = True
    compile: bool | str = False

    def __post_init__(self) -> None:
        if isinstance(self.stop_strings, str):
            self.stop_strings = [self.stop_strings]
        self.stop_strings = list(self.stop_strings)
        self.validate()

    @property
    def resolved_strategy(self) -> str:
        """The strategy actually run: ``beam`` with one beam is greedy search."""
        strategy = self.strategy or ("beam" if self.num_beams > 1 else "greedy")
        return "greedy" if strategy == "beam" and self.num_beams == 1 else strategy

    def validate(self) -> "GenerationConfig":
        """Check every field; raise ConfigError (a ValueError) naming the first bad one."""

        def fail(name: str, rule: str) -> None:
            raise ConfigError(f"GenerationConfig.{name}={getattr(self, name)!r} {rule}")

        def integer(name: str, low: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                fail(name, f"must be an integer >= {low}")

        integer("max_new_tokens", 1)
        integer("num_beams", 1)
        integer("num_return_sequences", 1)
        integer("no_repeat_ngram_size", 0)
        if self.top_k is not None:
            integer("top_k", 0)
        if self.strategy is not None and self.strategy not in STRATEGIES:
            fail("strategy", f"is not one of {', '.join(STRATEGIES)}")
        if self.early_stopping not in (True, False, "never"):
            fail("early_stopping", "must be True, False or 'never'")
        if not self.temperature > 0:
            fail("temperature", "must be > 0 (use strategy='greedy' for argmax decoding)")
        if not 0 < self.top_p <= 1:
            fail("top_p", "must be in (0, 1]")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            fail("min_p", "must be in [0, 1]")
        if not self.repetition_penalty > 0:
            fail("repetition_penalty", "must be > 0 (1 = off)")
        strategy = self.resolved_strategy
        if strategy == "sample" and self.num_beams > 1:
            fail("num_beams", "must be 1 with strategy='sample' (beam sampling is not supported)")
        if self.strategy == "greedy" and self.num_beams > 1:
            fail("num_beams", "must be 1 with strategy='greedy' (use strategy='beam')")
        if strategy == "greedy" and self.num_return_sequences > 1:
            fail("num_return_sequences", "must be 1 for greedy search (all copies would be identical)")
        if strategy == "beam" and self.num_return_sequences > self.num_beams:
            fail("num_return_sequences", f"must be <= num_beams={self.num_beams}")
        if self.compile not in (False, True, "cached"):
            fail("compile", "must be True, False or 'cached'")
        if self.compile and not self.use_cache:
            fail("compile", "needs use_cache=True (the compiled step decodes over a static KV cache)")
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            fail("stop_strings", "must be non-empty strings")
        self._warn_ignored(strategy)
        return self

    def _warn_ignored(self, strategy: str) -> None:
        """Warn about each setting that ``strategy`` never reads (a greedy run with ``temperature=0.7``)."""
        for name, (used_by, off) in ONLY_FOR.items():
            value = getattr(self, name)
            if used_by != strategy and not any(value is o or (type(value) is not bool and value == o) for o in off):
                flag = "--" + name.replace("_", "-")
                warnings.warn(f"{flag} {value} (GenerationConfig.{name}) is ignored by {strategy} decoding; it "
                              f"applies to {used_by} decoding only (--strategy {used_by})", UserWarning, stacklevel=5)

    def replace(self, **changes: Any) -> "GenerationConfig":
        """A copy with some fields changed (validated); unknown names are an error."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown generation setting(s) {', '.join(unknown)}")
        return dataclasses.replace(self, **changes)

    config_noun = "generation setting(s)"
