"""lmforge.training.allocator: after keep_freed_memory(), glibc serves a large block from its heap, not mmap."""

import subprocess
import sys

PROBE = """
import ctypes, sys
class Info(ctypes.Structure):  # glibc's struct mallinfo2: ten size_t fields
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                     "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Info
if sys.argv[1] == "keep":
    from lmforge.training.allocator import keep_freed_memory
    assert keep_freed_memory()
block = bytearray(48 << 20)  # the size of MiniLM's word-embedding gradient
print(libc.mallinfo2().hblkhd >= 48 << 20)  # is it an mmap'ed block (given back to the OS on free)?
"""


def test_a_large_block_comes_from_the_heap_once_freed_memory_is_kept():
    def mapped(mode: str) -> str:
        return subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True,
                              check=True).stdout.strip()

    assert mapped("default") == "True"  # glibc's default: a 48 MB block is mapped fresh, unmapped on free
    assert mapped("keep") == "False"  # kept: it comes from the heap, whose pages stay mapped for the next step
