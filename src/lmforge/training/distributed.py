"""Data-parallel training on PyTorch's own engine: DDP or FSDP2 across the processes that torchrun starts.

    strategy  each of the W ranks holds                          gradients
    single    the whole model and optimizer (one process)         local
    ddp       a replica of the model and optimizer                all-reduced (averaged) in buckets during backward
    fsdp      1/W of every parameter, gradient and Adam moment    reduce-scattered (averaged) per block
    auto      ddp under torchrun with WORLD_SIZE > 1, else single

Every rank runs the same command. torchrun sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and ``MASTER_ADDR/PORT``;
:func:`setup` reads them, takes ``cuda:LOCAL_RANK`` with NCCL when there are GPUs (the CPU with gloo otherwise),
and joins the process group. Without torchrun, ``ddp``/``fsdp`` form a group of one, so the same code (and a
sharded checkpoint) works in a plain process.

FSDP2 (``fully_shard``) makes each transformer block (each entry of a stack's ``layers``) one unit: its
parameters are all-gathered just before its forward and again before its backward, and freed right after, so
one block at a time is whole. The root unit holds the embeddings, heads and final norms. Mixed precision is
FSDP's own policy: parameters all-gathered in bf16 (``fsdp_param_dtype``) and gradients reduced in fp32 or bf16
(``fsdp_reduce_dtype``), while the sharded master weights and Adam moments stay fp32.

The loss across ranks. The Trainer wants the gradient of the mean loss over all N target tokens of the global
batch, while DDP and FSDP *average* the gradients of the W ranks. So each rank first learns N (one all-reduce of
its count, before any backward) and back-propagates ``sum of its token losses * W / N``; the average over
ranks is then ``sum over all tokens / N``, exactly the single-process gradient of a batch W times larger, even
when ranks hold different numbers of targets (MLM masks, padding).

Randomness. All ranks build the model from the same seed; DDP broadcasts rank 0's weights anyway, and
:func:`shard_model` does the same before sharding. Dropout and masking must differ between ranks, so each
rank seeds its generators with :func:`rank_seed` (rank 0 keeps the run's seed: it draws exactly what a
single-process run would).

Failures. :func:`session` wraps a rank's work. A rank whose own code fails tears its process group down,
which wakes its peers at once, and re-raises (:func:`recorded` lets torchrun show that traceback as the root cause).
A rank that fails only because a peer vanished ("Connection reset by peer") does not compete with that
report: it prints one line and waits, briefly, for torchrun to stop it.

Example:
    >>> ctx = setup("single")              # no torchrun: one process, no process group
    >>> (ctx.strategy, ctx.rank, ctx.world_size, ctx.is_main)
    ('single', 0, 1, True)
    >>> resolve_strategy("auto", world_size=8)
    'ddp'
    >>> ctx.all_reduce([2.0, 3.0])          # one process: nothing to reduce
    [2.0, 3.0]
    >>> rank_seed(1234, 0), rank_seed(1234, 1) != 1234
    (1234, True)
"""

from __future__ import annotations

import contextlib
import datetime
import inspect
import json
import os
import re
import signal
import socket
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from lmforge.models.stack import TransformerStack
from lmforge.training.config import STRATEGIES
from lmforge.training.precision import resolve_device
from lmforge.errors import UserInputError

# How long a rank that lost a peer waits for torchrun to stop it before it leaves by itself (other launchers).
PEER_FAILURE_GRACE_S = 10.0
# How long a gloo group's last collective gets to let go of its tensors before the group is destroyed (teardown).
GLOO_DRAIN_S = 0.1
_COMM_ERROR = re.compile(r"gloo|nccl|connection (reset|closed|refused)|broken pipe|processgroup|c10d|timed out",
                         re.IGNORECASE)
_OPS = {"sum": "SUM", "max": "MAX", "min": "MIN"}


@dataclass(frozen=True)
class DistContext:
    """Where this process stands: its strategy, rank, world size and device.

    Attributes:
        strategy: ``single``, ``ddp`` or ``fsdp`` (never ``auto``: :func:`setup` resolves it).
        rank, local_rank, world_size: as torchrun numbers them (0, 0, 1 for a single process).
        device: ``cuda:LOCAL_RANK`` or the CPU.
    """

    strategy: str = "single"
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """Rank 0: the one rank that logs and writes the run's files."""
        return self.rank == 0

    @property
    def grouped(self) -> bool:
        """A process group exists (``ddp``/``fsdp``), even if it holds only this process."""
        return self.strategy != "single"

    # ------------------------------------------------------------------ collectives
    def all_reduce(self, values: Sequence[float], op: str = "sum") -> list[float]:
        """Reduce a few numbers over all ranks (``op``: sum | max | min); float64, so counts stay exact."""
        if self.world_size == 1:
            return [float(v) for v in values]
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, _OPS[op]))
        return t.tolist()

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def gather_json(self, obj: Any) -> list[Any]:
        """Every rank's JSON-able ``obj``, in rank order, on every rank.

        Sent as UTF-8 JSON bytes rather than with ``all_gather_object``, which pickles.
        """
        if self.world_size == 1:
            return [json.loads(json.dumps(obj))]
        data = _encode(obj, self.device)
        sizes = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=self.device))
        longest = max(int(s) for s in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8, device=self.device)
        padded[:len(data)] = data
        received = [torch.empty(longest, dtype=torch.uint8, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(received, padded)
        return [_decode(r[:int(s)]) for r, s in zip(received, sizes)]

    def broadcast_json(self, obj: Any = None) -> Any:
        """Rank 0's JSON-able ``obj`` on every rank (the argument is ignored elsewhere)."""
        if self.world_size == 1:
            return obj
        data = _encode(obj if self.is_main else None, self.device)
        size = torch.tensor([len(data)], dtype=torch.int64, device=self.device)
        dist.broadcast(size, src=0)
        buffer = data if self.is_main else torch.empty(int(size), dtype=torch.uint8, device=self.device)
        dist.broadcast(buffer, src=0)
        return _decode(buffer)


def _encode(obj: Any, device: torch.device) -> torch.Tensor:
    raw = bytearray(json.dumps(obj).encode("utf-8"))
    return torch.frombuffer(raw, dtype=torch.uint8).clone().to(device)  # (n,) uint8; JSON is never empty


def _decode(t: torch.Tensor) -> Any:
    return json.loads(bytes(t.cpu().numpy()).decode("utf-8"))


# ---------------------------------------------------------------------------------- setup
def launcher_env() -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` from torchrun's environment; ``(0, 0, 1)`` outside a launcher."""
    env = os.environ
    return int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1))


def resolve_strategy(strategy: str, world_size: int) -> str:
    """``auto`` -> ``ddp`` with several processes, else ``single``; refuses ``single`` with several."""
    if strategy not in STRATEGIES:
        raise UserInputError(f"strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")
    if strategy == "auto":
        return "ddp" if world_size > 1 else "single"
    if strategy == "single" and world_size > 1:
        raise UserInputError(f"strategy=single under a launcher with WORLD_SIZE={world_size}: every rank would train "
                             "its own copy on its own data; use --strategy ddp, fsdp or auto")
    return strategy


def rank_device(device: str, local_rank: int) -> torch.device:
    """``cuda:LOCAL_RANK`` (made current) when CUDA is asked for or available, else the CPU."""
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserInputError("device='cuda' but torch sees no CUDA GPU; use device=auto or cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise UserInputError(f"LOCAL_RANK={local_rank} but this node has {count} GPU(s): start at most {count} "
                             "processes per node (torchrun --nproc-per-node)")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(strategy: str = "auto", device: str = "auto", timeout: float | None = None) -> DistContext:
    """Resolve ``strategy`` and, for ddp/fsdp, join (or reuse) the default process group.

    Backend: NCCL on CUDA, gloo on the CPU. Called again in the same process, it reuses the group.
    ``timeout`` (seconds) bounds every collective of a new group: a rank whose peer went silent (hung, or its
    node lost without closing the connection) fails after it, with a communication error (None: torch's default).

    Raises:
        ValueError: an unknown strategy, ``single`` under a multi-process launch, or more local ranks than GPUs.
    """
    rank, local_rank, world_size = launcher_env()
    initialised = dist.is_available() and dist.is_initialized()
    if initialised:  # a group the caller made wins over the environment
        rank, world_size = dist.get_rank(), dist.get_world_size()
    strategy = resolve_strategy(strategy, world_size)
    if strategy == "single":
        return DistContext("single", device=resolve_device(device))
    if not dist.is_available():
        raise UserInputError(f"strategy={strategy} needs torch.distributed, which this torch build lacks")
    dev = rank_device(device, local_rank)
    if not initialised:
        backend = "nccl" if dev.type == "cuda" else "gloo"
        device_id = dev if dev.type == "cuda" else None
        limit = {} if timeout is None else {"timeout": datetime.timedelta(seconds=timeout)}
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, device_id=device_id, **limit)
        else:  # no launcher: a group of one on a free local port
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                                    device_id=device_id, **limit)
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if rank == 0:
            _warn_shared_store()
    return DistContext(strategy, rank, local_rank, world_size, dev)


def _warn_shared_store() -> None:
    """Warn when torchrun would restart ranks onto the store of their previous attempt.

    torchrun's c10d rendezvous shares its agent's store with the ranks and keeps that store across restarts;
    the ranks of a new attempt then find the previous attempt's addresses in it, and a rank that reads a dead
    peer's address fails to connect (pytorch/pytorch#135712, still so in torch 2.13). The restart then fails
    now and then, depending on which rank starts first. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` gives every
    attempt a store of its own.
    """
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and int(env.get("TORCHELASTIC_MAX_RESTARTS", 0) or 0) > 0:
        warnings.warn("torchrun --max-restarts with the rendezvous store shared across attempts: a restart can fail "
                      "when a rank reads the previous attempt's addresses; launch torchrun with "
                      "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (see docs/distributed.md)", stacklevel=3)


def teardown(barrier: bool = False) -> None:
    """Leave the default process group, if one is open.

    ``barrier=True`` (a job that ended normally) first waits for every rank: a rank that destroys its group
    while a peer still talks to it can abort that peer at exit (gloo: "terminate called without an active
    exception"). Not after a failure, where a peer may be gone and the barrier would wait for the timeout.

    A gloo group first sleeps ``GLOO_DRAIN_S``. A gloo worker thread frees a finished collective's tensors after
    the caller has moved on, and freeing a tensor made in Python takes the GIL; the group's destructor (here, or
    later with the DDP wrapper that holds it) joins those threads while holding the GIL. If the destructor came
    first, the two waited for each other for ever: a torchrun job that had finished and printed its result
    then hung at exit (seen in CI on a loaded host). Sleeping lets the worker take the GIL and finish.
    """
    if dist.is_available() and dist.is_initialized():
        if barrier and dist.get_world_size() > 1:
            dist.barrier()
        if dist.get_backend() == "gloo":
            time.sleep(GLOO_DRAIN_S)
        dist.destroy_process_group()


def is_comm_error(exc: BaseException) -> bool:
    """True when ``exc`` (or what caused it) is a collective that failed, typically because a peer is gone."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, dist.DistError) or (isinstance(exc, RuntimeError) and _COMM_ERROR.search(str(exc))):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def recorded(fn: Callable) -> Callable:
    """``fn`` wrapped by torchrun's ``record`` when run under torchrun: an exception escaping it is written where the
    launcher finds it, and its summary shows that traceback as the root cause. Elsewhere ``fn`` itself (``record``
    would also switch on ``faulthandler`` for the whole process)."""
    if "TORCHELASTIC_ERROR_FILE" not in os.environ:
        return fn
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(fn)


def _await_termination(ctx: DistContext, exc: BaseException) -> None:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    print(f"rank {ctx.rank}: lost contact with another rank ({first[:300]}). That rank failed or was killed; "
          "its own error is the one to read (torchrun's summary names it as the root cause).",
          file=sys.stderr, flush=True)
    sys.stdout.flush()
    # torchrun saw the failed rank leave and is about to stop this one; an error of our own, written first,
    # could be reported as the root cause in its place. Under other launchers, leave after the grace period.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(PEER_FAILURE_GRACE_S)
    os._exit(1)


@contextlib.contextmanager
def session(strategy: str = "auto", device: str = "auto", timeout: float | None = None) -> Iterator[DistContext]:
    """:func:`setup` (``timeout``: of the collectives, in seconds), then :func:`teardown` on the way out (if the
    group was opened here).

    On an exception in a multi-rank job: a communication error (a peer died) prints one line and waits for the
    launcher to stop this rank; any other error closes the group first, so that peers blocked on this rank
    fail at once instead of at the collective timeout, and is re-raised.

    Example::

        with session("fsdp") as ctx:          # under torchrun --nproc-per-node 8
            trainer = Trainer(model, objective, data, config, dist=ctx)
            trainer.fit()
    """
    opened = not (dist.is_available() and dist.is_initialized())
    ctx = setup(strategy, device, timeout)
    try:
        yield ctx
    except BaseException as exc:
        if ctx.world_size > 1 and is_comm_error(exc):
            _await_termination(ctx, exc)
        if ctx.grouped and (opened or ctx.world_size > 1):
            teardown()
        raise
    if opened:
        teardown(barrier=True)


# ---------------------------------------------------------------------------------- seeds
def rank_seed(seed: int, rank: int) -> int:
    """The seed of ``rank``'s generators: ``seed`` itself on rank 0 (so rank 0 draws what a single process
    would), a well-separated 32-bit seed derived from ``(seed, rank)`` elsewhere."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, rank]).generate_state(1)[0])


# ---------------------------------------------------------------------------------- wrapping
def broadcast_module(model: nn.Module, ctx: DistContext) -> None:
    """Copy rank 0's parameters and buffers to every rank (what DDP does at construction)."""
    if ctx.world_size == 1:
        return
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            buffer = t.detach().to(ctx.device)
            dist.broadcast(buffer, src=0)
            t.copy_(buffer)


def shard_model(model: nn.Module, ctx: DistContext, param_dtype: torch.dtype | None = None,
                reduce_dtype: torch.dtype | None = torch.float32, cpu_offload: bool = False) -> int:
    """Apply FSDP2 ``fully_shard`` to every transformer block of ``model``, then to the root; return the
    number of block units.

    Args:
        param_dtype: dtype the parameters are all-gathered in for compute (None: their own, fp32).
        reduce_dtype: dtype of the gradient reduce-scatter.
        cpu_offload: keep the shards (and so the optimizer step) in host memory; they are copied to the GPU
            block by block.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if not cpu_offload:
        model.to(ctx.device)
    broadcast_module(model, ctx)  # FSDP shards what each rank holds: make it the same everywhere
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    policy = {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
              "offload_policy": CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if cpu_offload
              else OffloadPolicy()}
    units = 0
    for stack in [m for m in model.modules() if isinstance(m, TransformerStack)]:
        # A shared layer (ALBERT) runs n_layers times per forward; it stays in the root unit.
        if len(stack.layers) == stack.n_layers:
            for block in stack.layers:
                fully_shard(block, **policy)
                units += 1
    fully_shard(model, **policy)
    return units


def wrap_model(model: nn.Module, ctx: DistContext, *, param_dtype: torch.dtype | None = None,
               reduce_dtype: torch.dtype | None = torch.float32,
               cpu_offload: bool = False) -> tuple[nn.Module, nn.Module]:
    """Place ``model`` for ``ctx.strategy``; return ``(model, forward_module)``.

    ``model`` keeps the plain parameter names (checkpoints, optimizer groups); ``forward_module`` is what the
    training step calls: the model itself (single, fsdp, where ``model`` is now sharded) or its DDP wrapper.
    """
    if ctx.strategy == "fsdp":
        shard_model(model, ctx, param_dtype, reduce_dtype, cpu_offload)
        return model, model
    model = model.to(ctx.device)
    if ctx.strategy == "ddp":
        # No buffer broadcast before each forward: lmforge's buffers are derived tables (RoPE, sinusoids), equal
        # on every rank, and the broadcast would add a collective to every forward, evaluation included.
        # (torch 2.13 renamed the switch; older releases only know broadcast_buffers.)
        no_buffer_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in
                          inspect.signature(DistributedDataParallel).parameters else {"broadcast_buffers": False})
        ddp = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
                                      **no_buffer_sync)
        return model, ddp
    return model, model


def gradient_sync(forward_module: nn.Module, sync: bool):
    """Context for one micro-step: DDP's ``no_sync()`` when ``sync`` is False (the gradients just accumulate
    locally; the final micro-step's backward all-reduces the sum). FSDP keeps reduce-scattering every
    micro-step: skipping it would hold whole, unsharded gradients, the memory FSDP exists to save."""
    if not sync and isinstance(forward_module, DistributedDataParallel):
        return forward_module.no_sync()
    return contextlib.nullcontext()


def full_value(t: torch.Tensor | float) -> float:
    """A Python float from a tensor that may be a DTensor (FSDP's gradient norm is one)."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return float(t)
