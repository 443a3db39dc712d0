"""Keep freed memory in the process while training on a CPU, instead of handing it back to the OS every step.

A training step frees and re-allocates the same large tensors every step: activations, the weights' bf16
copies under autocast, and the dense gradient of each embedding table (47 MB for all-MiniLM-L6-v2's 30,522 x
384 words). glibc serves a block above its mmap threshold (128 KB at first, raised as blocks are freed, to 32
MB at most) with freshly mapped pages and unmaps them on free, so the next step faults every page in again
while it zeroes it: a fresh 47 MB ``torch.zeros`` took 19 ms, against 4.5 ms once freed pages stay mapped
(2 cores, torch 2.13, glibc 2.36, 2026-11-27); in a fine-tuning step of that model the embedding gradient's
zero fill was 14 ms of 280. Raising the mmap threshold and the trim threshold to 1 GiB (``mallopt``, as the
``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` variables would at start-up) makes glibc keep such
blocks on its heap and reuse them. The peak resident memory stays what the live tensors need, since freed
blocks are reused rather than added; memory is given back when the process ends.

Only on Linux with glibc; elsewhere (and where the variables are already set) nothing changes.

Example (glibc's Linux; ``tests/test_allocator.py`` checks where the next large block then comes from):
    >>> import sys
    >>> keep_freed_memory() == sys.platform.startswith("linux")
    True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
THRESHOLD = 1 << 30


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once); whether they were set."""
    if not sys.platform.startswith("linux") or any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_",
                                                                           "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, THRESHOLD))
