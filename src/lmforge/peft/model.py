"""PeftModel: a frozen base model with named adapters, switching, mixed-adapter batches and merging.

    base Transformer ──apply_peft(cfg)──► PeftModel
        modules swapped for AdaptedModule (LoRA, QLoRA, IA3, BitFit, Houlsby, MAM's parallel adapter)
        stack pre-hooks pre-fill the KV cache  (prefix tuning, MAM's prefix)
        forward prepends a soft prompt         (prompt tuning)

The model code never learns about PEFT: adapters live in wrapped modules, stack hooks and this wrapper.
A PeftModel keeps the base model's forward contract (``out = model(input_ids, ..., labels=...)``) plus
``adapter_names=[...]`` for a mixed-adapter batch, in which each row runs through its own adapter (or the
base model, for None). Several adapters attach to one base by name; ``set_adapter`` switches, and only the
active adapter trains. ``disable_adapters()`` gives the base model back for a block of code.

Example:
    >>> import torch, lmforge
    >>> from lmforge.peft import PeftConfig, apply_peft
    >>> model = apply_peft(lmforge.build_model("gpt-tiny", n_layers=2), PeftConfig(method="lora", r=4), name="a")
    >>> model.add_adapter("b", PeftConfig(method="prefix", num_virtual_tokens=3, prefix_hidden=16))
    >>> ids = torch.randint(0, 8192, (2, 6))
    >>> model(ids, adapter_names=["a", "b"]).logits.shape     # row 0 uses LoRA, row 1 the prefix
    torch.Size([2, 6, 8192])
    >>> model.set_adapter("a")                                  # train LoRA "a" (only)
    >>> print(model.parameter_report())
    trainable params: 12,288 || all params: 6,839,440 || trainable%: 0.1797
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from lmforge.config import ConfigError
from lmforge.errors import UserInputError
from lmforge.generation import generate
from lmforge.peft.bitfit import merge_needs_bias
from lmforge.peft.config import PeftConfig
from lmforge.peft.io import (
    ADAPTER_WEIGHTS,
    base_identity,
    read_adapter_config,
    read_adapter_tensors,
    save_adapter,
    verify_base,
)
from lmforge.peft.layer import AdaptedModule, AdapterState
from lmforge.peft.nf4 import NF4Linear
from lmforge.peft.prompt import prepare, prepare_encode, remember, strip
from lmforge.peft.registry import MERGEABLE, REGISTRY
from lmforge.peft.targets import logical_name


@dataclass
class ParameterReport:
    """Trainable and total parameters (tied weights once; NF4 weights by their element count)."""

    trainable: int
    total: int
    per_adapter: dict[str, int] = field(default_factory=dict)

    @property
    def percent(self) -> float:
        return 100.0 * self.trainable / max(self.total, 1)

    def __str__(self) -> str:
        return f"trainable params: {self.trainable:,} || all params: {self.total:,} || trainable%: {self.percent:.4f}"


class PeftModel(nn.Module):
    """A base lmforge Transformer with PEFT adapters; build it with :func:`apply_peft`.

    Attributes:
        base_model: the Transformer (its own parameters frozen; some modules wrapped).
        peft_configs: adapter name -> :class:`PeftConfig`.
        base_identity: name, config hash and weight checksum of the base as it was before any change
            (recorded in saved adapters, checked when loading one).
    """

    def __init__(self, base_model: nn.Module):
        super().__init__()
        if isinstance(base_model, PeftModel):
            raise TypeError("base_model is already a PeftModel; use add_adapter() to attach another adapter")
        self.base_identity = base_identity(base_model)  # before quantisation or merging can change it
        self.base_model = base_model.requires_grad_(False)
        self.prefixes = nn.ModuleDict()
        self.prompts = nn.ModuleDict()
        self.peft_configs: dict[str, PeftConfig] = {}
        self.state = AdapterState()
        self.quantized = False
        self.prefix_hooks: list = []
        self.prompt_caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # KV cache -> prompt length
        self.merged_name: str | None = None
        self.unloaded = False

    # ------------------------------------------------------------------ delegation
    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "save":
                raise AttributeError("PeftModel has no save(): use save_adapter(path) for the adapter, or "
                                     "merge_and_unload().save(path) for a plain merged model") from None
            # config, num_parameters(), flops_per_token(), ... come from the base model
            return getattr(super().__getattr__("base_model"), name)

    # ------------------------------------------------------------------ adapters
    @property
    def active_adapter(self) -> str | None:
        return self.state.active

    @property
    def adapters(self) -> list[str]:
        return list(self.peft_configs)

    def wrap(self, path: str) -> AdaptedModule:
        """The :class:`AdaptedModule` at ``path`` in the base model, wrapping the module there if needed."""
        module = self.base_model.get_submodule(path)
        if isinstance(module, AdaptedModule):
            return module
        parent_name, _, leaf = path.rpartition(".")
        wrapper = AdaptedModule(module, self.state)
        setattr(self.base_model.get_submodule(parent_name), leaf, wrapper)
        return wrapper

    def wrappers(self) -> Iterator[tuple[str, AdaptedModule]]:
        """(path, wrapper) for every wrapped module, outermost first."""
        for name, module in self.base_model.named_modules():
            if isinstance(module, AdaptedModule):
                yield name, module

    def add_adapter(self, name: str, cfg: PeftConfig, tokenizer=None, activate: bool = True) -> None:
        """Attach adapter ``name`` (its base parameters stay frozen) and, by default, make it active.

        Args:
            name: a new adapter name (letters, digits, ``_`` and ``-``).
            cfg: the method and its options.
            tokenizer: needed only for ``prompt_init='text'``.
            activate: make it the active (and only trainable) adapter.
        """
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(f"adapter name {name!r} must be non-empty letters, digits, '_' or '-'")
        if name in self.peft_configs:
            raise ConfigError(f"an adapter named {name!r} is already attached (attached: {', '.join(self.adapters)})")
        if self.unloaded:
            raise RuntimeError("this PeftModel was unloaded by merge_and_unload(); apply_peft() to the result instead")
        if cfg.method == "qlora" and not self.quantized and self.peft_configs:
            raise ConfigError("QLoRA quantises the base model, so it must be the first adapter attached "
                              f"(attached already: {', '.join(self.adapters)})")
        if self.merged_name is not None:
            raise RuntimeError(f"adapter {self.merged_name!r} is merged; unmerge() before adding adapters")
        REGISTRY[cfg.method].attach(self, name, cfg, tokenizer=tokenizer)
        self.peft_configs[name] = cfg
        for p in self.adapter_parameters(name).values():
            p.requires_grad_(False)
        if activate:
            self.set_adapter(name)

    def delete_adapter(self, name: str) -> None:
        self._check(name)
        if self.merged_name == name:
            self.unmerge()
        for _, layer in self.wrappers():
            if name in layer.adapters:
                del layer.adapters[name]
        for table in (self.prefixes, self.prompts):
            if name in table:
                del table[name]
        del self.peft_configs[name]
        if self.state.active == name:
            self.state.active = None

    def set_adapter(self, name: str | None) -> None:
        """Make ``name`` the adapter every row uses (None: the base model) and the only trainable one."""
        if name is not None:
            self._check(name)
        self.state.active = name
        self.set_trainable([name] if name is not None else [])

    def set_trainable(self, names: list[str]) -> None:
        """Train exactly the adapters in ``names`` (e.g. every adapter of a mixed-adapter batch)."""
        for n in names:
            self._check(n)
        for n in self.peft_configs:
            for p in self.adapter_parameters(n).values():
                p.requires_grad_(n in names)

    @contextlib.contextmanager
    def disable_adapters(self) -> Iterator[None]:
        """Run the plain base model inside the block."""
        with self.state.using(None):
            yield

    def _check(self, name: str | None) -> None:
        if name is not None and name not in self.peft_configs:
            raise KeyError(f"no adapter named {name!r} (attached: {', '.join(self.adapters) or 'none'})")

    # ------------------------------------------------------------------ parameters
    def adapter_parameters(self, name: str) -> dict[str, nn.Parameter]:
        """Adapter ``name``'s parameters by file key: ``<module path>.<param>``, ``prefix.*``, ``prompt.*``."""
        params: dict[str, nn.Parameter] = {}
        for path, layer in self.wrappers():
            if name in layer.adapters:
                key = logical_name(path)  # independent of what other adapters wrap around this layer
                params.update({f"{key}.{k}": p for k, p in layer.adapters[name].named_parameters()})
        for tag, table in (("prefix", self.prefixes), ("prompt", self.prompts)):
            if name in table:
                params.update({f"{tag}.{k}": p for k, p in table[name].named_parameters()})
        return params

    def adapter_state_dict(self, name: str | None = None) -> dict[str, torch.Tensor]:
        """Detached copies of adapter ``name``'s tensors (default: the active adapter)."""
        name = self._name(name)
        return {k: p.detach().clone() for k, p in self.adapter_parameters(name).items()}

    def load_adapter_state_dict(self, tensors: dict[str, torch.Tensor], name: str | None = None,
                                source: str = "state dict") -> None:
        """Copy ``tensors`` into adapter ``name``; every key must be present, known and of the right shape."""
        name = self._name(name)
        params = self.adapter_parameters(name)
        missing, unexpected = sorted(set(params) - set(tensors)), sorted(set(tensors) - set(params))
        if missing or unexpected:
            parts = [f"{what} {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
                     for what, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
            raise UserInputError(f"{source}: does not fit adapter {name!r} ({self.peft_configs[name].method}): "
                                 + "; ".join(parts))
        with torch.no_grad():
            for key, p in params.items():
                t = tensors[key]
                if tuple(t.shape) != tuple(p.shape):
                    raise UserInputError(f"{source}: tensor {key!r} has shape {tuple(t.shape)}, "
                                         f"adapter {name!r} needs {tuple(p.shape)}")
                p.copy_(t)

    def parameter_report(self) -> ParameterReport:
        """Trainable vs total parameters of the whole model, and the size of each adapter."""
        unique = {id(p): p for p in self.parameters()}.values()
        per = {n: sum(p.numel() for p in self.adapter_parameters(n).values()) for n in self.peft_configs}
        return ParameterReport(sum(p.numel() for p in unique if p.requires_grad), sum(p.numel() for p in unique), per)

    def _name(self, name: str | None) -> str:
        name = self.state.active if name is None else name
        if name is None:
            raise ValueError("no adapter is active; name one")
        self._check(name)
        return name

    # ------------------------------------------------------------------ forward
    def forward(self, *args, adapter_names: list[str | None] | None = None, **kwargs):
        """The base model's forward (see lmforge.models.transformer), with the adapters applied.

        Args:
            adapter_names: one adapter name (or None for the base model) per batch row: a mixed-adapter
                batch. Default: the active adapter for every row.
        """
        if self.unloaded:
            raise RuntimeError("this PeftModel was unloaded by merge_and_unload(); use the returned model")
        with self.state.mixed(self._rows(adapter_names)):
            soft = self._prompt(adapter_names)
            if soft is None:
                return self.base_model(*args, **kwargs)
            a = inspect.signature(self.base_model.forward).bind(*args, **kwargs).arguments
            n_prompt = prepare(self.base_model, a, soft, self.prompt_caches)
            out = self.base_model(**a)
            remember(out, n_prompt, self.prompt_caches)
            return strip(out, n_prompt)

    def encode(self, *args, adapter_names: list[str | None] | None = None, **kwargs):
        """``Transformer.encode`` with the adapters applied; a soft prompt stays in the returned states,
        because the decoder attends to it (pass the states back as ``encoder_hidden_states``)."""
        with self.state.mixed(self._rows(adapter_names)):
            soft = self._prompt(adapter_names)
            if soft is None:
                return self.base_model.encode(*args, **kwargs)
            a = inspect.signature(self.base_model.encode).bind(*args, **kwargs).arguments
            prepare_encode(self.base_model, a, soft)
            return self.base_model.encode(**a)

    def generate(self, *args, **kwargs):
        """Generation with the active adapter; see :func:`lmforge.generation.generate` (same arguments,
        without ``model``). For a mixed-adapter batch, wrap the call in ``with model.state.mixed(names):``."""
        return generate(self, *args, **kwargs)

    def _rows(self, names: list[str | None] | None) -> list[str | None] | None:
        if names is not None:
            for n in set(names):
                self._check(n)
        return None if names is None else list(names)

    def _prompt(self, names: list[str | None] | None) -> torch.Tensor | None:
        rows = names if names is not None else [self.state.active]
        used = {n for n in rows if n in self.prompts}
        if not used:
            return None
        if len(set(rows)) > 1:
            raise ValueError(f"prompt tuning adapters ({', '.join(sorted(used))}) cannot share a mixed-adapter "
                             "batch: their prompts change the sequence length; run them as separate batches")
        return self.prompts[used.pop()].embedding

    # ------------------------------------------------------------------ merging
    def merge(self, name: str | None = None) -> None:
        """Fold adapter ``name`` (LoRA, QLoRA, IA3, BitFit) into merged copies of its layers.

        Rows using ``name`` then run the merged layers; ``unmerge()`` restores the exact original state.
        """
        name = self._name(name)
        self._mergeable(name)
        self.unmerge()
        for _, layer in self.wrappers():
            if name in layer.adapters:
                layer.merge(name)
        self.merged_name = name

    def _mergeable(self, name: str) -> PeftConfig:
        """Adapter ``name``'s config; ValueError if its method does not fold into the weights."""
        cfg = self.peft_configs[name]
        if not cfg.mergeable:
            raise UserInputError(f"adapter {name!r} ({cfg.method}) cannot be merged: only {', '.join(MERGEABLE[:-1])} "
                                 f"and {MERGEABLE[-1]} fold into the weights")
        return cfg

    def unmerge(self) -> None:
        for _, layer in self.wrappers():
            layer.unmerge()
        self.merged_name = None

    def merge_and_unload(self, name: str | None = None) -> nn.Module:
        """A plain Transformer with adapter ``name`` merged in (NF4 weights dequantised).

        The base model is modified in place and returned; this PeftModel cannot be used afterwards.
        """
        name = self._name(name)
        cfg = self._mergeable(name)
        if cfg.method == "bitfit" and (missing := merge_needs_bias(self, name)):
            raise UserInputError(f"adapter {name!r} (bitfit) adds biases to layers the base model has none for "
                                 f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}); a plain model "
                                 "of this config cannot hold them")
        self.unmerge()
        base = self.base_model
        for path, layer in reversed(list(self.wrappers())):  # innermost first: outer paths stay valid
            module = layer.adapters[name].merged(layer.base) if name in layer.adapters else layer.base
            parent, _, leaf = path.rpartition(".")
            setattr(base.get_submodule(parent), leaf, module)
        for path, module in list(base.named_modules()):
            if isinstance(module, NF4Linear):
                parent, _, leaf = path.rpartition(".")
                setattr(base.get_submodule(parent), leaf, module.dequantized())
        for handle in self.prefix_hooks:
            handle.remove()
        self.prefix_hooks.clear()
        self.unloaded = True
        return base.requires_grad_(True)

    def fold_prefix(self, name: str | None = None) -> None:
        """Replace prefix ``name``'s reparameterisation MLP by the prefix it computes (for inference)."""
        name = self._name(name)
        if name not in self.prefixes:
            raise ValueError(f"adapter {name!r} ({self.peft_configs[name].method}) has no prefix to fold")
        trainable = any(p.requires_grad for p in self.prefixes[name].parameters())
        self.prefixes[name].fold()
        self.prefixes[name].requires_grad_(trainable)
        self.peft_configs[name] = self.peft_configs[name].replace(prefix_projection=False)

    # ------------------------------------------------------------------ files
    def save_adapter(self, path: str | Path, name: str | None = None, fold_prefix: bool = True) -> Path:
        """Write ``adapter_config.json`` + ``adapter.safetensors`` for adapter ``name``; see lmforge.peft.io."""
        return save_adapter(self, path, name, fold_prefix=fold_prefix)


def apply_peft(model: nn.Module, cfg: PeftConfig, name: str = "default", tokenizer=None) -> PeftModel:
    """Attach a PEFT adapter to ``model`` and return the PeftModel (the adapter active and trainable).

    Args:
        model: an lmforge Transformer (wrapped into a new PeftModel), or a PeftModel (adapter added).
        cfg: the method and its options.
        name: the adapter's name.
        tokenizer: needed only for prompt tuning initialised from a text.

    Example:
        >>> import lmforge
        >>> model = apply_peft(lmforge.build_model("bert-tiny", n_layers=1), PeftConfig(method="ia3"))
        >>> model.active_adapter, [n for n, p in model.named_parameters() if p.requires_grad][:1]
        ('default', ['base_model.encoder.layers.0.attn.k.adapters.default.scale'])
    """
    peft_model = model if isinstance(model, PeftModel) else PeftModel(model)
    peft_model.add_adapter(name, cfg, tokenizer=tokenizer)
    return peft_model


def load_adapter(model, path: str | Path, name: str | None = None, check_base: bool = True, activate: bool = True,
                 verify: bool | None = None):
    """Attach the adapter saved in folder ``path`` (see :mod:`lmforge.peft.io`) to ``model``; return the PeftModel.

    Args:
        model: the base Transformer it was trained on, or a PeftModel built on that base.
        name: the name to attach it under (default: the saved name).
        check_base: also verify the base weights' checksum (the architecture is always checked).
        activate: make it the active adapter.
        verify: check the folder's ``manifest.json`` (default: yes, unless ``--no-verify``).

    Raises:
        AdapterMismatchError: the base differs from the adapter's; the message says how.
    """
    path = Path(path)
    meta, cfg = read_adapter_config(path)
    peft_model = model if isinstance(model, PeftModel) else PeftModel(model)
    verify_base(meta.get("base", {}), peft_model.base_identity, str(path), check_base)
    tensors = read_adapter_tensors(path, verify)
    name = name or meta.get("name") or "default"
    # The initialisation is overwritten by the stored tensors, so a text-initialised prompt needs no tokenizer.
    build = cfg.replace(prompt_init="random", prompt_init_text=None) if cfg.method == "prompt" else cfg
    peft_model.add_adapter(name, build, activate=activate)
    peft_model.peft_configs[name] = cfg
    peft_model.load_adapter_state_dict(tensors, name, source=str(path / ADAPTER_WEIGHTS))
    return peft_model


def peft_state_dict(model: PeftModel, name: str | None = None) -> dict[str, torch.Tensor]:
    """The trainable state of adapter ``name`` (default: active), for trainer checkpoints.

    Unlike :meth:`PeftModel.save_adapter` it keeps a prefix's reparameterisation MLP, so training can resume.
    """
    return model.adapter_state_dict(name)


def load_peft_state_dict(model: PeftModel, state: dict[str, torch.Tensor], name: str | None = None) -> None:
    """Restore what :func:`peft_state_dict` returned (strict: keys and shapes must match)."""
    model.load_adapter_state_dict(state, name)
