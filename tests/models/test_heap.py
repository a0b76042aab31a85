"""The heap policy of CPU inference: a large block stays in the heap after a free (reused
without new page faults) until release_free() gives the free pages back to the kernel."""

from __future__ import annotations

import json
import subprocess
import sys

from lmdecomp.models import heap

# In a fresh process (the policy is process-wide): RSS (KiB) held after freeing an 8 MiB block,
# filled page by page, four times in a row, and after release_free(). numpy's huge-page advice
# is off (plain malloc pages).
_PROBE = """
import json, sys
import numpy as np
from lmdecomp.models import heap
np._core.multiarray._set_madvise_hugepage(False)
applied = heap.fixed_heap_policy() if sys.argv[1] == "policy" else None
def rss():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:"))
def held_after_free():
    base = rss()
    block = np.empty(8 << 20, dtype=np.uint8)
    block[::4096] = 1
    del block
    return rss() - base
base = rss()
held = [held_after_free() for _ in range(4)]
released = heap.release_free()
print(json.dumps({"applied": applied, "held": held, "released": released, "after_release": rss() - base}))
"""
BLOCK = 8 << 10  # KiB: below the policy's 16 MiB threshold


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_a_large_block_stays_in_the_heap_until_release_free():
    default, policy = _probe("default"), _probe("policy")
    # glibc's default: the first free raises the threshold, later blocks stay in the heap
    assert max(default["held"][1:]) > BLOCK // 2, default
    assert policy["applied"] is True
    # under the policy the freed block stays in the heap, and the next ones reuse its pages
    # (no new resident memory) ...
    assert policy["held"][0] > BLOCK // 2, policy
    assert max(policy["held"][1:]) < BLOCK // 20, policy
    # ... until release_free() hands the free pages back
    assert policy["released"] is True
    assert policy["after_release"] < BLOCK // 20, policy


def test_the_policy_is_set_once_and_other_c_libraries_are_left_alone(monkeypatch):
    monkeypatch.setattr(heap, "_applied", (heap.MMAP_MB, heap.TRIM_MB))
    assert heap.fixed_heap_policy() is True  # already set: no second mallopt
    monkeypatch.setattr(heap, "_applied", None)
    monkeypatch.setattr(heap.platform, "libc_ver", lambda: ("", ""))
    assert heap.fixed_heap_policy() is False
