"""The C heap's policy for CPU inference: a fixed mmap threshold, a fixed trim, one arena.

PyTorch's CPU tensors come from ``malloc``. glibc serves a block above its *mmap threshold* with
a fresh ``mmap`` and unmaps it on ``free``; by default the threshold starts at 128 KiB and
*moves*: up to 32 MiB, to the size of each mapped block freed. So which activations of an
embedding forward pass (MiniLM at 8,192 tokens: 12 MiB hidden states, 48 MiB feed-forward
blocks) stay in the heap after a free depends on the history of the run, and on the threads
that allocated (glibc gives threads their own arenas). The heap then fragments around the
blocks it keeps, batch after batch: peak RSS grew with the number of shards (2,000 → 20,000
sequences: 902 → 1,021 MiB here, 1,064 → 1,264 MiB on the Intel machine), by luck of the run.

:func:`fixed_heap_policy` turns the moving threshold off (``mallopt``): every block of at least
``mmap_mb`` is mapped and given back on ``free``, free memory above ``trim_mb`` at the top of
the heap is trimmed, and all threads share one arena. Only small blocks stay in the heap, so
the peak is the live memory of the worst batch plus a small heap: flat in the corpus size
(docs/performance.md, 2026-12-02). Keeping the large blocks in the heap instead (a 64 MiB
threshold) saves their page faults, ~9 % of the CPU time, but the heap kept growing (996 →
1,121 MiB for 10× the sequences). The policy moves blocks, not their alignment (PyTorch aligns
every tensor to 64 bytes), so results are bit-identical. It is process-wide and lasts; other
libraries of the process (sentence-transformers in ``benchmarks/bench_embed.py``) get it too.
Where the C library is not glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MMAP_MB = 1  # blocks of 1 MiB and more are mapped: activations of every model and batch size
TRIM_MB = 1
_applied: tuple[int, int] | None = None


def fixed_heap_policy(mmap_mb: int = MMAP_MB, trim_mb: int = TRIM_MB) -> bool:
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
