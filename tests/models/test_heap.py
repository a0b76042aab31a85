"""The heap policy of CPU inference: a large block stays in the heap after a free (reused
without new page faults) until release_free() gives the free pages back to the kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


# In a fresh process (PyTorch reads THP_MEM_ALLOC_ENABLE once, at its first tensor): the minor
# page faults of filling a 48 MiB tensor (MiniLM's feed-forward block at 8,192-token batches),
# with and without huge_pages_for_large_tensors(). Importing the pipeline's modules first must
# not latch the switch: the workflow scripts import them before they call it.
_FAULTS = """
import json, resource, sys
import torch
import lmdecomp.models.embed, lmdecomp.mpo.finetune, lmdecomp.mpo.variants
from lmdecomp.models import heap
asked = heap.huge_pages_for_large_tensors() if sys.argv[1] == "huge" else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
torch.empty(12 << 20).fill_(1.0)
print(json.dumps({"asked": asked, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""
PAGES_4K = (48 << 20) // 4096  # 12,288: one fault per 4 KiB page without huge pages


def _faults(mode: str, env_value: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if env_value is not None:
        env["THP_MEM_ALLOC_ENABLE"] = env_value
    out = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout)


def _thp_mode() -> str:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "absent"
    return text[text.index("[") + 1:text.index("]")]


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"), reason="the kernel's transparent huge pages are off")
def test_huge_pages_cut_the_page_faults_of_a_large_tensor():
    plain, huge = _faults("plain"), _faults("huge")
    assert huge["asked"] is True
    if _thp_mode() == "madvise":  # under "always" every large mapping gets huge pages anyway
        assert plain["faults"] > PAGES_4K * 0.9, plain
    assert huge["faults"] < PAGES_4K / 5, huge


def test_an_explicit_environment_value_wins():
    off = _faults("huge", env_value="0")
    assert off["asked"] is False
    if _thp_mode() == "madvise":
        assert off["faults"] > PAGES_4K * 0.9, off
