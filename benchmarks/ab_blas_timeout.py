"""A/B in fresh processes: the LMD fits with OpenBLAS's idle threads spinning 2^28 cycles
(OpenBLAS's default) against 2^20 (lmdecomp's default, set in ``lmdecomp/__init__.py``).

numpy and scipy each load their own OpenBLAS. The fits alternate between them (scipy's dpotrf,
dpotri, dsyrk, and dtrmm until 2026-12-07; numpy's matmul), and after each call the idle
threads of the library that ran it keep spinning on the cores the other library now needs. OpenBLAS reads ``OPENBLAS_THREAD_TIMEOUT``
only when it loads, so each arm is its own process. The moments come from one pass over the same
synthetic shards as ``bench_lmd.py`` (12 models × 768, N train rows plus N/8 val and N/8 test),
saved once; each child loads them and times all 132 pairwise and 12 leave-one-out fits (α = 1e-3)
on 2 threads. Both arms must return the same rows, bit for bit (the setting changes when idle
threads sleep, never what is computed). The order within a pair alternates.

Per pair r = t(2^28) ÷ t(2^20) (> 1: the short spin is faster), with the median and a
distribution-free interval from order statistics (:func:`ab_embed_fp32.median_interval`).
Verdict: PASS when the interval lies above 1, FAIL below, inconclusive when it holds 1.

    PYTHONPATH=src:benchmarks python benchmarks/ab_blas_timeout.py [--pairs 6] [--n-train 20000]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ARMS = {"spin 2^28": "28", "spin 2^20": "20"}


def child(moments_file: Path) -> None:
    """Time the fits in this process; prints {"pairwise", "leave_one_out", "digest"} as JSON."""
    import bench_lmd  # pins the BLAS threads before numpy loads

    from lmdecomp import lmd

    moments = lmd.Moments.load(moments_file)
    with lmd.blas_threads(bench_lmd.THREADS):
        t_pair, pair = bench_lmd.timed(lambda: lmd.fit_pairwise(moments, bench_lmd.ALPHA))
        t_loo, loo = bench_lmd.timed(lambda: lmd.fit_leave_one_out(moments, bench_lmd.ALPHA))
    digest = hashlib.sha256(json.dumps([pair, loo]).encode()).hexdigest()
    print(json.dumps({"pairwise": t_pair, "leave_one_out": t_loo, "digest": digest}))


def run_child(timeout: str, moments_file: Path) -> dict:
    env = {**os.environ, "OPENBLAS_THREAD_TIMEOUT": timeout, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, __file__, "--child", str(moments_file)],
                          capture_output=True, text=True, check=False, env=env)
    if proc.returncode:
        raise SystemExit(f"the child with OPENBLAS_THREAD_TIMEOUT={timeout} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--n-train", type=int, default=20_000, help="train rows of the moments (the fits' cost does not depend on it)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    import bench_lmd
    import numpy as np
    from ab_embed_fp32 import median_interval

    from lmdecomp import lmd

    rows, digests = [], set()
    with tempfile.TemporaryDirectory(prefix="ab_blas_timeout_") as tmpdir:
        tmp = Path(tmpdir)
        with lmd.blas_threads(bench_lmd.THREADS):
            moments = lmd.accumulate_moments(bench_lmd.write_synthetic(tmp / "emb", args.n_train))
        moments.save(tmp / "moments.safetensors")
        del moments
        for pair in range(args.pairs):
            order = list(ARMS) if pair % 2 == 0 else list(ARMS)[::-1]
            t = {arm: run_child(ARMS[arm], tmp / "moments.safetensors") for arm in order}
            digests |= {t[arm]["digest"] for arm in ARMS}
            total = {arm: t[arm]["pairwise"] + t[arm]["leave_one_out"] for arm in ARMS}
            rows.append({"pair": pair, "first": order[0], **{arm: t[arm] for arm in ARMS},
                         "ratio": total["spin 2^28"] / total["spin 2^20"]})
            print(f"pair {pair} ({order[0]} first): " + ", ".join(
                f"{arm}: pairwise {t[arm]['pairwise']:.2f} s + leave-one-out {t[arm]['leave_one_out']:.2f} s"
                for arm in ARMS) + f"; ratio {rows[-1]['ratio']:.3f}", flush=True)
    if len(digests) != 1:
        raise SystemExit(f"the arms' fit rows differ ({len(digests)} digests): the setting must not change results")
    med, lo, hi, cover = median_interval([r["ratio"] for r in rows])
    verdict = "PASS" if lo > 1 else "FAIL" if hi < 1 else "inconclusive"
    print(f"\nfits, spin 2^28 ÷ spin 2^20 over {len(rows)} pairs: median {med:.3f}, {cover:.1%} interval "
          f"[{lo:.3f}, {hi:.3f}] -> {verdict}; every run's rows bit-identical")
    for part in ("pairwise", "leave_one_out"):
        print(f"  {part}: median " + ", ".join(f"{arm} {np.median([r[arm][part] for r in rows]):.2f} s" for arm in ARMS))
    print(f"environment: {time.strftime('%Y-%m-%d %H:%M:%S')}, load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
