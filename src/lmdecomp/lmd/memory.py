"""Memory checks before the large allocations of the block moments."""

from __future__ import annotations

from lmdecomp.lmd.errors import LMDError
from lmdecomp.lmd.moments import SPLITS


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else None."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_block_memory(n_blocks: int, width: int, available: int | None = None) -> None:
    """Refuse block moments that cannot fit in memory, before allocating them: they take
    8 · B · 3 · width² bytes (B blocks, three splits, one float64 width² cross-product each),
    which for wide models dwarfs everything else (12 models of 768: 76 GiB at B = 40).
    ``available`` defaults to the machine's MemAvailable."""
    needed = 8 * n_blocks * len(SPLITS) * width * width
    available = available_memory_bytes() if available is None else available
    if available is not None and needed > 0.8 * available:
        gib = 2.0**30
        raise LMDError(
            f"the bootstrap's block moments need {needed / gib:.1f} GiB ({n_blocks} blocks × {len(SPLITS)} splits × "
            f"{width}² float64 for a joint width of {width}) but {available / gib:.1f} GiB of memory is available: "
            "lower lmd.bootstrap_blocks (memory is linear in it), or set lmd.bootstrap: 0 to fit without "
            f"intervals (one {width}² matrix per split)"
        )
