"""`PeftConfig`: one flat, plain-data record naming a PEFT method and its options.

Like :class:`~lmforge.config.ModelConfig`, it round-trips through JSON/YAML and :meth:`PeftConfig.validate`
names the field to fix. Each option belongs to some methods; setting one that the chosen method does not
use is an error (``r=4`` with ``method="ia3"`` is a mistake, not a no-op).

    method    trains                                         options
    lora      B A beside chosen linears  (Hu et al. 2021)    r, alpha, dropout, rslora, targets
    qlora     LoRA on an NF4 base (Dettmers et al. 2023)     + nf4_block_size, nf4_scaler_block_size
    adapter   bottleneck after sublayers (Houlsby 2019)      adapter_dim, adapter_activation, targets
    prefix    per-layer K/V prefixes (Li & Liang 2021)       num_virtual_tokens, prefix_projection, prefix_hidden
    prompt    soft prompt embeddings (Lester et al. 2021)    num_virtual_tokens, prompt_init, prompt_init_text
    ia3       rescaling vectors (Liu et al. 2022)            targets
    bitfit    bias terms only (Ben Zaken et al. 2022)        targets
    mam       prefix + parallel FFN adapter (He et al. 2022) num_virtual_tokens, prefix_*, adapter_*, targets

``targets`` are module-name patterns: a pattern matches a module whose dotted name equals it or ends with
``"." + pattern`` (``"q"`` matches ``decoder.layers.3.attn.q`` and ``decoder.layers.3.cross_attn.q``;
``"attn.q"`` only the first). ``"ffn"`` stands for ``ffn.up, ffn.gate, ffn.down`` when linears are
targeted; ``"re:<regex>"`` full-matches the dotted name. ``None`` takes the method's default.

Example:
    >>> cfg = PeftConfig(method="lora", r=4, alpha=8, targets=["q", "v"])
    >>> PeftConfig.from_dict(cfg.to_dict()) == cfg
    True
    >>> PeftConfig(method="ia3", r=4)
    Traceback (most recent call last):
    ...
    lmforge.config.ConfigError: PeftConfig.r=4 is not used by method 'ia3' (it is an option of lora, qlora)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from lmforge.config import ConfigBase, ConfigError
from lmforge.peft.registry import DEFAULT_TARGETS, MERGEABLE, METHODS, option_methods

ADAPTER_ACTIVATIONS = ("relu", "gelu", "tanh", "silu")
PROMPT_INITS = ("vocab", "text", "random")
# Options that only some methods take (each method's file names its own), in the order validate() checks them.
OPTION_ORDER = ("r", "alpha", "dropout", "rslora", "nf4_block_size", "nf4_scaler_block_size", "adapter_dim",
                "adapter_activation", "adapter_scale", "num_virtual_tokens", "prefix_projection", "prefix_hidden",
                "prompt_init", "prompt_init_text", "targets")


@dataclass
class PeftConfig(ConfigBase):
    """A PEFT method and its options; see the module docstring for which options each method takes.

    Field groups:
        lora / qlora: ``r`` rank, ``alpha`` (scaling alpha/r, or alpha/sqrt(r) with ``rslora``,
            Kalajdzievski 2023), ``dropout`` on the LoRA input. QLoRA adds the NF4 ``nf4_block_size``
            (weights per absmax scale) and ``nf4_scaler_block_size`` (scales per second-level scale).
        adapter / mam: ``adapter_dim`` bottleneck width, ``adapter_activation`` f, ``adapter_scale`` s of
            MAM's parallel adapter (He et al. use 4).
        prefix / prompt / mam: ``num_virtual_tokens`` prefix or prompt length; ``prefix_projection``
            trains the prefix through an MLP of width ``prefix_hidden`` (Li & Liang's reparameterisation).
        prompt: ``prompt_init`` ``vocab`` (random vocabulary rows), ``text`` (the embeddings of
            ``prompt_init_text``, repeated to length) or ``random``.
        targets: module-name patterns (see the module docstring); None = the method's default.
    """

    method: str = "lora"
    targets: list[str] | None = None
    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    rslora: bool = False
    nf4_block_size: int = 64
    nf4_scaler_block_size: int = 256
    adapter_dim: int = 64
    adapter_activation: str = "relu"
    adapter_scale: float = 4.0
    num_virtual_tokens: int = 20
    prefix_projection: bool = True
    prefix_hidden: int = 512
    prompt_init: str = "vocab"
    prompt_init_text: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.targets, tuple):
            self.targets = list(self.targets)
        self.validate()

    # ------------------------------------------------------------------ derived
    @property
    def target_patterns(self) -> list[str]:
        """The patterns in effect: ``targets`` or the method's default (empty for prefix/prompt)."""
        if self.targets is not None:
            return list(self.targets)
        return list(DEFAULT_TARGETS.get(self.method, []))

    @property
    def scaling(self) -> float:
        """LoRA's multiplier on B A x: alpha / r, or alpha / sqrt(r) with rsLoRA."""
        return self.alpha / (self.r**0.5 if self.rslora else self.r)

    @property
    def mergeable(self) -> bool:
        return self.method in MERGEABLE

    # ------------------------------------------------------------------ validation
    def validate(self) -> "PeftConfig":
        """Check every field; raise :class:`ConfigError` naming the first bad one."""
        if self.method not in METHODS:
            raise ConfigError(f"PeftConfig.method={self.method!r} is not one of {', '.join(METHODS)}")
        defaults = {f.name: f.default for f in fields(self) if f.default is not dataclasses.MISSING}
        for name, methods in option_methods(OPTION_ORDER).items():
            if self.method not in methods and getattr(self, name) != defaults.get(name):
                raise ConfigError(
                    f"PeftConfig.{name}={getattr(self, name)!r} is not used by method {self.method!r} "
                    f"(it is an option of {', '.join(methods)})"
                )

        def positive(name: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"PeftConfig.{name}={value!r} must be a positive integer")

        for name in ("r", "nf4_block_size", "nf4_scaler_block_size", "adapter_dim", "num_virtual_tokens",
                     "prefix_hidden"):
            positive(name)
        for name in ("alpha", "adapter_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"PeftConfig.{name}={value!r} must be a positive number")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"PeftConfig.dropout={self.dropout!r} must be in [0, 1)")
        if self.nf4_block_size % 2:
            raise ConfigError(f"PeftConfig.nf4_block_size={self.nf4_block_size} must be even (two 4-bit codes a byte)")
        if self.adapter_activation not in ADAPTER_ACTIVATIONS:
            raise ConfigError(
                f"PeftConfig.adapter_activation={self.adapter_activation!r} is not one of "
                f"{', '.join(ADAPTER_ACTIVATIONS)}"
            )
        if self.prompt_init not in PROMPT_INITS:
            raise ConfigError(f"PeftConfig.prompt_init={self.prompt_init!r} is not one of {', '.join(PROMPT_INITS)}")
        if (self.prompt_init == "text") != (self.prompt_init_text is not None):
            raise ConfigError(
                "PeftConfig.prompt_init_text is needed exactly when prompt_init='text' "
                f"(got prompt_init={self.prompt_init!r}, prompt_init_text={self.prompt_init_text!r})"
            )
        if self.prompt_init_text is not None and not self.prompt_init_text.strip():
            raise ConfigError("PeftConfig.prompt_init_text must not be empty")
        if self.targets is not None:
            if not isinstance(self.targets, list) or not self.targets or not all(
                isinstance(t, str) and t for t in self.targets
            ):
                raise ConfigError(f"PeftConfig.targets={self.targets!r} must be a non-empty list of name patterns")
        return self

    # ------------------------------------------------------------------ serialisation
    config_noun = "PeftConfig field(s)"
    config_file_kind = "PEFT config"

    def options(self) -> dict[str, Any]:
        """Only the fields that differ from their defaults (plus ``method``): a compact description."""
        defaults = PeftConfig(method=self.method)
        return {"method": self.method, **{k: v for k, v in self.to_dict().items()
                                          if k != "method" and v != getattr(defaults, k)}}

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "PeftConfig") -> "PeftConfig":
        """Build from a plain dict; unknown keys are an error that names them."""
        return super().from_dict(data, source)
