"""What a Hugging Face family declaration is made of: tensor rules (:class:`Rule`), HF classes
(:class:`Arch`), the :class:`Family` itself, the :class:`HFConfig` reader, and the :class:`Mapper` that
resolves tensor names through a rule table.

The family modules (``hf_bert``, ``hf_gpt2``, ``hf_t5``, ``hf_bart``, ``hf_llama``, ``hf_deberta``) import only
this module; the conversion engine (:mod:`lmforge.interop.hf`) imports them and applies their tables.

Example:
    >>> Mapper([Rule("decoder.layers.{i}.attn.q", "h.{i}.attn.q_proj")])("decoder.layers.3.attn.q.weight")[1]
    'h.3.attn.q_proj.weight'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

import torch

from lmforge.config import ModelConfig
from lmforge.errors import LmforgeError

# HF activation names <-> ModelConfig.activation. gelu_new and gelu_pytorch_tanh are both the tanh
# approximation (GPT-2, T5 v1.1); "gelu" is the exact erf form (BERT, BART).
ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu-tanh", "gelu_pytorch_tanh": "gelu-tanh", "relu": "relu",
               "silu": "silu", "swish": "silu"}
HF_ACTIVATION = {"gelu": "gelu", "gelu-tanh": "gelu_new", "relu": "relu", "silu": "silu"}
GATED = {"gelu": "geglu", "gelu-tanh": "geglu-tanh", "relu": "reglu", "silu": "swiglu"}



class HFConversionError(LmforgeError, ValueError):
    """A Hugging Face folder or model cannot be converted; the message names the file, field or tensor."""


@dataclass(frozen=True)
class Rule:
    """One lmforge tensor (or module: its ``.weight``/``.bias`` follow) and where HF keeps it.

    Args:
        ours: lmforge name, ``{i}`` for a layer index, e.g. ``"decoder.layers.{i}.attn.o"``.
        theirs: HF name relative to the base model (head rules, ``lm_head*``/``mlm_head*``/``rtd_head*``/``nsp_head*``, are
            top level).
        conv1d: HF stores the weight as (in, out) (GPT-2's Conv1D), so it is transposed.
        part: ``(k, n)``: ours is the k-th of n equal row blocks of theirs (GPT-2's fused q/k/v).
        flat: HF stores our (N,) vector as a (1, N) row (BART's ``final_logits_bias``).
        experts: ours stacks one HF tensor per expert along a new first dimension: ``theirs`` names expert
            ``e``'s with ``{e}`` (``experts.{e}.w1.weight``), and the other options apply to each of them.
    """

    ours: str
    theirs: str
    conv1d: bool = False
    part: tuple[int, int] | None = None
    flat: bool = False
    experts: bool = False

    @property
    def top_level(self) -> bool:
        return self.ours.startswith(("lm_head", "mlm_head", "rtd_head", "nsp_head"))

    def hf_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        shape = tuple(shape)
        if self.part:
            shape = (shape[0] * self.part[1], *shape[1:])
        if self.conv1d and len(shape) == 2:
            shape = shape[::-1]
        return (1, *shape) if self.flat else shape

    def to_ours(self, t: torch.Tensor) -> torch.Tensor:
        if self.flat:
            t = t.reshape(-1)
        if self.conv1d and t.dim() == 2:
            t = t.t()
        if self.part:
            t = t.chunk(self.part[1], dim=0)[self.part[0]]
        return t

    def to_theirs(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """Our tensor(s) (all parts, in order) -> the HF tensor."""
        t = torch.cat(parts, dim=0) if self.part else parts[0]
        if self.conv1d and t.dim() == 2:
            t = t.t()
        return (t.unsqueeze(0) if self.flat else t).contiguous()


def attention_rules(ours: str, theirs: str, names: tuple[str, str, str, str] = ("q", "k", "v", "o")) -> list[Rule]:
    """The four projections of one attention module: our q/k/v/o <-> ``theirs.<names>``."""
    return [Rule(f"{ours}.{a}", f"{theirs}.{b}") for a, b in zip("qkvo", names)]


@dataclass(frozen=True)
class Arch:
    """One HF class of a family, e.g. ``BertForMaskedLM``.

    Args:
        head: the lmforge head it maps to (``lm``, ``mlm``, ``rtd`` or ``none``).
        prefixed: its state dict nests the body under the family prefix (``bert.``, ``model.``).
        optional: ``(ModelConfig bool field, HF tensor)``: the field is True exactly when the checkpoint
            holds the tensor (BERT's pooler; BART's ``final_logits_bias``, which is zero unless trained).
        task: prefix of task-head tensors kept aside in ``head.safetensors`` (e.g. ``"classifier."``).
    """

    head: str = "none"
    prefixed: bool = False
    optional: tuple[tuple[str, str], ...] = ()
    task: str | None = None


@dataclass(frozen=True)
class Family:
    """Everything one HF ``model_type`` needs; see the family modules.

    Args:
        model_type: HF ``model_type``.
        architectures: HF class name -> :class:`Arch`; the first one is the default.
        config_from_hf: (:class:`HFConfig`, Arch) -> ModelConfig fields (head, tying, special tokens and
            ``optional`` fields are filled in by this module).
        config_to_hf: ModelConfig -> HF config fields (``model_type``, tying and tokens are added here).
        rules: ModelConfig -> list of :class:`Rule` covering every lmforge tensor.
        prefix: where head classes nest the body (``"bert."``); stripped when reading any checkpoint.
        embedding: HF name of the input embedding (relative to the body).
        output_embedding: top-level HF name of the output matrix; equal to ``embedding`` when tied.
        aliases: ``(name, same_as)``: tensors HF stores twice; both copies must agree.
        ignore: regexes of HF buffers that carry no weights (causal masks, RoPE frequencies, ...).
        renames: ``(regex, replacement)`` applied to HF names when reading, for a class that stores the same
            tensors under other names (DeBERTa's two MLM head layouts); rules use the replaced names.
        tokenizer_family: lmforge tokenizer family of its tokenizers.
        tie_default: HF default of ``tie_word_embeddings``.
        unfuse: turns the tensors of a layout HF keeps in memory only into those it saves (transformers 5 holds
            Mixtral's experts fused, and saves them one by one), before anything else reads them.
    """

    model_type: str
    architectures: dict[str, Arch]
    config_from_hf: Callable[["HFConfig", Arch], dict[str, Any]]
    config_to_hf: Callable[[ModelConfig], dict[str, Any]]
    rules: Callable[[ModelConfig], list[Rule]]
    prefix: str = ""
    embedding: str = ""
    output_embedding: str | None = None
    aliases: tuple[tuple[str, str], ...] = ()
    ignore: tuple[str, ...] = ()
    renames: tuple[tuple[str, str], ...] = ()
    tokenizer_family: str | None = None
    tie_default: bool = True
    unfuse: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None

    def arch_for(self, cfg: ModelConfig, task: str | None = None) -> str | None:
        """The HF class to write for ``cfg`` (or the task head's class), or None if there is none."""
        if task is not None:
            return task if task in self.architectures and self.architectures[task].head == cfg.head else None
        # The first class with cfg's head that holds every optional tensor cfg has (BERT + NSP head:
        # BertForPreTraining, not BertForMaskedLM).
        wanted = {f for a in self.architectures.values() for f, _ in a.optional if getattr(cfg, f)}
        return next((n for n, a in self.architectures.items() if a.head == cfg.head and a.task is None
                     and wanted <= {f for f, _ in a.optional}), None)


class HFConfig:
    """An HF ``config.json`` being read: lookups with the HF default, and errors that name the field."""

    def __init__(self, data: dict[str, Any], source: str):
        self.data, self.source = data, source
        self.notes: list[str] = []

    def __call__(self, key: str, default: Any = ...) -> Any:
        value = self.data.get(key, default)
        if value is ...:
            raise HFConversionError(f"{self.source}: field {key!r} is missing")
        return value

    def fail(self, message: str) -> HFConversionError:
        return HFConversionError(f"{self.source}: {message}")

    def require(self, key: str, allowed: tuple, default: Any = None) -> Any:
        """The value of ``key``, which must be one of ``allowed`` (HF features lmforge has no twin for)."""
        value = self.data.get(key, default)
        if value not in allowed:
            raise self.fail(f"{key} {value!r} is not supported (supported: {', '.join(map(repr, allowed))})")
        return value

    def same(self, key: str, other: str, default: Any = ...) -> Any:
        """``key`` and ``other`` must agree (lmforge uses one value where HF allows two)."""
        a, b = self(key, default), self(other, default)
        if a != b:
            raise self.fail(f"{key}={a!r} differs from {other}={b!r}; lmforge uses one value for both")
        return a

    def activation(self, key: str, default: Any = ..., gated: bool = False) -> str:
        name = self(key, default)
        if name not in ACTIVATIONS:
            raise self.fail(f"{key} {name!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
        return GATED[ACTIVATIONS[name]] if gated else ACTIVATIONS[name]


def hf_activation(activation: str) -> str:
    """ModelConfig activation (plain, or the gate's function of a gated one) -> HF name."""
    base = {v: k for k, v in GATED.items()}.get(activation, activation)
    if base not in HF_ACTIVATION:
        raise HFConversionError(f"ModelConfig.activation={activation!r} has no Hugging Face counterpart in this family "
                                f"(supported: {', '.join(HF_ACTIVATION)} and their gated forms)")
    return HF_ACTIVATION[base]


class Mapper:
    """Resolves lmforge tensor names to (rule, HF name) through a family's rule table."""

    def __init__(self, rules: list[Rule]):
        self.compiled = []
        for rule in rules:
            pattern = re.escape(rule.ours).replace(r"\{i\}", r"(?P<i>\d+)")
            self.compiled.append((re.compile(pattern + r"(?P<leaf>\..+)?"), rule))

    def __call__(self, name: str) -> tuple[Rule, str]:
        for pattern, rule in self.compiled:
            m = pattern.fullmatch(name)
            if m:
                theirs = rule.theirs.replace("{i}", m["i"]) if "{i}" in rule.theirs else rule.theirs
                return rule, theirs + (m["leaf"] or "")
        raise HFConversionError(f"lmforge tensor {name!r} has no Hugging Face counterpart in this family")
