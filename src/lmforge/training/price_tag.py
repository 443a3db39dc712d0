"""Every run's price tag: FLOPs, tokens, seconds, energy, CO2e and dollars, accumulated step by step.

Schwartz et al. (2019, "Green AI") ask every result to report its price tag, the work it took; Strubell et al.
(2019, "Energy and Policy Considerations for Deep Learning in NLP") turn device-hours into kWh and CO2e:

    energy (kWh)  = measured joules / 3.6e6     or   device-seconds x power draw (W) / 3.6e6    (estimated)
    CO2e (kg)     = energy (kWh) x grid intensity (g CO2e / kWh) / 1000
    cost ($)      = device-seconds / 3600 x price per device-hour

FLOPs are analytic, counted per micro-batch from its real shapes: a Transformer's
:meth:`~lmforge.models.transformer.Transformer.train_flops` (6N per token plus 12·L·d·T for attention,
PaLM appendix B) at the padded (B, S) and (B, T) of the batch, with the vocabulary projection charged only
for the labelled rows that reach it (MLM: about 15% of them; see ``Transformer._labelled_loss``). Once per run
one real step is also run under :class:`torch.utils.flop_counter.FlopCounterMode`; the ratio analytic / counted
is stored (``flop_check``). A model without an analytic count (ELECTRA's generator + discriminator, the biLSTM,
a PEFT wrapper, a custom ``loss``) is charged the counted FLOPs per token of that step, scaled by its tokens.

Energy. Measured where the machine exposes a counter: NVIDIA's NVML total-energy counter (through the optional
``pynvml`` package, one GPU per rank) or Intel/AMD RAPL under ``/sys/class/powercap`` (package domains, one
process only: RAPL counts the whole socket). Otherwise, or when the counter is unreadable (RAPL is root-only on
most kernels), energy is estimated from ``power_watts``. The counter is read at most once a second, never in
the step itself. codecarbon (offline mode) was evaluated and not used: it requires 17 packages (pandas,
pydantic, authlib, requests, rich, typer, ...), runs a background scheduler thread and writes its own CSV, and
what it measures comes from the same two counters (RAPL, NVML) or a TDP table, which this file reads directly.

Device time. On a GPU, a device-second is a second of wall time with the GPU held. On a CPU it is what the
process actually ran, not the wall clock: the process's CPU seconds (user + system, :func:`time.process_time`,
threads included, subprocesses such as data-loader workers not) over the span the wall time covers, divided by the
cores it uses (torch's intra-op threads, at most the cores it may run on), and at most the wall time. A CPU
device-hour is thus the run's cores fully busy for an hour: on an idle machine it is the wall time, as before,
and on a shared one it is the share of the cores the run got (a core time-sliced with another busy process gives
it about half). So one device stays the CPU package whose draw ``power_watts`` estimates (65 W, a desktop TDP),
and the price per device-hour stays that of the run's cores. The price tag also keeps the CPU seconds themselves
(``cpu_s``) and the thread count (``cpu_threads``): with 2 threads fully busy, 1 wall hour is 2 CPU-hours and
1 device-hour. A price tag written before this field existed has ``device_s`` = wall seconds; it still reads.

Many ranks: each rank adds its own seconds and joules; the sums travel in the step's existing all-reduce of
the token count (no extra collective), so ``device_s`` is the sum over ranks.

Resume: the totals live in the checkpoint (:meth:`PriceTag.state_dict`), so a run killed and resumed counts
each checkpointed step once; the steps lost with the kill are not charged again.

Example:
    >>> tag = PriceTag(PriceSettings.resolve(device="cpu", power_watts=100, grid_intensity=500,
    ...                                      price_per_hour=0.36))
    >>> tag.add(tokens=1000, flops=6e12, seconds=36.0)
    >>> r = tag.record()
    >>> r["total_flops"], r["total_tokens"], r["energy_kwh"], r["co2e_kg"], r["cost_usd"]
    (6000000000000, 1000, 0.001, 0.0005, 0.0036)
    >>> r["energy_method"]
    'estimated: device-seconds x 100 W'

On a CPU, a step's device-seconds are its CPU seconds per thread, at most its wall seconds:

    >>> cpu_device_seconds(wall=2.0, cpu=1.0, threads=1), cpu_device_seconds(2.0, 3.0, 2), cpu_device_seconds(2, 9, 2)
    (1.0, 1.5, 2)
"""

from __future__ import annotations

import glob
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from lmforge.errors import UserInputError
from lmforge.models.transformer import Transformer, packed_layer_weights

PRICE_TAG_FILE = "price_tag.json"
METER_INTERVAL_S = 1.0  # read an energy counter at most this often

# Grid carbon intensity, g CO2e per kWh: rounded annual averages of electricity generation (Ember, "Global
# Electricity Review 2024", 2023 data; "us-epa-2018" is the EPA figure Strubell et al. used, 0.954 lb/kWh).
# A utility's own figure, given as --grid-intensity, is better than any of these.
GRID_INTENSITY = {
    "world": 480.0, "us": 370.0, "us-epa-2018": 433.0, "eu": 245.0, "uk": 240.0, "de": 380.0, "fr": 55.0,
    "se": 40.0, "no": 30.0, "ca": 170.0, "cn": 580.0, "in": 710.0, "jp": 480.0, "au": 550.0, "br": 100.0,
}
DEFAULT_REGION = "world"
# Estimated draw of one device when nothing measures it: a desktop CPU package's TDP, a datacentre GPU's
# typical board power under training load (V100 / A100 PCIe: 250-300 W).
DEFAULT_POWER_WATTS = {"cpu": 65.0, "cuda": 300.0}
# Price of one device-hour in US dollars: a small cloud vCPU instance, an on-demand datacentre GPU.
DEFAULT_PRICE_PER_HOUR = {"cpu": 0.05, "cuda": 2.0}
DEVICE_KINDS = tuple(DEFAULT_POWER_WATTS)


@dataclass
class PriceSettings:
    """How device time turns into kWh, CO2e and dollars (every field resolved, none None)."""

    device: str = "cpu"
    region: str = DEFAULT_REGION
    grid_intensity: float = GRID_INTENSITY[DEFAULT_REGION]
    power_watts: float = DEFAULT_POWER_WATTS["cpu"]
    price_per_hour: float = DEFAULT_PRICE_PER_HOUR["cpu"]

    @classmethod
    def resolve(cls, device: str = "cpu", region: str | None = None, grid_intensity: float | None = None,
                power_watts: float | None = None, price_per_hour: float | None = None) -> "PriceSettings":
        """Fill the unset settings from the tables above; a bad value raises UserInputError naming its option.

        ``device`` is a kind (cpu, cuda) or a torch device string (``cuda:1``). An explicit ``grid_intensity``
        wins over ``region`` (whose name is then kept as given, or "custom")."""
        kind = str(device).split(":")[0]
        if kind not in DEVICE_KINDS:
            raise UserInputError(f"--device {device!r}: unknown device; choose one of {', '.join(DEVICE_KINDS)}")
        if region is not None and region not in GRID_INTENSITY:
            raise UserInputError(f"--region {region!r}: unknown region; choose one of {', '.join(GRID_INTENSITY)} "
                                 "or give --grid-intensity G_PER_KWH")
        for flag, value in (("--grid-intensity", grid_intensity), ("--power-watts", power_watts),
                            ("--price-per-hour", price_per_hour)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise UserInputError(f"{flag} {value}: must be a number >= 0")
        if grid_intensity is None:
            region = region or DEFAULT_REGION
            grid_intensity = GRID_INTENSITY[region]
        return cls(kind, region or "custom", float(grid_intensity),
                   float(DEFAULT_POWER_WATTS[kind] if power_watts is None else power_watts),
                   float(DEFAULT_PRICE_PER_HOUR[kind] if price_per_hour is None else price_per_hour))

    def derived(self, device_s: float, energy_j: float | None) -> dict[str, Any]:
        """kWh (measured when ``energy_j`` is given), CO2e and dollars for ``device_s`` device-seconds."""
        kwh = (energy_j if energy_j is not None else device_s * self.power_watts) / 3.6e6
        return {"energy_kwh": kwh, "co2e_kg": kwh * self.grid_intensity / 1000.0,
                "cost_usd": device_s / 3600.0 * self.price_per_hour}


def cpu_threads() -> int:
    """The cores a CPU run computes on: torch's intra-op threads, at most the cores this process may run on."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(torch.get_num_threads(), cores))


def cpu_device_seconds(wall: float, cpu: float, threads: int) -> float:
    """A CPU span's device-seconds: its process CPU seconds over the ``threads`` it computes on, at most ``wall``
    (threads beyond torch's, a logger's or the allocator's, cannot make the device busier than fully busy)."""
    return min(wall, cpu / max(1, threads))


# ---------------------------------------------------------------------------------------------- FLOPs
def batch_flops(model: torch.nn.Module, batch: dict[str, Any], n_targets: int,
                cache: dict[Any, int] | None = None, packed: bool = True) -> int | None:
    """Analytic training FLOPs (forward + backward) of one micro-batch, or None where there is no formula.

    Args:
        model: the model the Trainer calls (a plain :class:`Transformer` has a formula; anything else None).
        batch: the collated micro-batch: ``input_ids`` (B, S), for an encoder-decoder ``decoder_input_ids`` or
            ``labels`` (B, T).
        n_targets: the labelled positions of the batch: only they reach the vocabulary projection.
        cache: a dict kept between calls for one model: its parameter counts and each shape's count are then
            worked out once (counting parameters walks the whole module tree).
        packed: whether the forward may run its layers padding-free (a model in train mode, not compiled):
            the padding it skips is then not charged; otherwise padding costs as much as text.

    Example:
        >>> import lmforge, torch
        >>> m = lmforge.build_model("gpt-tiny", n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=10)
        >>> ids = torch.zeros(2, 8, dtype=torch.long)
        >>> batch_flops(m, {"input_ids": ids, "labels": ids}, 16) == 2 * m.train_flops(8)
        True
    """
    if type(model) is not Transformer or not isinstance(batch.get("input_ids"), torch.Tensor):
        return None
    cfg = model.config
    cache = {} if cache is None else cache
    B, S = batch["input_ids"].shape  # padded shape; padding-free layers are credited below
    if cfg.arch == "encoder-decoder":
        target = batch.get("decoder_input_ids", batch.get("labels"))
        if not isinstance(target, torch.Tensor):
            return None
        T = target.shape[1]
    else:
        T = S
    if (S, T) not in cache:
        cache[S, T] = model.train_flops(S, T if cfg.arch == "encoder-decoder" else None)
    flops = B * cache[S, T]
    if "head" not in cache:
        # train_flops charges the head (and the pooler) for every output position; with labels the model
        # projects only the labelled rows, and the pooler runs forward only, on one row per sequence.
        head = sum(p.numel() for m in (model.mlm_head, model.lm_head, model.rtd_head) if m is not None
                   for p in m.parameters())
        if cfg.head in ("lm", "mlm") and cfg.tie_embeddings:
            head += cfg.vocab_size * cfg.embed_dim
        cache["head"] = head
        cache["pool"] = sum(p.numel() for p in model.pooler.parameters()) if model.pooler is not None else 0
    head, pool = cache["head"], cache["pool"]
    rows = n_targets if "labels" in batch else B * T
    flops = flops - 6 * head * B * T + 6 * head * rows - 6 * pool * B * S + 2 * pool * B
    if packed:  # a training forward's layers skip most of the padding (lmforge.nn.unpadding)
        decoder_mask = batch.get("decoder_attention_mask" if cfg.arch == "encoder-decoder" else "attention_mask")
        for name, mask in (("encoder", batch.get("attention_mask")), ("decoder", decoder_mask)):
            stack = getattr(model, name)
            layout = stack.packing(mask) if stack is not None else None
            if layout is not None:
                if name not in cache:
                    cache[name] = packed_layer_weights(stack)
                flops -= 6 * cache[name] * (layout.batch * layout.length - layout.index.numel())
    return int(flops)


def counted_flops():
    """A :class:`torch.utils.flop_counter.FlopCounterMode` that prints nothing (``.get_total_flops()``).

    PyTorch's table has no formula for the CPU flash-attention kernel that SDPA picks on CPU; it costs what the
    other SDPA kernels cost (two batched matmuls forward, five backward), so it is counted with their formulas.
    """
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def forward(query, key, value, *args, **kwargs) -> int:
        return fc.sdpa_flop_count(query, key, value)

    def backward(grad_out, query, key, value, *args, **kwargs) -> int:
        return fc.sdpa_backward_flop_count(grad_out, query, key, value)

    return fc.FlopCounterMode(display=False, custom_mapping={
        aten._scaled_dot_product_flash_attention_for_cpu: forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: backward})


# ---------------------------------------------------------------------------------------------- energy
class EnergyMeter(Protocol):
    """A cumulative energy counter: ``joules()`` since it was opened; ``method`` says what it reads."""

    method: str

    def joules(self) -> float: ...


class RaplMeter:
    """Intel/AMD RAPL package counters under /sys/class/powercap (microjoules, wrapping at max_energy_range_uj)."""

    method = "measured: RAPL package energy (/sys/class/powercap)"

    def __init__(self, root: str | Path = "/sys/class/powercap") -> None:
        # Top-level domains only (intel-rapl:0, not intel-rapl:0:0): a package already includes its cores and dram.
        self.files = [Path(p) for p in sorted(glob.glob(str(Path(root) / "intel-rapl:*" / "energy_uj")))
                      if Path(p).parent.name.count(":") == 1]
        if not self.files:
            raise OSError("no RAPL package domain")
        self.ranges = [float((f.parent / "max_energy_range_uj").read_text()) for f in self.files]
        self._last = [self._read(f) for f in self.files]  # raises PermissionError where RAPL is root-only
        self._total = 0.0

    @staticmethod
    def _read(file: Path) -> float:
        return float(file.read_text())

    def joules(self) -> float:
        for i, file in enumerate(self.files):
            now = self._read(file)
            delta = now - self._last[i]
            self._total += delta if delta >= 0 else delta + self.ranges[i]  # the counter wrapped around
            self._last[i] = now
        return self._total / 1e6


class NvmlMeter:
    """NVIDIA's total-energy counter of one GPU (millijoules since the driver loaded; Volta and newer)."""

    method = "measured: NVML total energy (pynvml)"

    def __init__(self, index: int) -> None:
        import pynvml  # optional: nvidia-ml-py

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._start = self._read()

    def _read(self) -> float:
        return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def joules(self) -> float:
        return (self._read() - self._start) / 1e3


def open_meter(device: torch.device | str, world_size: int = 1) -> EnergyMeter | None:
    """The energy counter this process can read for ``device``, or None (energy is then estimated)."""
    device = torch.device(device)
    try:
        if device.type == "cuda":
            return NvmlMeter(device.index if device.index is not None else torch.cuda.current_device())
        if device.type == "cpu" and world_size == 1:  # RAPL sees the whole socket: one process only
            return RaplMeter()
    except Exception:  # noqa: BLE001 - no pynvml, no RAPL, no permission, an old GPU: all mean "not measurable"
        return None
    return None


# ---------------------------------------------------------------------------------------------- the tag
def _sig(x: float) -> float:
    """Six significant digits: a tiny run's kWh stays readable, and exact enough to recompute from."""
    return float(f"{x:.6g}")


class PriceTag:
    """Cumulative FLOPs, tokens, seconds and energy of one run; the totals survive checkpoint and resume.

    The Trainer calls :meth:`start` when its loop starts, :meth:`step_values` after each step (this rank's
    FLOPs, seconds and joules, to be summed over the ranks), :meth:`add` with the sums, and :meth:`record` for
    the cumulative values of each metrics line.
    """

    def __init__(self, settings: PriceSettings | None = None, meter: EnergyMeter | None = None) -> None:
        self.settings = settings or PriceSettings()
        self.meter = meter
        self.flops = 0  # analytic where possible (flops_method says how)
        self.tokens = 0
        self.wall_s = 0.0
        self.device_s = 0.0
        self.cpu_s = 0.0  # process CPU seconds, summed over ranks (what a CPU run is billed by)
        self.cpu_threads = cpu_threads() if self.settings.device == "cpu" else None
        self.energy_j = 0.0  # measured joules (only with a meter)
        self.flops_method = "analytic"
        self.flop_check: dict[str, Any] | None = None
        self._per_token: float | None = None  # counted FLOPs per token, for models without a formula
        self._shapes: dict[Any, int] = {}  # batch_flops' cache for the one model this tag counts
        self._clock = time.monotonic()
        self._cpu_clock = time.process_time()
        self._read_at = -math.inf
        self._joules_read = 0.0
        self._joules_added = 0.0

    # ------------------------------------------------------------------ accumulating
    def start(self) -> None:
        """(Re)start the clock and the energy reference: time before this call is not charged."""
        self._clock = time.monotonic()
        self._cpu_clock = time.process_time()
        if self.settings.device == "cpu":  # set_num_threads may have run since the tag was made
            self.cpu_threads = cpu_threads()
        self._joules_added = self._joules_read = self.meter.joules() if self.meter is not None else 0.0
        self._read_at = time.monotonic()

    def step_flops(self, model, batches: list[dict[str, Any]], targets: list[int], tokens: int,
                   packed: bool = True) -> int:
        """This rank's FLOPs for one step's micro-batches (analytic, else the counted rate x tokens); ``packed``:
        as :func:`batch_flops` (False for a compiled model, which keeps the padded layout)."""
        counts = [batch_flops(model, b, n, self._shapes, packed) for b, n in zip(batches, targets)]
        if all(c is not None for c in counts):
            return sum(counts)
        self.flops_method = "counted: FlopCounterMode FLOPs per token of one step x tokens"
        return int(round((self._per_token or 0.0) * tokens))

    def check(self, analytic: int | None, counted: int, tokens: int) -> None:
        """Store the cross-check of one step: analytic / counted FLOPs (None without a formula)."""
        self._per_token = counted / tokens if tokens else None
        self.flop_check = {"analytic": analytic, "counted": counted,
                           "ratio": analytic / counted if analytic and counted else None}

    def rank_values(self) -> list[float]:
        """This rank's wall seconds since the last call, joules (0 when no reading is due), device-seconds (on a
        CPU: :func:`cpu_device_seconds`; else the wall seconds) and process CPU seconds."""
        now, cpu_now = time.monotonic(), time.process_time()
        seconds, self._clock = now - self._clock, now
        cpu, self._cpu_clock = cpu_now - self._cpu_clock, cpu_now
        device_s = cpu_device_seconds(seconds, cpu, self.cpu_threads or 1) if self.settings.device == "cpu" \
            else seconds
        joules = 0.0
        if self.meter is not None and now - self._read_at >= METER_INTERVAL_S:
            self._joules_read, self._read_at = self.meter.joules(), now
        if self.meter is not None:
            joules, self._joules_added = self._joules_read - self._joules_added, self._joules_read
        return [seconds, joules, device_s, cpu]

    def add(self, tokens: int, flops: float, seconds: float, joules: float = 0.0, device_s: float | None = None,
            cpu_s: float | None = None):
        """Add one step: tokens and FLOPs of every rank, this rank's wall seconds, every rank's device-seconds
        (default: ``seconds``), joules and CPU seconds (default: the device-seconds)."""
        self.tokens += int(tokens)
        self.flops += int(flops)
        self.wall_s += seconds
        device_s = seconds if device_s is None else device_s
        self.device_s += device_s
        self.cpu_s += device_s if cpu_s is None else cpu_s
        self.energy_j += joules

    # ------------------------------------------------------------------ reporting
    @property
    def measured(self) -> bool:
        return self.meter is not None

    def record(self) -> dict[str, Any]:
        """The cumulative values for one metrics line."""
        derived = self.settings.derived(self.device_s, self.energy_j if self.measured else None)
        return {"total_flops": self.flops, "total_tokens": self.tokens, "wall_s": round(self.wall_s, 6),
                "device_s": round(self.device_s, 6), "cpu_s": round(self.cpu_s, 6),
                "energy_kwh": _sig(derived["energy_kwh"]),
                "energy_method": self.meter.method if self.measured else
                f"estimated: device-seconds x {self.settings.power_watts:g} W",
                "co2e_kg": _sig(derived["co2e_kg"]), "cost_usd": _sig(derived["cost_usd"])}

    def summary(self) -> dict[str, Any]:
        """The totals of the run so far, with the settings and methods behind them (``price_tag.json``)."""
        return {**self.record(), "cpu_threads": self.cpu_threads, "device_time": self.device_time(),
                "flops_method": self.flops_method, "flop_check": self.flop_check, "settings": asdict(self.settings)}

    def device_time(self) -> str:
        """How ``device_s`` was obtained (``price_tag.json``'s ``device_time``)."""
        if self.settings.device == "cpu":
            return (f"cpu: process CPU seconds / {self.cpu_threads} thread(s), at most the wall time; summed over "
                    "ranks")
        return f"{self.settings.device}: wall seconds with the device held; summed over ranks"

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        return {"flops": self.flops, "tokens": self.tokens, "wall_s": self.wall_s, "device_s": self.device_s,
                "cpu_s": self.cpu_s, "energy_j": self.energy_j, "flops_method": self.flops_method,
                "flop_check": self.flop_check, "per_token": self._per_token}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if not state:
            return
        self.flops, self.tokens = int(state["flops"]), int(state["tokens"])
        self.wall_s, self.device_s, self.energy_j = state["wall_s"], state["device_s"], state["energy_j"]
        # A checkpoint from before CPU seconds were kept: its steps stay billed as they were, by their wall time.
        self.cpu_s = state.get("cpu_s", self.device_s)
        self.flops_method, self.flop_check = state["flops_method"], state["flop_check"]
        self._per_token = state.get("per_token")
