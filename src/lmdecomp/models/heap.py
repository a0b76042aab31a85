"""The C heap's policy for CPU inference: large blocks stay in the heap, one arena, a fixed trim.

PyTorch's CPU tensors come from ``malloc``. glibc serves a block above its *mmap threshold* with a
fresh ``mmap`` and returns it to the kernel on ``free``; the threshold starts at 128 KiB and
rises, up to 32 MiB, to the size of each mapped block freed. An embedding forward pass allocates
and frees the same few large activations in every layer of every batch (MiniLM at 8,192 tokens:
the 1,536-wide feed-forward input and its GELU, 48 MiB each, above any threshold glibc reaches).
Each of them was mapped afresh, so its every 4 KiB page was faulted in and zeroed by the kernel
again: about 150,000 page faults per batch, ~9 % of a float32 MiniLM run's CPU time
(docs/performance.md, 2026-12-02). What the heap keeps also depended on the history of the
moving threshold, and on which threads allocated (glibc gives threads their own arenas), so the
peak RSS of one run differed from the next and grew with the number of batches.

:func:`keep_large_blocks_in_heap` fixes the policy instead (``mallopt``; it also turns off the
moving threshold): blocks up to ``mmap_mb`` come from the heap and are reused batch after batch,
free memory above ``trim_mb`` at the top of the heap is given back, and every thread shares one
arena. It changes where blocks live, not their alignment (PyTorch aligns every tensor to 64
bytes), so results are bit-identical. It is process-wide and lasts; other libraries of the
process (sentence-transformers in ``benchmarks/bench_embed.py``) get it too. Where the C library
is not glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MMAP_MB = 64  # above the largest activation of the zoo and MiniLM at the default batch_tokens (48 MiB)
TRIM_MB = 512  # above the free memory at the top of the heap between the layers of a batch
_applied: tuple[int, int] | None = None


def keep_large_blocks_in_heap(mmap_mb: int = MMAP_MB, trim_mb: int = TRIM_MB) -> bool:
    """Set glibc's heap policy (module doc); True where it was set (now or by an earlier call
    with the same sizes), False where the C library is not glibc or refused a setting."""
    global _applied
    if _applied == (mmap_mb, trim_mb):
        return True
    libc = _glibc()
    if libc is None:
        return False
    ok = all(libc.mallopt(param, value) == 1 for param, value in (
        (M_MMAP_THRESHOLD, mmap_mb << 20), (M_TRIM_THRESHOLD, trim_mb << 20), (M_ARENA_MAX, 1)))
    if ok:
        _applied = (mmap_mb, trim_mb)
    return ok


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None
