"""The C heap's policy for CPU inference: a fixed mmap threshold, a fixed trim, one arena.

PyTorch's CPU tensors come from ``malloc``. glibc serves a block above its *mmap threshold* with
a fresh ``mmap`` and unmaps it on ``free``; by default the threshold starts at 128 KiB and
*moves*: up to 32 MiB, to the size of each mapped block freed. So which activations of an
embedding forward pass (MiniLM at 8,192 tokens: 12 MiB hidden states, 48 MiB feed-forward
blocks) stay in the heap after a free depends on the history of the run, and on the threads
that allocated (glibc gives threads their own arenas). The heap then fragments around the
blocks it keeps, batch after batch: peak RSS grew with the number of shards (2,000 → 20,000
sequences: 902 → 1,021 MiB here, 1,064 → 1,264 MiB on the Intel machine), by luck of the run.

:func:`fixed_heap_policy` turns the moving threshold off (``mallopt``) at 16 MiB, so the
activations of embed's batches are served from the heap (since 2026-12-04 the default
``embed.batch_tokens: 2048`` keeps every one of them there, MiniLM's 12 MiB feed-forward blocks
included; at the earlier 8,192 those were 48 MiB and mapped), and all threads share
one arena; :func:`release_free` (``malloc_trim``), which embed calls after every shard, gives
the heap's free pages back to the kernel. Within a shard a freed block is reused without new
page faults; between shards the heap shrinks to what is live, so the peak is one shard's
working set: flat in the corpus size. (Until 2026-12-04 embed trimmed after every batch; at
2,048-token batches that re-faulted the heap 125 times per 2,000 MiniLM sequences: ~0.5 M faults
and 2.8–2.9 s of system time, against 1.2–1.7 s with the trim once per shard. Peak RSS with the
trim per shard: 721 MiB at 2,000 and 705 at 20,000 sequences.)

Measured on 2026-12-03 (Intel Xeon with AMX, 2 threads, the default's 4,000 sequences; peak RSS
of ``bench_embed``'s 2,000 → 20,000 sequences of 32 tokens; docs/performance.md), threshold and
trim: 1 MiB without ``malloc_trim`` (the earlier policy: every large block mapped and unmapped
on each free): MiniLM 72.8 s, 39 s of it system time (page faults), RSS 891 → 893 MiB; 8 MiB
+ trim: 72.0 s, 807 → 828 MiB; **16 MiB + trim: 62.7 s, 965 → 983 MiB**; 64 MiB + trim:
58.1 s, but 987 → 1,104 MiB (the 48 MiB feed-forward blocks fragment the heap). A zoo model:
18.1 s → 14.0 s at 16 MiB. The policy moves blocks and leaves every result bit-identical
(PyTorch aligns a tensor to 64 bytes, to the 4 KiB page with huge pages on; the pipeline's
artifacts were byte-identical either way, docs/performance.md). It is process-wide and lasts; other
libraries of the process (sentence-transformers in ``benchmarks/bench_embed.py``) get it too.
Where the C library is not glibc it does nothing.

:func:`huge_pages_for_large_tensors` is the other half, for the blocks above the threshold that
stay mapped: PyTorch's own switch ``THP_MEM_ALLOC_ENABLE=1`` makes its CPU allocator advise
transparent huge pages (``madvise(MADV_HUGEPAGE)``) for every tensor of 2 MiB and more, so a
48 MiB feed-forward block costs 24 page faults instead of 12,288. Measured on 2026-12-04 (Intel
Xeon with AMX): five 48 MiB tensors filled in a fresh process, 61,465 minor faults without and
2,704 with; a zoo model's pretraining job (``workflow/scripts/model.py``) 88.7 s → 84.0 s wall,
2.3 → 1.4 s system time, byte-identical weights. PyTorch reads the variable once, at the
process's first tensor allocation, so the workflow's torch scripts and :func:`embed_model
<lmdecomp.models.embed.embed_model>` set it before any tensor exists; later it changes nothing.
The kernel honours the advice where ``/sys/kernel/mm/transparent_hugepage/enabled`` is
``madvise`` or ``always`` (the usual defaults); under ``never`` it is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8
MMAP_MB = 16  # blocks below 16 MiB come from the heap: the activations of embed's default batches
TRIM_MB = 16
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


def huge_pages_for_large_tensors() -> bool:
    """Ask PyTorch's CPU allocator for transparent huge pages on tensors of 2 MiB and more
    (``THP_MEM_ALLOC_ENABLE=1``, module doc). Call it before the process's first tensor: PyTorch
    reads the variable once, then. A value already in the environment wins (``0`` turns it off);
    returns whether huge pages are asked for."""
    return os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1") not in ("", "0")


def release_free() -> bool:
    """Give the heap's free pages back to the kernel (glibc ``malloc_trim(0)``: every whole free
    page of every arena, not only the top); True where it ran, False where the C library is not
    glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    return _load_libc()


@functools.cache  # find_library may run ldconfig: once per process, not once per batch
def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        libc.malloc_trim.argtypes, libc.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        return libc
    except (OSError, AttributeError):
        return None
