"""A/B: :func:`lmd.accumulate_moments` with and without the read-ahead thread, side by side.

The same synthetic shards as ``bench_lmd.py`` (12 models × 768 = W 9,216, N train rows plus
N/8 val and N/8 test), read in pairs whose order alternates (off/on, on/off, …) so that a drift
in the machine's load falls on both arms. Every run's moments must equal the first run's bit for
bit (the thread changes when a shard is read, never what is summed). Prints each pair's on ÷ off
ratio and the medians.

    PYTHONPATH=src:benchmarks python benchmarks/ab_read_ahead.py [N_TRAIN=50000] [PAIRS=3]
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
import time
from pathlib import Path

import bench_lmd  # first: it pins the BLAS threads before numpy loads

import numpy as np  # noqa: E402

from lmdecomp import lmd  # noqa: E402
from lmdecomp.lmd import stream  # noqa: E402


@contextlib.contextmanager
def read_ahead_off():
    """Replace the read-ahead by the plain iterator: shards read in the caller's thread."""
    original = stream.read_ahead
    stream.read_ahead = lambda items: items
    try:
        yield
    finally:
        stream.read_ahead = original


def same_moments(a: lmd.Moments, b: lmd.Moments) -> bool:
    return all(np.array_equal(a.cross[s], b.cross[s]) and np.array_equal(a.sums[s], b.sums[s])
               for s in lmd.SPLITS)


def main(n_train: int, pairs: int) -> None:
    times: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="ab_read_ahead_") as tmp, lmd.blas_threads(bench_lmd.THREADS):
        folders = bench_lmd.write_synthetic(Path(tmp) / "emb", n_train)
        reference = None
        for pair in range(pairs):
            for arm in (("off", "on") if pair % 2 == 0 else ("on", "off")):
                with read_ahead_off() if arm == "off" else contextlib.nullcontext():
                    start = time.perf_counter()
                    moments = lmd.accumulate_moments(folders)
                    times[arm].append(time.perf_counter() - start)
                if reference is None:
                    reference = moments
                if not same_moments(reference, moments):
                    raise SystemExit(f"pair {pair} {arm}: the moments differ from the first run's")
                print(f"pair {pair} {arm}: {times[arm][-1]:.2f} s", flush=True)
            print(f"pair {pair}: on ÷ off = {times['on'][-1] / times['off'][-1]:.3f}", flush=True)
    ratios = [round(on / off, 3) for on, off in zip(times["on"], times["off"])]
    print(f"median off {np.median(times['off']):.2f} s, median on {np.median(times['on']):.2f} s, "
          f"on ÷ off per pair {ratios}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50_000, int(sys.argv[2]) if len(sys.argv) > 2 else 3)
