"""The one wrapper every module-level PEFT method uses, and the routing of batch rows to adapters.

PEFT never forks the model: it swaps a module (``attn.q``, ``ffn.down``, ``ffn``, a norm) for an
:class:`AdaptedModule` that keeps the original as ``.base`` and holds named adapters. An adapter is a
small module called as ``adapter(x, base) -> y``, where ``base`` computes the original module's output,
so each method states its own rule in one line:

    LoRA       base(x) + B(A(dropout(x))) * scaling         (Hu et al. 2021)
    (IA)^3     base(x) * l      or  base(x * l)             (Liu et al. 2022)
    BitFit     base(x) + delta_b                            (Ben Zaken et al. 2022)
    Houlsby    h = base(x);  h + up(f(down(h)))             (Houlsby et al. 2019)
    parallel   base(x) + s * up(f(down(x)))                 (He et al. 2022)

Which adapter runs is decided by a shared :class:`AdapterState`: one active name for the whole batch,
or one name per batch row (a *mixed-adapter batch*). For a mixed batch the wrapper runs each group of
rows through its own adapter and scatters the results back, so every example sees exactly the model it
would see alone. Nested wrappers (a parallel adapter around an FFN whose linears carry LoRA) stay
consistent because the state narrows to the group's rows while the group runs.

Merging never edits the original module: ``merge`` builds a merged copy and routes the merged adapter's
rows to it, so ``unmerge`` is exact (it drops the copy) and the unmerged base stays available to other
adapters.

Example:
    >>> import torch
    >>> from torch import nn
    >>> state = AdapterState()
    >>> layer = AdaptedModule(nn.Linear(4, 3), state)
    >>> class Double(nn.Module):
    ...     def forward(self, x, base):
    ...         return 2 * base(x)
    >>> layer.adapters["twice"] = Double()
    >>> x = torch.randn(2, 4)
    >>> with state.using("twice"):
    ...     torch.allclose(layer(x), 2 * layer.base(x))
    True
    >>> with state.mixed(["twice", None]):
    ...     y = layer(x)
    >>> torch.allclose(y[1], layer.base(x[1]))
    True
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch
from torch import nn


class AdapterState:
    """Which adapter runs: ``active`` for the whole batch, or ``rows`` (one name or None per example).

    Shared by every wrapper of one :class:`~lmforge.peft.model.PeftModel`; plain Python, not a module.
    """

    def __init__(self) -> None:
        self.active: str | None = None
        self.rows: list[str | None] | None = None

    def row_names(self, batch: int) -> list[str | None]:
        """The adapter of each of ``batch`` rows."""
        if self.rows is None:
            return [self.active] * batch
        if len(self.rows) != batch:
            raise ValueError(f"adapter_names has {len(self.rows)} entries but the batch has {batch} rows")
        return list(self.rows)

    @contextlib.contextmanager
    def using(self, name: str | None) -> Iterator[None]:
        """Run with ``name`` active for the whole batch (None: the base model)."""
        saved = self.active, self.rows
        self.active, self.rows = name, None
        try:
            yield
        finally:
            self.active, self.rows = saved

    @contextlib.contextmanager
    def mixed(self, names: list[str | None] | None) -> Iterator[None]:
        """Run with one adapter name per batch row (None: no change)."""
        if names is None:
            yield
            return
        saved = self.rows
        self.rows = list(names)
        try:
            yield
        finally:
            self.rows = saved

    @contextlib.contextmanager
    def subset(self, index: list[int]) -> Iterator[None]:
        """Narrow ``rows`` to the given rows while a group runs (keeps nested wrappers aligned)."""
        saved = self.rows
        if saved is not None:
            self.rows = [saved[i] for i in index]
        try:
            yield
        finally:
            self.rows = saved


def group_rows(names: list[str | None]) -> list[tuple[str | None, list[int]]]:
    """[(name, row indices)] in order of first appearance."""
    groups: dict[str | None, list[int]] = {}
    for i, name in enumerate(names):
        groups.setdefault(name, []).append(i)
    return list(groups.items())


class AdaptedModule(nn.Module):
    """A module (``base``) plus named adapters, routed by a shared :class:`AdapterState`.

    Shapes follow the base module: for a linear, x (B, T, in) -> (B, T, out); a mixed batch needs B
    to equal the number of row names.
    """

    def __init__(self, base: nn.Module, state: AdapterState):
        super().__init__()
        self.base = base
        self.adapters = nn.ModuleDict()
        self.merged_base: nn.Module | None = None  # base with ``merged_name`` folded in
        self.merged_name: str | None = None
        self.state = state

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        rows = self.state.rows
        if rows is None:
            return self._run(self.state.active, x, args, kwargs)
        groups = group_rows(self.state.row_names(x.shape[0]))
        if len(groups) == 1:
            return self._run(groups[0][0], x, args, kwargs)
        out = None
        for name, index in groups:
            idx = torch.tensor(index, device=x.device)
            with self.state.subset(index):
                y = self._run(name, x.index_select(0, idx), args, kwargs)
            out = y.new_zeros((x.shape[0], *y.shape[1:])) if out is None else out
            out = out.index_copy(0, idx, y)  # out of place, so autograd sees every group
        return out

    def _run(self, name: str | None, x: torch.Tensor, args: tuple, kwargs: dict) -> torch.Tensor:
        if name is not None and name == self.merged_name:
            return self.merged_base(x, *args, **kwargs)
        base = functools.partial(self.base, *args, **kwargs) if args or kwargs else self.base
        if name is None or name not in self.adapters:
            return base(x)
        return self.adapters[name](x, base)

    # ------------------------------------------------------------------ merging
    def merge(self, name: str) -> None:
        """Route ``name`` to a merged copy of the base; the original stays untouched."""
        self.merged_base = self.adapters[name].merged(self.base)
        self.merged_base.requires_grad_(False)
        self.merged_name = name

    def unmerge(self) -> None:
        self.merged_base, self.merged_name = None, None

    def extra_repr(self) -> str:
        return f"adapters={list(self.adapters)}" + (f", merged={self.merged_name!r}" if self.merged_name else "")


# ---------------------------------------------------------------------------------------- merge helpers
def dense_weight(module: nn.Module) -> torch.Tensor:
    """The (out, in) weight of a linear in its floating dtype (an NF4 weight is dequantised)."""
    if hasattr(module, "dense_weight"):
        return module.dense_weight()
    return module.weight.detach()


def plain_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """A frozen nn.Linear holding ``weight`` (out, in) and ``bias`` (out,)."""
    out_f, in_f = weight.shape
    layer = nn.Linear(in_f, out_f, bias=bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer.requires_grad_(False)


def features(module: nn.Module) -> tuple[int, int]:
    """(in, out) features of a linear-like module (nn.Linear or NF4Linear)."""
    return module.in_features, module.out_features


def param_dtype(module: nn.Module) -> torch.dtype:
    """Floating dtype for new adapter parameters: the base's own (an NF4 weight reports its original)."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


def param_device(module: nn.Module) -> torch.device:
    for p in module.parameters():
        return p.device
    return torch.device("cpu")
