"""What machine a measurement ran on: CPU, cores, platform, Python, load and, when asked, torch's view.

Benchmarks and the quickstart report record this beside their figures, so that a number can be traced to the
machine (and to how busy it was) that produced it.

Example:
    >>> info = machine_info()
    >>> sorted(k for k in info if k != "load_average")
    ['cpu', 'cpu_count', 'platform', 'python']
"""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import Any


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo on Linux), else what the platform module knows."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def native_bf16(device: "str | torch.device" = "cpu") -> bool:
    """True when ``device`` computes bf16 matmuls in hardware: a CUDA GPU that reports bf16 support, or an x86
    CPU with AVX512-BF16 or AMX. Elsewhere oneDNN emulates bf16, many times slower than fp32, so callers pick
    fp32 there."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return torch.backends.mkldnn.is_available() and any(getattr(torch.cpu, n, lambda: False)() for n in checks)
    return False


def user_cache_dir(name: str) -> Path:
    """``~/.cache/lmforge/<name>`` (``$XDG_CACHE_HOME`` honoured): where lmforge keeps what it builds for this
    user and machine (compiled decode steps, CPU kernels)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lmforge" / name


def build_tag() -> str:
    """What built code depends on besides its own source, as a folder name: torch's version, the CPU capability
    torch detects, the machine.

    >>> build_tag().startswith("torch-")
    True
    """
    import torch

    key = f"torch-{torch.__version__}-{torch.backends.cpu.get_cpu_capability()}-{platform.machine()}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)


def machine_info(torch_details: bool = False) -> dict[str, Any]:
    """``cpu, cpu_count, platform, python`` and the 1-minute ``load_average`` (where the OS has one); with
    ``torch_details`` also ``torch_threads`` and the ``gpu`` name (when CUDA is available)."""
    info: dict[str, Any] = {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
                            "python": platform.python_version()}
    if torch_details:
        import torch  # only here: callers without torch_details need not pay for importing it

        info["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    if hasattr(os, "getloadavg"):
        info["load_average"] = round(os.getloadavg()[0], 2)
    return info
