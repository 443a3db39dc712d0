"""Mixture-of-experts feed-forward layer: a router sends each token to ``k`` of ``E`` expert FFNs.

Sparse MoE (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021; Mixtral 2024)
grows the parameter count ``E``-fold while each token still multiplies only ``k`` experts' weights::

    logits = x W_r                      (B, T, E)   router, computed in fp32 ("selective precision")
    p      = softmax(logits)            (B, T, E)   over all experts
    g, e   = top_k(p)                   (B, T, k)   gate values and expert ids
    g      = g / sum(g)                 renormalised when ``moe_renormalize`` (Mixtral, GShard: softmax over all
                                        experts, then top-k, then renormalise); Switch (k = 1) keeps the raw
                                        top-1 probability, so the router gets a gradient from the task loss
    y_t    = sum_j g_tj * FFN_{e_tj}(x_t)   (+ shared experts' FFN(x_t), DeepSeekMoE)

Capacity. Each sequence is a routing group of ``T`` tokens. With ``moe_capacity_factor`` c, an expert takes at
most ``C = ceil(c * T * k / E)`` of a sequence's token slots (``moe_expert_capacity`` fixes C instead, as HF
Switch's ``expert_capacity`` does). Slots are served first come, first served: all first choices in sequence
order, then all second choices (GShard), so whether token t is dropped depends on tokens <= t only. A dropped
slot contributes nothing: a token whose every slot is dropped passes through the residual connection only.
Dropping applies in evaluation too (as in HF Switch), and padding takes capacity like any token. The groups are
those of one forward call: cached decoding routes each new token on its own (never over capacity), so it equals
the full forward exactly when that drops nothing. Neither setting: no limit (dropless, Mixtral).

Auxiliary losses (averaged over the model's MoE layers, so the coefficients do not scale with depth):

    load balance (Switch eq. 4)   L_aux = E * sum_e f_e * P_e
        f_e = share of the B*T*k routed slots that chose expert e (before capacity; sum_e f_e = 1)
        P_e = mean router probability of expert e over the B*T tokens
        A uniform router (P_e = 1/E) gives exactly 1 whatever f is, as does perfectly balanced routing
        (f_e = P_e = 1/E); collapse onto one expert drives it towards E. (It can dip slightly below 1 when the
        experts chosen most often are not those with the highest mean probability.)
    router z-loss (ST-MoE)        L_z = mean_t logsumexp(logits_t)^2

HF Mixtral normalises f by the tokens rather than the slots (its f sums to k), so its ``router_aux_loss_coef``
is ours divided by k; both count padding as HF Switch does (HF Mixtral skips it when given a mask).

Experts run as one grouped computation, not a loop over experts: the slots are sorted by expert and a grouped
GEMM (``torch.nn.functional.grouped_mm``, on CPU in fp32/bf16 and on CUDA in bf16) multiplies each expert's
rows by its (E, out, in) weights; elsewhere (fp64, fp32 on CUDA) a padded (E, C, D) batch goes through
``torch.bmm``. Weights are stored (E, out, in), like a stack of ``nn.Linear`` weights (and HF Mixtral).

On the CPU in bf16/fp16 each group is first rounded up to a multiple of ``ROW_BLOCK`` rows with zero rows (their
number depends on the shapes only, at most ``E * (ROW_BLOCK - 1)``): those GEMMs build a kernel for each new shape,
and an expert's share of the tokens changes with every step. The padding rows are computed, dropped, and get no
gradient.

Example:
    >>> import torch
    >>> moe = MoEFeedForward(16, 32, "swiglu", n_experts=4, top_k=2)
    >>> y = moe(torch.randn(2, 5, 16))
    >>> y.shape, moe.last_load.sum().item()   # (B, T, D); 2 * 5 tokens * 2 slots routed
    (torch.Size([2, 5, 16]), 20.0)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.config import GATED_ACTIVATIONS
from lmforge.nn.compile_disable import compile_disable
from lmforge.nn.activations import activation_fn
from lmforge.nn.dropout import dropout
from lmforge.nn.ffn import FeedForward


def expert_capacity(tokens: int, top_k: int, n_experts: int, factor: float | None,
                    fixed: int | None = None) -> int | None:
    """Slots one expert takes from a group of ``tokens`` tokens: ``ceil(factor * tokens * top_k / n_experts)``,
    ``fixed`` when given, None (no limit) when neither is set or the factor is infinite.

    Example:
        >>> expert_capacity(10, 1, 4, 1.0), expert_capacity(10, 2, 4, 1.25), expert_capacity(10, 1, 4, None)
        (3, 7, None)
    """
    if fixed is not None:
        return fixed
    if factor is None or math.isinf(factor):
        return None
    return math.ceil(factor * tokens * top_k / n_experts)


def route(logits: torch.Tensor, top_k: int, renormalize: bool, capacity: int | None = None
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token-choice top-k routing with a per-group capacity.

    Args:
        logits: (B, T, E) router logits; each row b is one routing group.
        top_k: experts per token.
        renormalize: divide the k gate values by their sum (Mixtral) rather than keep the probabilities (Switch).
        capacity: slots per expert and group (None: no limit).

    Returns:
        probs (B, T, E) softmax over all experts, gates (B, T, k), experts (B, T, k) ids, kept (B, T, k) bool:
        False where the slot overflowed its expert's capacity (first choices in sequence order first).

    Example:
        >>> logits = torch.tensor([[[2.0, 0.0], [3.0, 0.0], [0.0, 1.0]]])  # 3 tokens, 2 experts
        >>> _, gates, experts, kept = route(logits, top_k=1, renormalize=False, capacity=1)
        >>> experts[0, :, 0].tolist(), kept[0, :, 0].tolist()  # expert 0 is full after the first token
        ([0, 0, 1], [True, False, True])
    """
    probs = torch.softmax(logits.float(), dim=-1)  # (B, T, E)
    gates, experts = probs.topk(top_k, dim=-1)  # (B, T, k)
    if renormalize:
        gates = gates / gates.sum(-1, keepdim=True)
    if capacity is None:
        return probs, gates, experts, torch.ones_like(experts, dtype=torch.bool)
    B, T, E = probs.shape
    onehot = F.one_hot(experts.transpose(1, 2).reshape(B, top_k * T), E)  # (B, k*T, E): choice rank, then position
    position = (onehot.cumsum(1) * onehot).sum(-1)  # (B, k*T): 1-based place in the expert's queue
    kept = (position <= capacity).view(B, top_k, T).transpose(1, 2)  # (B, T, k)
    return probs, gates, experts, kept


def load_balancing_loss(probs: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Switch's auxiliary loss ``E * sum_e f_e * P_e`` over all tokens: probs (B, T, E), experts (B, T, k) -> ().

    Example:
        >>> probs = torch.full((1, 4, 4), 0.25)  # a uniform router
        >>> load_balancing_loss(probs, torch.zeros(1, 4, 1, dtype=torch.long)).item()
        1.0
    """
    E = probs.shape[-1]
    counts = torch.zeros(E, device=probs.device).scatter_add_(0, experts.reshape(-1),
                                                              torch.ones(experts.numel(), device=probs.device))
    f = counts / experts.numel()  # (E,) share of slots
    P = probs.reshape(-1, E).mean(0)  # (E,) mean probability
    return E * (f * P).sum()


def z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE's router z-loss ``mean(logsumexp(logits)^2)``: (..., E) -> ()."""
    return torch.logsumexp(logits.float(), dim=-1).pow(2).mean()


def _grouped_mm_works(x: torch.Tensor, widths: tuple[int, ...]) -> bool:
    """Whether ``F.grouped_mm`` takes these operands: fp32/bf16 on CPU; bf16 on CUDA (SM 8.0+), whose kernels
    also want 16-byte aligned rows (widths a multiple of 8)."""
    if not hasattr(F, "grouped_mm"):
        return False
    if x.device.type == "cpu":
        return x.dtype in (torch.float32, torch.bfloat16)
    return (x.is_cuda and x.dtype == torch.bfloat16 and all(w % 8 == 0 for w in widths)
            and torch.cuda.get_device_capability(x.device) >= (8, 0))


ROW_BLOCK = 32  # rows per block of an expert's group on the CPU in bf16/fp16 (see Experts.forward)


class Experts(nn.Module):
    """``E`` feed-forward networks with stacked weights, applied to rows grouped by expert.

    Parameters: ``up`` (and ``gate`` when gated) (E, d_ff, D), ``down`` (E, D, d_ff), and with ``bias``
    ``up_bias``/``gate_bias`` (E, d_ff), ``down_bias`` (E, D).
    """

    def __init__(self, n_experts: int, d_model: int, d_ff: int, activation: str, bias: bool = True,
                 dropout: float = 0.0):
        super().__init__()
        self.n_experts = n_experts
        self.act = activation_fn(activation)
        self.dropout = dropout
        self.up = nn.Parameter(torch.empty(n_experts, d_ff, d_model))
        self.gate = nn.Parameter(torch.empty(n_experts, d_ff, d_model)) if activation in GATED_ACTIVATIONS else None
        self.down = nn.Parameter(torch.empty(n_experts, d_model, d_ff))
        self.up_bias = nn.Parameter(torch.zeros(n_experts, d_ff)) if bias else None
        self.gate_bias = nn.Parameter(torch.zeros(n_experts, d_ff)) if bias and self.gate is not None else None
        self.down_bias = nn.Parameter(torch.zeros(n_experts, d_model)) if bias else None
        self.force_bmm = False  # tests: run the padded-bmm path where grouped_mm would be used
        # Each group rounded up to a multiple of this many rows; None: ROW_BLOCK on the CPU in bf16/fp16, else 1
        self.row_block: int | None = None

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """x (N, D) rows sorted by expert, counts (E,) rows per expert (summing to N) -> (N, D)."""
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        x = x.to(dtype)
        # The CPU's bf16/fp16 GEMMs (oneDNN) build a kernel for every new shape, which costs far more than a small
        # expert GEMM, and group sizes that follow the routing would need new ones at every step. Groups rounded
        # up to whole blocks of zero rows, within a fixed total, keep the shapes to a few that are built once.
        block = self.row_block or (ROW_BLOCK if x.device.type == "cpu" and dtype in (torch.bfloat16, torch.float16)
                                   else 1)
        rows = None
        if block > 1:
            counts, rows, total = block_groups(counts, x.shape[0], block)
            x = x.new_zeros(total, x.shape[1]).index_copy(0, rows, x)  # (N', D)
        if torch.compiler.is_compiling() and dtype != torch.bfloat16:
            y = self._eager(x, counts)  # grouped_mm's tracing (fake) kernel accepts bf16 only
        else:
            y = self._grouped(x, counts)
        return y if rows is None else y.index_select(0, rows)  # (N, D): padding rows dropped

    def _grouped(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if self.force_bmm or not _grouped_mm_works(x, tuple(self.up.shape[1:])):
            linear = _padded_bmm(counts, x.shape[0])
        else:
            offsets = counts.cumsum(0).to(torch.int32)

            def linear(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # (N, in), (E, out, in) -> (N, out)
                return F.grouped_mm(h, w.to(dtype).transpose(1, 2), offs=offsets)

        # Biases as a one-hot product: out + onehot @ b is one addmm whose backward (onehot^T @ grad) is a GEMM,
        # where b[rows] would scatter-add N rows into E in its backward.
        onehot = None if self.up_bias is None else \
            F.one_hot(row_experts(counts, x.shape[0]), self.n_experts).to(dtype)  # (N, E) expert of each row

        def project(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
            out = linear(h, w)
            return out if b is None else torch.addmm(out, onehot, b.to(out.dtype))

        h = self.act(project(x, self.up if self.gate is None else self.gate,
                             self.up_bias if self.gate is None else self.gate_bias))  # (N, d_ff)
        if self.gate is not None:
            h = h * project(x, self.up, self.up_bias)
        if self.dropout and self.training:
            h = dropout(h, self.dropout)
        return project(h, self.down, self.down_bias)  # (N, D)

    @compile_disable
    def _eager(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return self._grouped(x, counts)


def row_experts(counts: torch.Tensor, n: int) -> torch.Tensor:
    """The expert of each of ``n`` rows grouped by expert: counts (E,) -> (n,), e.g. [2, 0, 1] -> [0, 0, 2]."""
    return torch.repeat_interleave(torch.arange(counts.shape[0], device=counts.device), counts, output_size=n)


def block_groups(counts: torch.Tensor, n: int, block: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Round each of ``E`` groups of rows up to a multiple of ``block`` rows, within a total that depends on
    ``n`` only (the last group takes the rest): counts (E,) summing to n -> (padded counts (E,), rows (n,) the
    new place of each row, the total n').

    Example:
        >>> counts, rows, total = block_groups(torch.tensor([3, 0, 6]), 9, 4)
        >>> counts.tolist(), rows.tolist(), total
        ([4, 0, 12], [0, 1, 2, 4, 5, 6, 7, 8, 9], 16)
    """
    E = counts.shape[0]
    total = (n + E * (block - 1)) // block * block  # the most that n rows in E rounded-up groups can take
    padded = (counts + block - 1) // block * block  # (E,)
    padded[-1] += total - padded.sum()
    shift = (padded.cumsum(0) - padded) - (counts.cumsum(0) - counts)  # (E,) how far each group's start moves
    expert = row_experts(counts, n)  # (n,)
    return padded, torch.arange(n, device=counts.device) + shift[expert], total


def _padded_bmm(counts: torch.Tensor, n: int):
    """The grouped product as one ``torch.bmm`` over a zero-padded (E, C, in) batch, C = the largest group."""
    E = counts.shape[0]
    expert = row_experts(counts, n)  # (N,)
    slot = torch.arange(n, device=counts.device) - (counts.cumsum(0) - counts)[expert]  # (N,) row within its group
    C = int(counts.max())

    def linear(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        padded = h.new_zeros(E, C, h.shape[-1])
        padded[expert, slot] = h
        return torch.bmm(padded, w.to(h.dtype).transpose(1, 2))[expert, slot]  # (E, C, out) -> (N, out)

    return linear


class MoEFeedForward(nn.Module):
    """Router + experts (+ shared experts): (B, T, D) -> (B, T, D); see the module docstring.

    After each forward: ``last_load`` (E,) slots routed to each expert, ``last_dropped`` slots over capacity;
    in training mode the (aux, z) losses of each call are appended to ``router_losses`` (the model sums them into
    its loss and clears the list), and running totals feed :func:`moe_stats`.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str, n_experts: int, top_k: int = 1, *,
                 renormalize: bool | None = None, capacity_factor: float | None = None,
                 expert_capacity: int | None = None, jitter: float = 0.0, shared_experts: int = 0,
                 bias: bool = True, dropout: float = 0.0):
        super().__init__()
        self.n_experts, self.top_k = n_experts, top_k
        self.renormalize = top_k > 1 if renormalize is None else renormalize
        self.capacity_factor, self.fixed_capacity, self.jitter = capacity_factor, expert_capacity, jitter
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = Experts(n_experts, d_model, d_ff, activation, bias, dropout)
        self.shared = (FeedForward(d_model, d_ff * shared_experts, activation, bias, dropout)
                       if shared_experts else None)
        self.router_losses: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.last_load = self.last_dropped = None
        self.totals: torch.Tensor | None = None  # [aux, z, calls, dropped, slots, load_0 .. load_{E-1}]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        E, k = self.n_experts, self.top_k
        xr = x.float()
        if self.jitter and self.training:
            xr = xr * torch.empty_like(xr).uniform_(1.0 - self.jitter, 1.0 + self.jitter)
        with torch.autocast(x.device.type, enabled=False):  # the router stays fp32 under bf16 autocast too
            logits = F.linear(xr, self.router.weight.float())  # (B, T, E)
        capacity = expert_capacity(T, k, E, self.capacity_factor, self.fixed_capacity)
        probs, gates, experts, kept = route(logits, k, self.renormalize, capacity)

        # One row per (token, choice) slot, grouped by expert. Dropped slots ride in the last group (computed,
        # then zeroed), which keeps every shape independent of the routing.
        token = torch.arange(B * T, device=x.device).repeat_interleave(k)  # (N,) N = B*T*k
        kept, expert = kept.reshape(-1), experts.reshape(-1)
        group = torch.where(kept, expert, E - 1)
        order = torch.argsort(group, stable=True)
        counts = torch.zeros(E, dtype=torch.long, device=x.device).scatter_add_(0, group, torch.ones_like(group))
        y = self.experts(x.reshape(B * T, D)[token[order]], counts)  # (N, D)
        weight = torch.where(kept, gates.reshape(-1), 0.0)[order, None]  # (N, 1)
        out = torch.zeros(B * T, D, dtype=y.dtype, device=x.device).index_add_(0, token[order], y * weight.to(y.dtype))
        out = out.view(B, T, D).to(x.dtype)
        if self.shared is not None:
            out = out + self.shared(x)

        with torch.no_grad():
            self.last_load = torch.zeros(E, device=x.device).scatter_add_(0, expert, torch.ones_like(gates).reshape(-1))
            self.last_dropped = (~kept).sum()
        if self.training:
            aux, z = load_balancing_loss(probs, experts), z_loss(logits)
            self.router_losses.append((aux, z))
            with torch.no_grad():
                row = torch.cat([torch.stack([aux, z, torch.ones_like(aux), self.last_dropped.float(),
                                              torch.full_like(aux, kept.numel())]), self.last_load])
                self.totals = row if self.totals is None else self.totals + row
        return out

    def extra_repr(self) -> str:
        return (f"experts={self.n_experts}, top_k={self.top_k}, renormalize={self.renormalize}, "
                f"capacity_factor={self.capacity_factor}, expert_capacity={self.fixed_capacity}")


def moe_layers(model: nn.Module) -> list[MoEFeedForward]:
    return [m for m in model.modules() if isinstance(m, MoEFeedForward)]


def clear_router_losses(model: nn.Module) -> None:
    """Forget the losses of earlier forwards (a model clears them at the start of its own)."""
    for layer in moe_layers(model):
        layer.router_losses.clear()


def router_loss(model: nn.Module, aux_coef: float, z_coef: float) -> torch.Tensor | None:
    """``aux_coef * mean(L_aux) + z_coef * mean(L_z)`` over the MoE layer calls of the last training forward,
    or None when there were none (evaluation mode)."""
    losses = [pair for layer in moe_layers(model) for pair in layer.router_losses]
    if not losses:
        return None
    aux = torch.stack([a for a, _ in losses]).mean()
    z = torch.stack([z for _, z in losses]).mean()
    return aux_coef * aux + z_coef * z


def moe_stats(model: nn.Module, reset: bool = True) -> dict:
    """Routing statistics of the training forwards since the last reset, over all MoE layers.

    Returns ``{}`` when there were none, else ``moe_aux_loss`` and ``moe_z_loss`` (unweighted, mean per layer
    call), ``moe_dropped`` (share of token slots over capacity), ``moe_load`` (share of the routed slots each
    expert received: the load histogram, 1/E each when balanced) and ``moe_load_max`` (E times the largest
    share: 1.0 is perfect balance, E is collapse onto one expert).
    """
    rows = [layer.totals for layer in moe_layers(model) if layer.totals is not None]
    if reset:
        for layer in moe_layers(model):
            layer.totals = None
    if not rows:
        return {}
    total = torch.stack(rows).sum(0).double().cpu()
    calls, load = float(total[2]), total[5:]
    share = load / load.sum()
    return {"moe_aux_loss": float(total[0]) / calls, "moe_z_loss": float(total[1]) / calls,
            "moe_dropped": float(total[3] / total[4]), "moe_load": [round(float(s), 5) for s in share],
            "moe_load_max": float(share.max() * len(share))}
