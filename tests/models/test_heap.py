"""The heap policy of CPU inference: a large block freed and allocated again is not faulted in again."""

from __future__ import annotations

import json
import subprocess
import sys

from lmdecomp.models import heap

# In a fresh process (the policy is process-wide): page faults of filling a 40 MiB block (above
# glibc's moving mmap threshold, at most 32 MiB) three times, freed in between, after a first fill.
# numpy's huge-page advice is off, so the block is plain malloc memory of 4 KiB pages.
_PROBE = """
import json, resource, sys
import numpy as np
from lmdecomp.models import heap
np._core.multiarray._set_madvise_hugepage(False)
applied = heap.keep_large_blocks_in_heap() if sys.argv[1] == "policy" else None
def fill():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = np.empty(40 << 20, dtype=np.uint8)
    block[::4096] = 1
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
fill()
print(json.dumps({"applied": applied, "faults": [fill() for _ in range(3)]}))
"""
PAGES = (40 << 20) // 4096


def _probe(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_a_large_block_is_reused_instead_of_mapped_and_faulted_again():
    default, policy = _probe("default"), _probe("policy")
    assert min(default["faults"]) > PAGES // 2  # glibc's default: mapped and faulted in afresh every time
    assert policy["applied"] is True
    assert max(policy["faults"]) < PAGES // 20, policy  # the heap's block, reused


def test_the_policy_is_set_once_and_other_c_libraries_are_left_alone(monkeypatch):
    monkeypatch.setattr(heap, "_applied", (heap.MMAP_MB, heap.TRIM_MB))
    assert heap.keep_large_blocks_in_heap() is True  # already set: no second mallopt
    monkeypatch.setattr(heap, "_applied", None)
    monkeypatch.setattr(heap.platform, "libc_ver", lambda: ("", ""))
    assert heap.keep_large_blocks_in_heap() is False
