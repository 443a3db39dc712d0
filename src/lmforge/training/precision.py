"""Which device to train on, and whether to run the forward pass under bf16 autocast.

bf16 keeps fp32's exponent range, so it needs no loss scaling; fp16 does, and CPUs gain nothing from it,
so lmforge never picks fp16. Weights, gradients and optimizer state stay fp32 (autocast only changes the
dtype of matmul inputs and outputs), and the cross-entropy accumulates in fp32.

``precision="auto"`` uses bf16 where the hardware computes it natively: CUDA GPUs that report bf16 support,
and x86 CPUs with AVX512-BF16 or AMX (Cooper Lake, Sapphire Rapids and later), through oneDNN. Elsewhere
bf16 would be emulated, slower than fp32, so auto falls back to fp32; asking for ``bf16`` explicitly still gets it, with
a warning.

Example:
    >>> import torch
    >>> resolve_precision("fp32", torch.device("cpu")) is None
    True
    >>> with autocast(torch.device("cpu"), None):
    ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    torch.float32
"""

from __future__ import annotations

import contextlib
import warnings

import torch

from lmforge.training.config import PRECISIONS
from lmforge.errors import UserInputError
from lmforge.utils.machine import native_bf16


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"``: CUDA when available, else CPU. ``"cuda"`` without a GPU is an error."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserInputError("device='cuda' but torch sees no CUDA GPU; use device=auto or cpu")
    return device


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``precision`` (``auto|bf16|fp32``) on ``device``; None means plain fp32."""
    if precision not in PRECISIONS:
        raise UserInputError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return None
    native = native_bf16(device)
    if precision == "auto":
        return torch.bfloat16 if native else None
    if not native:
        warnings.warn(f"precision=bf16 on a {device.type} without native bf16: it will be emulated and slow",
                      stacklevel=2)
    return torch.bfloat16


def autocast(device: torch.device, dtype: torch.dtype | None):
    """A context manager: bf16 autocast on ``device``, or nothing for fp32."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
