"""`TrainConfig`: every setting of a pre-training run, as one flat, plain-data record.

The same keys appear in a YAML file (``lmforge pretrain --config run.yaml``), on the command line
(``--max-steps 1000``; dashes and underscores are interchangeable) and in ``OUT/config.yaml``, the copy a run
keeps of what it was started with. The command line overrides the file. Every value is checked, and an error
names the key and where it came from::

    run.yaml: unknown setting 'learning_rate' (did you mean 'lr'?)
    run.yaml: schedule='cosin' is not one of linear, cosine, inverse-sqrt, constant, slanted-triangular

Example:
    >>> cfg = TrainConfig.from_dict({"max_steps": 100, "lr": "3e-4"}, source="run.yaml")
    >>> cfg.lr, cfg.batch_size * cfg.grad_accum
    (0.0003, 8)
    >>> TrainConfig.from_dict({"lr": -1.0}, source="run.yaml")
    Traceback (most recent call last):
    ...
    lmforge.config.ConfigError: run.yaml: lr=-1.0 must be > 0
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from lmforge.config import ConfigBase, ConfigError, underscore_keys
from lmforge.errors import InputFileNotFound, UserInputError
from lmforge.training.seq_len_schedule import check_phase_steps
from lmforge.utils.io import read_mapping_file

SCHEDULES = ("linear", "cosine", "inverse-sqrt", "constant", "slanted-triangular")
PRECISIONS = ("auto", "bf16", "fp32")
DEVICES = ("auto", "cpu", "cuda")
NO_DECAY_KINDS = ("bias", "norm", "embedding")
PRETRAIN_OBJECTIVES = ("mlm", "clm", "prefix-lm", "span-corruption", "denoising", "enc-dec-lm", "bilm", "electra",
                       "mlm+nsp", "mass", "permuted-lm", "unilm", "multilingual-denoising",
                       "ul2")
STRATEGIES = ("auto", "single", "ddp", "fsdp")
FSDP_PARAM_DTYPES = ("auto", "bf16", "fp32")
FSDP_REDUCE_DTYPES = ("fp32", "bf16")
FINAL_CHECKPOINTS = ("full", "weights", "none")


@dataclass
class TrainConfig(ConfigBase):
    """Settings of a pre-training run; see the module docstring for how they are given.

    Field groups:
        what: ``model`` (preset name or model folder), ``objective``, ``tokenizer`` (default: the copy inside
            ``data``), ``data`` (output of ``lmforge data prepare``), ``out`` (run folder), ``overrides``
            (ModelConfig fields, e.g. ``{"n_layers": 2}``), ``objective_options`` (keyword arguments of the
            objective, e.g. ``{"mlm_probability": 0.2}``).
        batch: ``batch_size`` sequences per micro-batch, ``grad_accum`` micro-batches per optimizer step,
            ``seq_len`` model input length (default: the model's ``max_seq_len``), ``max_steps`` optimizer steps,
            ``seq_len_schedule`` several lengths in turn, e.g. ``"128:0.9,512:0.1"`` (BERT: 128 for 90% of the
            steps, then 512; :mod:`lmforge.training.seq_len_schedule`), which excludes ``seq_len``.
        optimizer: AdamW ``lr``, ``betas``, ``eps``, ``weight_decay`` (not applied to the parameter kinds in
            ``no_decay``), ``grad_clip`` (max global L2 norm; 0 = off), ``max_nonfinite_steps`` (stop the run
            when this many optimizer steps in a row have a non-finite loss or gradient norm; 0 = never).
        loss: ``label_smoothing`` eps of the token cross-entropy (Vaswani et al. 2017: 0.1; 0 = off).
        schedule: ``schedule``, ``warmup`` steps, ``min_lr_ratio`` (end of linear/cosine decay, as a share of
            ``lr``), ``cut_frac`` and ``stlr_ratio`` (slanted triangular).
        speed: ``precision``, ``compile``, ``activation_checkpointing``, ``device``, ``num_workers``.
        distributed (see :mod:`lmforge.training.distributed`): ``strategy`` (auto | single | ddp | fsdp; auto is
            ddp under torchrun with several processes), ``fsdp_param_dtype`` (dtype of the all-gathered
            parameters; auto follows ``precision``), ``fsdp_reduce_dtype`` (dtype of the gradient
            reduce-scatter), ``fsdp_cpu_offload`` (keep the sharded parameters, gradients and optimizer state
            in host memory), ``dist_timeout`` (seconds a collective waits for a silent rank, one that hangs or
            whose node is lost, before every rank stops; None: torch's default, 30 min with gloo, 10 min with
            NCCL). ``batch_size`` is per rank: the global batch is batch_size x grad_accum x ranks.
        bookkeeping: ``eval_every``/``eval_batches``, ``save_every``/``keep_checkpoints``, ``final_checkpoint``
            (what a finished run keeps: ``full`` checkpoint, so that ``--resume --max-steps`` extends it exactly;
            ``weights`` without the optimizer state, so that an extension restarts the optimizer; ``none``, only
            the model folder), ``seed``, ``resume``, ``progress`` (tqdm bar), ``tensorboard``.
        price tag (see :mod:`lmforge.training.price_tag`; None = its documented default): ``region`` or
            ``grid_intensity`` (g CO2e/kWh), ``power_watts`` (estimated draw of one device when no counter
            measures it), ``price_per_hour`` (US dollars per device-hour).
    """

    # --- what to train -----------------------------------------------------------------------
    model: str | None = None
    objective: str | None = None
    tokenizer: str | None = None
    data: str | None = None
    out: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    objective_options: dict[str, Any] = field(default_factory=dict)
    # --- batch ---------------------------------------------------------------------------------
    max_steps: int = 1000
    batch_size: int = 8
    grad_accum: int = 1
    seq_len: int | None = None
    seq_len_schedule: str | None = None
    # --- optimizer -----------------------------------------------------------------------------
    lr: float = 3e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    weight_decay: float = 0.01
    no_decay: list[str] = field(default_factory=lambda: list(NO_DECAY_KINDS))
    grad_clip: float = 1.0
    max_nonfinite_steps: int = 3
    label_smoothing: float = 0.0
    # --- schedule ------------------------------------------------------------------------------
    schedule: str = "cosine"
    warmup: int = 0
    min_lr_ratio: float = 0.0
    cut_frac: float = 0.1
    stlr_ratio: float = 32.0
    # --- speed ---------------------------------------------------------------------------------
    precision: str = "auto"
    compile: bool = False
    activation_checkpointing: bool = False
    device: str = "auto"
    num_workers: int = 0
    # --- distributed -------------------------------------------------------------------------------
    strategy: str = "auto"
    fsdp_param_dtype: str = "auto"
    fsdp_reduce_dtype: str = "fp32"
    fsdp_cpu_offload: bool = False
    dist_timeout: float | None = None
    # --- evaluation, checkpoints, logs ------------------------------------------------------------
    eval_every: int = 200
    eval_batches: int = 20
    save_every: int = 500
    keep_checkpoints: int = 3
    final_checkpoint: str = "full"
    seed: int = 0
    resume: bool = False
    progress: bool = True
    tensorboard: bool = True
    # --- price tag -----------------------------------------------------------------------------------
    region: str | None = None
    grid_intensity: float | None = None
    power_watts: float | None = None
    price_per_hour: float | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> "TrainConfig":
        """Build from plain data; keys may use dashes. Unknown keys and bad values raise ConfigError
        naming the key and ``source``."""
        return cls().updated(data, source)

    def updated(self, data: dict[str, Any], source: str = "config") -> "TrainConfig":
        """A validated copy with the keys of ``data`` replaced (``dict`` settings are merged key by key)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: expected a mapping of settings, got {type(data).__name__}")
        hints = typing.get_type_hints(TrainConfig)
        values = self.to_dict()
        for key, value in underscore_keys(data, source).items():
            self.check_keys({key: value}, source)
            value = _coerce(key, value, hints[key], source)
            values[key] = {**values[key], **value} if isinstance(value, dict) else value
        return TrainConfig(**values).validate(source)

    config_noun = "setting"
    quote_keys = True

    # ------------------------------------------------------------------ validation
    def validate(self, source: str = "config") -> "TrainConfig":
        """Check ranges and choices; raise ConfigError naming the first bad key."""

        def bad(key: str, why: str) -> ConfigError:
            return ConfigError(f"{source}: {key}={getattr(self, key)!r} {why}")

        for key in ("max_steps", "batch_size", "grad_accum", "eval_batches", "keep_checkpoints"):
            if getattr(self, key) < 1:
                raise bad(key, "must be >= 1")
        for key in ("warmup", "eval_every", "save_every", "num_workers", "seed", "max_nonfinite_steps"):
            if getattr(self, key) < 0:
                raise bad(key, "must be >= 0")
        if self.seq_len is not None and self.seq_len < 2:
            raise bad("seq_len", "must be >= 2")
        if self.seq_len_schedule is not None:
            if self.seq_len is not None:  # refused, not ranked: which of the two the user meant is a guess
                raise bad("seq_len_schedule", f"gives every phase its length, so seq_len={self.seq_len} must be "
                                              "unset; drop --seq-len (or the schedule)")
            try:
                check_phase_steps(self.seq_len_schedule, self.max_steps)
            except ConfigError as exc:
                raise ConfigError(f"{source}: {exc}") from None
        for key in ("lr", "eps", "stlr_ratio"):
            if not getattr(self, key) > 0:
                raise bad(key, "must be > 0")
        for key in ("weight_decay", "grad_clip"):
            if getattr(self, key) < 0:
                raise bad(key, "must be >= 0")
        if self.dist_timeout is not None and not self.dist_timeout > 0:
            raise bad("dist_timeout", "must be > 0 seconds (or unset: torch's default)")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise bad("min_lr_ratio", "must be in [0, 1]")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise bad("label_smoothing", "must be in [0, 1)")
        if not 0.0 < self.cut_frac < 1.0:
            raise bad("cut_frac", "must be in (0, 1)")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise bad("betas", "must be two numbers in [0, 1), e.g. [0.9, 0.999]")
        unknown = sorted(set(self.no_decay) - set(NO_DECAY_KINDS))
        if unknown:
            raise bad("no_decay", f"lists unknown kind(s) {', '.join(unknown)}; "
                                  f"choose from {', '.join(NO_DECAY_KINDS)}")
        for key, allowed in (("schedule", SCHEDULES), ("precision", PRECISIONS), ("device", DEVICES),
                             ("strategy", STRATEGIES), ("fsdp_param_dtype", FSDP_PARAM_DTYPES),
                             ("fsdp_reduce_dtype", FSDP_REDUCE_DTYPES), ("final_checkpoint", FINAL_CHECKPOINTS)):
            if getattr(self, key) not in allowed:
                raise bad(key, f"is not one of {', '.join(allowed)}")
        if self.objective is not None and self.objective not in PRETRAIN_OBJECTIVES:
            raise bad("objective", f"is not one of {', '.join(PRETRAIN_OBJECTIVES)}")
        if self.warmup >= self.max_steps and self.schedule in ("linear", "cosine"):
            raise bad("warmup", f"must be < max_steps={self.max_steps}, or nothing is left to decay")
        if self.warmup and self.schedule == "slanted-triangular":
            raise bad("warmup", "does not apply to slanted-triangular, whose rise lasts cut_frac * max_steps steps")
        return self

    def require(self, *keys: str, source: str = "config") -> None:
        """Raise ConfigError for the first of ``keys`` that is unset, saying how to set it."""
        for key in keys:
            if getattr(self, key) in (None, ""):
                flag = "--" + key.replace("_", "-")
                raise ConfigError(f"missing required setting {key!r}: pass {flag} or set `{key}:` in {source}")

    # ------------------------------------------------------------------ files
    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        """Read a YAML (or JSON) file of settings; errors name the file."""
        return cls.from_dict(read_settings(path), source=str(path))


def read_settings(path: str | Path) -> dict[str, Any]:
    """The raw mapping in a YAML/JSON settings file (empty file: ``{}``); errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise InputFileNotFound(f"{path}: no such config file")
    try:
        data = read_mapping_file(path, yaml_always=True)
    except UserInputError as exc:
        raise ConfigError(str(exc)) from exc
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings (key: value lines), got {type(data).__name__}")
    return data


def _coerce(key: str, value: Any, hint: Any, source: str) -> Any:
    """``value`` checked against the annotation ``hint`` (int, float, bool, str, list, dict, X | None)."""
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    origin = typing.get_origin(hint) or hint

    def fail(what: str) -> ConfigError:
        return ConfigError(f"{source}: {key}={value!r} must be {what}")

    if origin is bool:
        if not isinstance(value, bool):
            raise fail("true or false")
        return value
    if origin is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("an integer")
        return value
    if origin is float:
        # YAML 1.1 reads `3e-4` (no dot) as a string; accept any number spelled as text.
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise fail("a number") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail("a number")
        return float(value)
    if origin is str:
        if not isinstance(value, (str, Path)):
            raise fail("a string")
        return str(value)
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise fail("a list")
        (item,) = typing.get_args(hint)
        return [_coerce(f"{key}[{i}]", v, item, source) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise fail("a mapping of key: value")
        return {str(k): v for k, v in value.items()}
    raise TypeError(f"TrainConfig.{key}: unsupported annotation {hint!r}")  # a bug here, not user input


def setting_names() -> list[str]:
    """All TrainConfig keys, in declaration order."""
    return [f.name for f in fields(TrainConfig)]
