"""UL2's mixture of denoisers (Tay et al. 2022, "UL2: Unifying Language Learning Paradigms", §3.1).

Each example is noised by one denoiser, drawn at random with the mixture's proportions, and its input starts
with the paradigm (mode) token of that denoiser's kind, so the model learns which task it is doing and can be
switched to it when fine-tuned::

    kind  mode token  what the denoiser does
    R     [NLU]       regular span corruption: short spans, low rate (T5's, 15% in spans of 3)
    X     [NLG]       extreme span corruption: long spans or a high rate (spans of 64, or 50% of the text)
    S     [S2S]       sequential: a prefix is the input, the rest of the text the target (a prefix LM)

A denoiser is written ``KIND:MEAN_SPAN:RATE`` (R and X) or ``S:RATE``. R and X reuse T5's span corruption
(:mod:`lmforge.objectives.span_corruption`): the same noise mask and sentinel format, with ``RATE`` as T5's
``noise_density`` and ``MEAN_SPAN`` as its ``mean_noise_span_length``. S cuts the text once: the target is
its last k tokens, k uniform on 1 .. 2·round(RATE·n) − 1, so that on average RATE of the text is the target.
The defaults are the seven denoisers of the paper's final objective, mixed uniformly (a choice of this file: the
paper's own mixing rates were not checked against it; set ``proportions`` to use others)::

    R:3:0.15  R:8:0.15  X:3:0.5  X:8:0.5  X:64:0.15  X:64:0.5  S:0.25

Layout, with ``M`` the mode token (``seq2seq``; ``decoder`` / ``prefix-lm`` concatenate input and target
for one decoder stack, see :mod:`lmforge.objectives.decoder_layout`)::

    R, X   inputs  M  kept tokens with a sentinel per span  </s>     targets  sentinel span ... </s>
    S      inputs  M  prefix  </s>                                  targets  suffix  </s>

The mode tokens are tokens added after the tokenizer's vocabulary, as mBART adds its language ids: [NLU],
[NLG] and [S2S] are ids ``vocab_size``, ``vocab_size + 1`` and ``vocab_size + 2``
(:func:`mode_token_ids`), so the model's embedding grows by three rows; ``lmforge pretrain`` records them in
``OUT/model/mode_tokens.json``.

Example::

    >>> ul2 = UL2(sentinel_ids=list(range(199, 99, -1)), eos_token_id=1, pad_token_id=0, vocab_size=200,
    ...           denoisers=["R:3:0.15", "S:0.25"], proportions=[0.5, 0.5], seed=0)
    >>> mode_token_ids(200)
    {'[NLU]': 200, '[NLG]': 201, '[S2S]': 202}
    >>> batch = ul2([list(range(2, 42))] * 4)
    >>> sorted(set(batch["input_ids"][:, 0].tolist()) - {200, 202})  # every input starts with a mode token
    []
    >>> UL2(sentinel_ids=[99], eos_token_id=1, pad_token_id=0, vocab_size=200, denoisers=["Q:3:0.15"])
    Traceback (most recent call last):
    ...
    lmforge.config.ConfigError: objective_options: denoisers: 'Q:3:0.15' has kind 'Q'; write R:MEAN_SPAN:RATE, X:MEAN_SPAN:RATE or S:RATE
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from lmforge.config import ConfigError
from lmforge.objectives.base import Seeded, as_ids
from lmforge.objectives.decoder_layout import check_layout, layout_batch
from lmforge.objectives.span_corruption import corrupt_spans, random_spans_noise_mask

MODE_TOKENS = ("[NLU]", "[NLG]", "[S2S]")
MODE_OF_KIND = {"R": "[NLU]", "X": "[NLG]", "S": "[S2S]"}
MODE_TOKENS_FILE = "mode_tokens.json"  # {"[NLU]": id, ...}: what a model folder of a UL2 run records
DEFAULT_DENOISERS = ("R:3:0.15", "R:8:0.15", "X:3:0.5", "X:8:0.5", "X:64:0.15", "X:64:0.5", "S:0.25")
_FORMS = "write R:MEAN_SPAN:RATE, X:MEAN_SPAN:RATE or S:RATE"


def mode_token_ids(vocab_size: int) -> dict[str, int]:
    """Mode token -> id: the three tokens follow a tokenizer's ``vocab_size`` ids."""
    return {token: vocab_size + i for i, token in enumerate(MODE_TOKENS)}


@dataclass(frozen=True)
class Denoiser:
    """One denoiser of the mixture: ``kind`` R, X or S, ``rate`` the share of the text that becomes the
    target, ``mean_span`` the mean noise span length (R and X; None for S)."""

    kind: str
    rate: float
    mean_span: float | None = None

    @property
    def mode_token(self) -> str:
        return MODE_OF_KIND[self.kind]

    @classmethod
    def parse(cls, spec) -> "Denoiser":
        """``"R:3:0.15"``, ``"X:64:0.5"`` or ``"S:0.25"`` -> a Denoiser, or a one-line ConfigError."""
        where = f"objective_options: denoisers: {spec!r}"
        parts = str(spec).strip().split(":")
        kind = parts[0].strip().upper()
        if kind not in MODE_OF_KIND:
            raise ConfigError(f"{where} has kind {parts[0]!r}; {_FORMS}")
        if len(parts) != (2 if kind == "S" else 3):
            raise ConfigError(f"{where} has {len(parts)} fields; {_FORMS}")
        try:
            numbers = [float(p) for p in parts[1:]]
        except ValueError:
            raise ConfigError(f"{where}: the span and rate must be numbers; {_FORMS}") from None
        rate = numbers[-1]
        if not 0 < rate < 1:
            raise ConfigError(f"{where}: the rate must be in (0, 1), got {rate:g}")
        if kind == "S":
            return cls("S", rate)
        if numbers[0] < 1:
            raise ConfigError(f"{where}: the mean span must be at least 1, got {numbers[0]:g}")
        return cls(kind, rate, numbers[0])

    def spans_needed(self, length: int) -> int:
        """Sentinels span corruption uses on ``length`` tokens at most: one per span, plus a closing one."""
        num_noise = min(max(int(round(length * self.rate)), 1), max(length - 1, 1))
        return max(int(round(num_noise / self.mean_span)), 1) + 1


def _as_list(value, name: str) -> list:
    if isinstance(value, str):  # "R:3:0.15, S:0.25": one flag value, as --objective-option gives it
        return [v for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(f"objective_options: {name}={value!r} must be a non-empty list")
    return list(value)


class UL2(Seeded):
    """Mixture-of-denoisers collator: raw token sequences -> the batch of :func:`layout_batch` in ``layout``
    (``seq2seq``: encoder ``input_ids``/``attention_mask``, decoder ``labels``/``decoder_input_ids``/...).

    Args:
        sentinel_ids: ids of ``<extra_id_0>``, ``<extra_id_1>``, ... (R and X denoisers), as for span corruption.
        eos_token_id, pad_token_id: closing token of inputs and targets / padding.
        vocab_size: the tokenizer's vocabulary size; the mode tokens get the next three ids.
        decoder_start_token_id: first decoder input; defaults to ``pad_token_id``, as in T5.
        denoisers: list of ``KIND:MEAN_SPAN:RATE`` / ``S:RATE`` (or one comma-separated string); default
            :data:`DEFAULT_DENOISERS`.
        proportions: one non-negative weight per denoiser (normalised); default uniform.
        max_length: the model's input length (``lmforge pretrain`` passes ``seq_len``): refuses a denoiser that
            would need more sentinels than there are on the longest text it will see.
        layout: ``seq2seq``, ``decoder`` or ``prefix-lm``.
        seed: seed of the generator that draws the denoisers and their noise.
    """

    added_tokens = MODE_TOKENS  # tokens after the tokenizer's vocabulary: the model's embedding grows by these

    def __init__(
        self,
        *,
        sentinel_ids: Sequence[int],
        eos_token_id: int,
        pad_token_id: int,
        vocab_size: int,
        decoder_start_token_id: int | None = None,
        denoisers: Sequence[str] | str = DEFAULT_DENOISERS,
        proportions: Sequence[float] | None = None,
        max_length: int | None = None,
        layout: str = "seq2seq",
        seed: int = 0,
    ):
        super().__init__(seed)
        self.layout = check_layout(layout)
        self.denoisers = [Denoiser.parse(d) for d in _as_list(denoisers, "denoisers")]
        if proportions is None:
            proportions = [1.0] * len(self.denoisers)
        proportions = _as_list(proportions, "proportions")
        if len(proportions) != len(self.denoisers):
            raise ConfigError(f"objective_options: proportions has {len(proportions)} weights for "
                              f"{len(self.denoisers)} denoisers; give one per denoiser")
        try:
            weights = torch.tensor([float(p) for p in proportions], dtype=torch.double)
        except (TypeError, ValueError):
            raise ConfigError(f"objective_options: proportions={proportions!r} must be numbers") from None
        if bool((weights < 0).any()) or not bool(torch.isfinite(weights).all()) or float(weights.sum()) <= 0:
            raise ConfigError(f"objective_options: proportions={proportions!r} must be non-negative, "
                              "with a positive sum")
        self.proportions = weights / weights.sum()
        self.sentinel_ids = torch.as_tensor(list(sentinel_ids), dtype=torch.long)
        spans = [d for d in self.denoisers if d.kind != "S"]
        if spans and len(self.sentinel_ids) == 0:
            raise ConfigError("objective_options: denoisers: R and X denoisers need sentinel ids (<extra_id_0>, ...): "
                              "use a tokenizer of family t5")
        if spans and max_length is not None:
            # The text ``lmforge pretrain`` cuts: seq_len less the mode token and EOS, half of it when input and
            # target share one decoder sequence.
            text = (max_length // 2 if self.layout != "seq2seq" else max_length) - 2
            worst = max(spans, key=lambda d: d.spans_needed(text))
            if worst.spans_needed(text) > len(self.sentinel_ids):
                raise ConfigError(
                    f"objective_options: denoisers: '{worst.kind}:{worst.mean_span:g}:{worst.rate:g}' needs up to "
                    f"{worst.spans_needed(text)} sentinels on {text} tokens of text, the tokenizer has "
                    f"{len(self.sentinel_ids)}; lower --seq-len, the rate, or raise the mean span")
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        self.decoder_start_token_id = pad_token_id if decoder_start_token_id is None else decoder_start_token_id
        self.mode_ids = mode_token_ids(vocab_size)

    def choose(self, n: int) -> torch.Tensor:
        """(n,) indices into ``denoisers``, drawn with the mixture's proportions."""
        return torch.multinomial(self.proportions, n, replacement=True, generator=self.generator)

    def corrupt(self, tokens: torch.Tensor, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Denoiser ``index`` applied to one (T,) example: ``(inputs, targets)``, the inputs led by its mode token."""
        d = self.denoisers[index]
        mode = torch.tensor([self.mode_ids[d.mode_token]])
        if d.kind == "S":
            n = len(tokens)
            if n == 0:
                raise ValueError("the S-denoiser needs at least one token")
            mean = max(int(round(d.rate * n)), 1)
            # k uniform on 1 .. 2*mean - 1 (mean: ``mean``), at most n - 1 so the prefix keeps a token.
            k = 1 + int(torch.randint(2 * mean - 1, (), generator=self.generator))
            k = min(k, max(n - 1, 1))
            eos = torch.tensor([self.eos_token_id])
            return torch.cat([mode, tokens[: n - k], eos]), torch.cat([tokens[n - k:], eos])
        mask = random_spans_noise_mask(len(tokens), d.rate, d.mean_span, self.generator)
        source, target = corrupt_spans(tokens, mask, self.sentinel_ids, self.eos_token_id)
        return torch.cat([mode, source]), target

    def __call__(self, examples: Sequence) -> dict[str, torch.Tensor]:
        chosen = self.choose(len(examples)).tolist()
        inputs, targets = [], []
        for x, index in zip(examples, chosen):
            source, target = self.corrupt(as_ids(x), index)
            inputs.append(source)
            targets.append(target)
        return layout_batch(inputs, targets, self.pad_token_id, self.decoder_start_token_id, self.layout)
