"""A/B in fresh processes: lmdecomp's float32 embedding against sentence-transformers.

``bench_embed.py`` runs every method in one process, and there the ratio depended on the order
(2026-12-03: ≥ 1 when lmdecomp ran first in a round, < 1 when it ran last). Here every
measurement is its own Python process, so neither side inherits the other's heap, caches or
thread pools, and the order within each pair alternates from pair to pair (which arm opens
pair 0 is drawn from the seed): on the AMD EPYC the second process of a pair ran slower (2026-12-05:
median 1.064 with lmdecomp first, 1.009 with sentence-transformers first), and a random draw
that put one arm first more often (8 of 12 then) moved the median with it. Each child times what
``bench_embed.py`` times (model load + tokenisation + forward + pooling; lmdecomp also writes its
Parquet shards) on the same 2,000 BBC sequences of 128 tokens, on 2 threads. sentence-transformers
runs as a user gets it: without lmdecomp's C heap policy (:mod:`lmdecomp.models.heap`). Both
children import transformers and the model's modeling module before their clock starts
(:func:`bench_embed.import_model_code`): ``import sentence_transformers`` does it outside the
sentence-transformers clock anyway, and until 2026-12-04 the lmdecomp child paid for it (2.5–2.8 s)
inside its own.

Per pair the ratio r = t_st / t_lmdecomp (> 1: lmdecomp is faster). Reported: every r, their
median with a distribution-free interval from order statistics (for n = 10 pairs
(r₍₃₎, r₍₈₎), coverage 1 − 2·P(Bin(10, ½) ≤ 2) = 89.1 %), and the medians of the pairs where
lmdecomp ran first and where it ran second. Verdict: PASS when the interval lies above 1, FAIL when
it lies below, inconclusive when it holds 1.

    PYTHONPATH=src:benchmarks python benchmarks/ab_embed_fp32.py [--pairs 10] [--sequences 2000]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_embed  # first: it pins the BLAS and OpenMP threads before torch loads

import numpy as np  # noqa: E402
import torch  # noqa: E402

ARMS = ("lmdecomp", "st")


def child(arm: str, sequences: Path, out: Path) -> None:
    """One timed run in this process; prints {"seconds", "min_cosine"} as JSON."""
    torch.set_num_threads(bench_embed.THREADS)
    from lmdecomp.models.sources import resolve

    ref = resolve(bench_embed.MODEL)
    bench_embed.import_model_code(ref.location)  # both arms' clocks start with it imported
    if arm == "lmdecomp":
        seconds, _ = bench_embed.run_lmdecomp(ref, sequences, out, "float32")
        pooled = bench_embed.read_pooled(out)
    else:
        import pyarrow.parquet as pq

        texts = pq.read_table(sequences, columns=["text"]).column("text").to_pylist()
        seconds, pooled = bench_embed.run_st(ref.location, texts)
    np.save(out.with_suffix(".npy"), pooled)
    print(json.dumps({"seconds": seconds}))


def run_child(arm: str, sequences: Path, out: Path) -> float:
    proc = subprocess.run([sys.executable, __file__, "--child", arm, str(sequences), str(out)],
                          capture_output=True, text=True, check=False, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode:
        raise SystemExit(f"the {arm} child failed:\n{proc.stderr[-3000:]}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])


def median_interval(ratios: list[float]) -> tuple[float, float, float, float]:
    """(median, lo, hi, coverage): lo/hi the order statistics r₍k₎, r₍n+1−k₎ with the largest k
    whose coverage 1 − 2·P(Bin(n, ½) < k) is still at least 0.89."""
    r, n = sorted(ratios), len(ratios)
    cdf = lambda k: sum(math.comb(n, i) for i in range(k)) / 2**n  # noqa: E731  P(B < k)
    k = max([k for k in range(1, n // 2 + 1) if 1 - 2 * cdf(k) >= 0.89], default=1)
    return float(np.median(r)), r[k - 1], r[n - k], 1 - 2 * cdf(k)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--sequences", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0, help="seed of which arm runs first in pair 0")
    parser.add_argument("--out", type=Path, default=bench_embed.DEFAULT_OUT.with_name("ab_embed_fp32.json"))
    parser.add_argument("--child", nargs=3, metavar=("ARM", "SEQUENCES", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], Path(args.child[1]), Path(args.child[2]))
        return 0
    first_arm = int(np.random.default_rng(args.seed).integers(2))  # which arm opens pair 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="ab_embed_fp32_") as tmpdir:
        tmp = Path(tmpdir)
        seqs = tmp / "sequences.parquet"
        from lmdecomp.models.sources import resolve

        bench_embed.make_sequences(resolve(bench_embed.MODEL).load_tokenizer(), seqs, args.sequences, 128, 32)
        for pair in range(args.pairs):
            order = list(ARMS) if (pair + first_arm) % 2 == 0 else list(ARMS[::-1])
            t = {arm: run_child(arm, seqs, tmp / f"{arm}_{pair}") for arm in order}
            cos = bench_embed.min_cosine(np.load(tmp / f"st_{pair}.npy"), np.load(tmp / f"lmdecomp_{pair}.npy"))
            rows.append({"pair": pair, "first": order[0], **{f"{a}_seconds": t[a] for a in ARMS},
                         "ratio_st_over_lmdecomp": t["st"] / t["lmdecomp"], "min_cosine": cos})
            print(f"pair {pair} ({order[0]} first): lmdecomp {t['lmdecomp']:.1f} s, st {t['st']:.1f} s, "
                  f"st ÷ lmdecomp {t['st'] / t['lmdecomp']:.3f}, min cosine {cos:.6f}", flush=True)
    ratios = [r["ratio_st_over_lmdecomp"] for r in rows]
    med, lo, hi, cover = median_interval(ratios)
    verdict = "PASS" if lo > 1 else "FAIL" if hi < 1 else "inconclusive"
    by_first = {a: float(np.median([r["ratio_st_over_lmdecomp"] for r in rows if r["first"] == a] or [np.nan])) for a in ARMS}
    print(f"\nst ÷ lmdecomp over {len(rows)} pairs: median {med:.3f}, {cover:.1%} interval [{lo:.3f}, {hi:.3f}] -> {verdict}")
    print(f"median when lmdecomp ran first {by_first['lmdecomp']:.3f}, when st ran first {by_first['st']:.3f}")
    result = {"pairs": rows, "median": med, "interval": [lo, hi], "coverage": cover, "verdict": verdict,
              "median_by_first": by_first, "min_cosine": min(r["min_cosine"] for r in rows),
              "environment": {"torch": torch.__version__, "threads": bench_embed.THREADS, "cpu_flags_bf16": bench_embed.cpu_bf16(),
                              "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_average": os.getloadavg()}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if verdict == "PASS" and result["min_cosine"] > bench_embed.COSINE_MIN else 1


if __name__ == "__main__":
    sys.exit(main())
