"""Benchmark LMD fitting (lmdecomp.lmd) against a per-fit baseline and the BLAS floor.

Synthetic embeddings: M = 12 models of width d = 768 sharing a rank-64 latent structure,
x_m = Z A_m + 0.5·E_m (Z: rows × 64, A_m: 64 × 768, E_m: i.i.d. noise; seeded), with
N train rows plus N/8 val and N/8 test rows, written as Parquet shards (2,048 rows each)
through lmdecomp.data.shards, as the embed step writes them. Joint width W = 12 × 768 = 9,216.

Timed in one run, on 2 threads:

* ``lmdecomp``  :func:`lmd.accumulate_moments` (one pass over all shards, one in-place dsyrk
  per 4,096 rows of a split) + all 132 pairwise and 12 leave-one-out ridge fits
  (:func:`lmd.fit_pairwise`: one Cholesky per basis model; :func:`lmd.fit_leave_one_out`: one
  inverse of the regularised joint scatter for all 12; one α = 1e-3) with R² on train/val/test.
* ``baseline``  the straightforward per-fit implementation from embeddings held in memory
  (torch, float64): for every fit ``torch.cov`` of [z | u] on train + ``torch.linalg.solve``,
  R² from the residuals of every split. Only a subset of its fits is timed (3 pairwise,
  1 leave-one-out) and the rest extrapolated (× 132/3 and × 12); reading the data into
  memory is not charged to it.
* ``floor``     one symmetric rank-k update of the joint W × W cross-product over all rows
  at the same precision: ``scipy.linalg.blas.dsyrk`` (upper triangle only) on the float64
  joint matrix held in memory.

``--zoo results/embeddings`` (``make bench`` adds it after ``make run``) also times the same
three steps, the floor and every baseline fit on the real default zoo's embeddings: a report,
no target.

* ``bound``     the arithmetic an exact method from moments cannot avoid (:func:`bound_flops`:
  the floor's syrk, the joint inverse, the leave-one-out and pairwise solves and held-out
  scores), timed at the floor's own measured GFLOP/s: ``bound = t_floor · flops / (N_all·W²)``.

Targets: lmdecomp ≥ 10 × faster than the baseline; lmdecomp total ≤ 1.15 × the bound at
N = 50,000 and at the larger RSS N (200,000), each printed beside total ÷ floor. At N = 50,000
lmdecomp and the floor run ``--repeats`` rounds (default 3, the order alternating) and the
target takes each arm's best, with the rounds' own ratios printed as their range (restated
2026-12-02 from "total ≤ 1.5 × the floor", which the arithmetic alone exceeds at N = 50,000:
see docs/performance.md); peak RSS flat in N (fresh subprocesses running accumulate_moments
+ all fits at two N: large ≤ 1.10 × small + 100 MiB). At the larger N the total is the
child's own timings and the floor a dsyrk over row chunks (:func:`chunked_floor`). Prints a
table, writes JSON (default ``results/benchmarks/lmd.json``), exits 1 on a miss.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")

import lmdecomp  # noqa: E402,F401  first: its OPENBLAS_THREAD_TIMEOUT must reach numpy's OpenBLAS too
import numpy as np  # noqa: E402
from peak_memory import peak_rss_mib  # noqa: E402
from scipy.linalg.blas import dsyrk  # noqa: E402
import torch  # noqa: E402

from lmdecomp import lmd  # noqa: E402
from lmdecomp.data import shards

THREADS = 2
MODELS, DIM, RANK, NOISE = 12, 768, 64, 0.5
SHARD_ROWS = 2048
ALPHA = 1e-3
BOUND_TARGET = 1.15  # lmdecomp total ≤ 1.15 × the arithmetic bound (restated 2026-12-02)
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "benchmarks" / "lmd.json"


def names() -> list[str]:
    return [f"m{i:02d}" for i in range(MODELS)]


def split_sizes(n_train: int) -> dict[str, int]:
    return {"train": n_train, "val": n_train // 8, "test": n_train // 8}


def iter_synthetic(n_train: int, seed: int = 0):
    """Shard by shard: (seq_ids, splits, [x_m float32 for each model])."""
    rng = np.random.default_rng(seed)
    mixing = [rng.standard_normal((RANK, DIM)) / np.sqrt(RANK) for _ in range(MODELS)]
    labels = np.concatenate([np.full(k, s, dtype=object) for s, k in split_sizes(n_train).items()])
    labels = labels[rng.permutation(len(labels))]
    for start in range(0, len(labels), SHARD_ROWS):
        rows = len(labels[start : start + SHARD_ROWS])
        z = rng.standard_normal((rows, RANK))
        xs = [(z @ a + NOISE * rng.standard_normal((rows, DIM))).astype(np.float32) for a in mixing]
        yield np.arange(start, start + rows, dtype=np.int64), labels[start : start + rows], xs


def write_synthetic(root: Path, n_train: int) -> dict[str, Path]:
    folders = {n: root / n for n in names()}
    for f in folders.values():
        f.mkdir(parents=True)
    entries = {n: [] for n in names()}
    for index, (ids, splits, xs) in enumerate(iter_synthetic(n_train)):
        for name, x in zip(names(), xs):
            file = shards.shard_name(index)
            shards.write_shard(folders[name] / file, ids, list(splits), x, 256)
            entries[name].append(shards.shard_entry(folders[name], file, len(ids)))
    rows = sum(split_sizes(n_train).values())
    for name in names():
        shards.write_manifest(folders[name], {"schema_version": shards.SCHEMA_VERSION, "model": name,
                                              "dim": DIM, "rows": rows, "shards": entries[name]})
    return folders


def joint_float64(xs: list[np.ndarray]) -> np.ndarray:
    """One shard's rows of all models side by side, in float64 (the floor's input)."""
    return np.concatenate([x.astype(np.float64) for x in xs], axis=1)


def load_in_memory(n_train: int) -> tuple[np.ndarray, np.ndarray]:
    """The joint float64 matrix (rows × W) and the split labels, regenerated (same seed)."""
    parts, labels = [], []
    for _, splits, xs in iter_synthetic(n_train):
        parts.append(joint_float64(xs))
        labels.append(splits)
    return np.concatenate(parts), np.concatenate(labels)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def time_lmdecomp(folders: dict[str, Path]) -> tuple[dict[str, float], lmd.Moments, list[dict], list[dict]]:
    """lmdecomp's three timed steps: ({step: seconds, "total": …}, moments, pairwise rows, LOO rows)."""
    t_acc, moments = timed(lambda: lmd.accumulate_moments(folders))
    t_pair, pair = timed(lambda: lmd.fit_pairwise(moments, ALPHA))
    t_loo, loo = timed(lambda: lmd.fit_leave_one_out(moments, ALPHA))
    seconds = {"accumulate_moments": t_acc, "pairwise_all": t_pair, "leave_one_out_all": t_loo,
               "total": t_acc + t_pair + t_loo}
    return seconds, moments, pair, loo


# --- the per-fit baseline ----------------------------------------------------------------

def baseline_fit(x: torch.Tensor, labels: np.ndarray, zi: np.ndarray, ui: np.ndarray,
                 basis_dims: list[int] | None = None) -> dict[str, float]:
    """Covariance recomputed from the embeddings for this fit; solve; R² per split. The ridge is
    lmdecomp's (each basis model's columns get α × that model's mean variance); ``basis_dims``
    are the widths of the basis models in column order (default: all DIM wide)."""
    # one gather of the fit's rows and columns: x[rows][:, cols] would copy the whole joint width
    zi, ui = torch.from_numpy(zi), torch.from_numpy(ui)
    train = torch.from_numpy(np.flatnonzero(labels == "train"))[:, None]
    z, u = x[train, zi], x[train, ui]
    cov = torch.cov(torch.cat([z, u], dim=1).T)
    p = len(zi)
    s_zz, s_zu = cov[:p, :p], cov[:p, p:]
    ridge = torch.from_numpy(lmd.ridge_penalty(torch.diagonal(s_zz).numpy(), basis_dims or [DIM] * (p // DIM), ALPHA))
    w_t = torch.linalg.solve(s_zz + torch.diag(ridge), s_zu)
    b = u.mean(0) - z.mean(0) @ w_t
    r2 = {}
    for s in lmd.SPLITS:
        m = torch.from_numpy(np.flatnonzero(labels == s))[:, None]
        zs, us = x[m, zi], x[m, ui]
        resid = us - zs @ w_t - b
        r2[s] = float(1 - (resid**2).sum() / ((us - us.mean(0)) ** 2).sum())
    return r2


# --- the real default zoo --------------------------------------------------------------------

def zoo_report(embeddings: Path, params_file: Path) -> dict:
    """The same three timings on the default run's real embeddings (no target: the zoo is small,
    N = 4,000 sequences, so the fits, not the pass over the rows, dominate). Every baseline fit
    is timed; nothing is extrapolated."""
    from lmdecomp.params import load_params, model_names

    names_ = model_names(load_params([params_file], params_file.parent / "workflow/schemas/params.schema.yaml"))
    folders = {n: embeddings / n for n in names_}
    missing = [str(f) for f in folders.values() if not (f / shards.MANIFEST).is_file()]
    if missing:
        raise SystemExit(f"--zoo: no embeddings at {', '.join(missing)}; run `make run` first")
    sec, moments, pair, loo = time_lmdecomp(folders)
    parts = list(lmd.aligned_shards(folders).rows)  # (split, float64 x in the moments' column order, seq_id)
    x_np = np.concatenate([x for _, x, _ in parts])
    labels = np.concatenate([np.asarray(split) for split, _, _ in parts])
    t_floor = floor_seconds(x_np)
    x = torch.from_numpy(x_np)
    dims = dict(zip(moments.names, moments.dims))
    # lmdecomp's R² per (basis, target, split); a leave-one-out basis is every other model
    ours = {((r["basis"],), r["target"], r["split"]): r["r2"] for r in pair}
    ours |= {(tuple(n for n in names_ if n != r["target"]), r["target"], r["split"]): r["r2"] for r in loo}
    t_base, check = 0.0, []
    for basis, target in sorted({(b, t) for b, t, _ in ours}):
        t, r2 = timed(lambda: baseline_fit(x, labels, moments.columns(basis), moments.columns([target]),
                                           [dims[b] for b in basis]))
        t_base += t
        check.append(max(abs(r2[s] - ours[basis, target, s]) for s in lmd.SPLITS))
    total = sec["total"]
    return {"models": names_, "dims": [dims[n] for n in names_], "rows": dict(moments.n),
            "seconds": {"accumulate_moments": sec["accumulate_moments"], "pairwise_all": sec["pairwise_all"],
                        "leave_one_out_all": sec["leave_one_out_all"], "lmdecomp_total": total,
                        "floor_dsyrk": t_floor, "baseline_all_fits": t_base},
            "baseline_over_lmdecomp": t_base / total, "lmdecomp_over_floor": total / t_floor,
            "baseline_vs_lmdecomp_max_abs_r2_diff": max(check)}


# --- fresh-process peak memory -------------------------------------------------------------

def child_rss(root: str) -> None:
    folders = {p.name: p for p in sorted(Path(root).iterdir()) if p.is_dir()}
    with lmd.blas_threads(THREADS):
        seconds, moments, _, _ = time_lmdecomp(folders)
    print(json.dumps({"rows": sum(moments.n.values()), "peak_rss_mib": peak_rss_mib(), "lmdecomp_seconds": seconds}))


def bound_flops(rows: int, models: int, dim: int) -> dict[str, float]:
    """Flops of the BLAS work an exact LMD from moments must do, for ``models`` models of
    width ``dim`` (p = q = dim, W = models·dim) and ``rows`` rows over all splits
    (docs/performance.md, "Why 1.5 × the floor is out of reach"):

    =============================================  ==========================
    moments of train, val, test: one syrk           rows·W²  (the floor's F)
    joint inverse: Cholesky W³/3 + inverse 2W³/3    W³
    leave-one-out scores: one Gram R Rᵀ per target  Σ_m q·W² = W³
    leave-one-out residual maps P_mm⁻¹ P_m·          2·q·W²
    pairwise, per basis: Cholesky, solve, scores    M·(p³/3 + 2·p²(W−p) + p²(W−p))
    =============================================  ==========================

    A syrk counts half the 2·m·n·k of a full product, as LAPACK/BLAS do. This is the
    least arithmetic known, not lmdecomp's own (its inverses are Cholesky plus inverse, and its
    residual maps dgemms). Held-out scores are one syrk of each fit's weights or residual map,
    shared by val and test (each split then needs only an elementwise trace): the pairwise ones
    p²·q per target since 2026-12-06 (2·p²(W−p) per basis before), the leave-one-out ones q·W²
    per target since 2026-12-07 (a triangular product per split, 2·W³ in all, before)."""
    width = models * dim
    terms = {
        "moments_syrk": float(rows) * width**2,
        "joint_inverse": float(width) ** 3,
        "loo_scores": float(width) ** 3,
        "loo_residual_maps": 2.0 * dim * width**2,
        "pairwise": models * (dim**3 / 3 + 3.0 * dim**2 * (width - dim)),
    }
    terms["total"] = sum(terms.values())
    return terms


def bound_seconds(floor_seconds_: float, rows: int, models: int, dim: int) -> tuple[float, float]:
    """(bound seconds, bound ÷ floor): :func:`bound_flops` at the floor's measured rate
    (rows·W² flops in ``floor_seconds_``)."""
    flops = bound_flops(rows, models, dim)
    over_floor = flops["total"] / flops["moments_syrk"]
    return floor_seconds_ * over_floor, over_floor


def floor_seconds(x: np.ndarray) -> float:
    """One dsyrk of the upper triangle of xᵀx, into an output allocated and touched before the
    clock starts (first touching a width² array costs ~1 s on this kind of VM: not arithmetic)."""
    cross = np.empty((x.shape[1], x.shape[1]))
    cross.fill(0.0)
    seconds, _ = timed(lambda: dsyrk(1.0, x.T, beta=0.0, c=cross.T, trans=0, lower=0, overwrite_c=1))
    return seconds


def chunked_floor(n_train: int, chunk_rows: int = 16_384) -> float:
    """The floor at sizes whose joint float64 matrix does not fit in memory (250,000 × 9,216 is
    18 GB): the same dsyrk, over row chunks of the regenerated data, timed per update into one
    cross-product (the data generation is not timed). Chunks of 1,024–16,384 rows run at the
    one-call speed on this machine, so this is still one rank-k update's arithmetic."""
    width = MODELS * DIM
    cross = np.zeros((width, width))
    seconds, pending = 0.0, []

    def update(rows):
        nonlocal seconds
        t, _ = timed(lambda: dsyrk(1.0, rows.T, beta=1.0, c=cross.T, trans=0, lower=0, overwrite_c=1))
        seconds += t

    for _, _, xs in iter_synthetic(n_train):
        pending.append(joint_float64(xs))
        if sum(len(p) for p in pending) >= chunk_rows:
            update(np.concatenate(pending))
            pending = []
    if pending:
        update(np.concatenate(pending))
    return seconds


def measure_rss(n_train: int, tmp: Path) -> dict:
    root = tmp / f"rss_{n_train}"
    write_synthetic(root, n_train)
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child-rss", str(root)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"RSS child failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["seconds"] = time.perf_counter() - start
    import shutil

    shutil.rmtree(root)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N = 4,000 train rows; RSS at 2,000 vs 4,000")
    parser.add_argument("--n-train", type=int, default=None, help="train rows (default 50,000)")
    parser.add_argument("--rss-sizes", type=int, nargs=2, default=None, help="train rows of the RSS runs (default 50000 200000)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds of lmdecomp and the floor at N (default 3); the target takes each arm's best")
    parser.add_argument("--models", type=int, default=None, help="number of models (default 12; --quick: 4)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    parser.add_argument("--zoo", type=Path, default=None, metavar="EMBEDDINGS",
                        help="also report the real default zoo from this folder (results/embeddings after `make run`)")
    parser.add_argument("--child-rss", metavar="ROOT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_rss:
        child_rss(args.child_rss)
        return 0
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1; got {args.repeats}")
    torch.set_num_threads(THREADS)
    global MODELS
    MODELS = args.models or (4 if args.quick else 12)
    n_pairs = MODELS * (MODELS - 1)
    n_train = args.n_train or (4000 if args.quick else 50_000)
    rss_sizes = tuple(args.rss_sizes or ((2000, 4000) if args.quick else (50_000, 200_000)))
    width = MODELS * DIM
    res: dict = {"models": MODELS, "dim": DIM, "latent_rank": RANK, "noise": NOISE, "alpha": ALPHA,
                 "split_rows": split_sizes(n_train), "shard_rows": SHARD_ROWS, "joint_width": width}

    with tempfile.TemporaryDirectory(prefix="bench_lmd_") as tmpdir, lmd.blas_threads(THREADS):
        tmp = Path(tmpdir)
        t_write, folders = timed(lambda: write_synthetic(tmp / "emb", n_train))
        print(f"wrote {MODELS} × {sum(split_sizes(n_train).values())} rows in {t_write:.1f}s", flush=True)

        x_np, labels = load_in_memory(n_train)  # the floor's input, held through the rounds
        n_all = x_np.shape[0]
        rounds = []
        for i in range(args.repeats):
            floor_first = i % 2 == 1  # alternating, so that a drift in the machine's speed reaches both arms
            if floor_first:
                t_floor_i = floor_seconds(x_np)
            sec, moments, pair, loo = time_lmdecomp(folders)
            if not floor_first:
                t_floor_i = floor_seconds(x_np)
            t_bound_i, _ = bound_seconds(t_floor_i, n_all, MODELS, DIM)
            rounds.append({**sec, "floor_dsyrk": t_floor_i, "bound": t_bound_i, "over_bound": sec["total"] / t_bound_i})
            print(f"round {i + 1}: lmdecomp {sec['total']:.1f}s (pass {sec['accumulate_moments']:.1f}, "
                  f"{n_pairs} pairwise {sec['pairwise_all']:.1f}, {MODELS} leave-one-out {sec['leave_one_out_all']:.1f}), "
                  f"floor dsyrk over {n_all} × {width} {t_floor_i:.1f}s → {rounds[-1]['over_bound']:.3f} of the bound",
                  flush=True)
            if i == 0:
                first_r2 = (pair, loo)
                cols = {n: moments.columns([n]) for n in moments.names}
                loo_cols = moments.columns([n for n in moments.names if n != "m00"])
            elif (pair, loo) != first_r2:
                raise SystemExit(f"round {i + 1} fitted other R² than round 1: LMD is not deterministic")
            del moments  # 3 × W² float64 (2 GB at W = 9,216)
        # Best of the rounds for each arm: on a shared machine, noise only ever adds time.
        best = min(rounds, key=lambda r: r["total"])
        t_acc, t_pair, t_loo, t_total = (best[k] for k in ("accumulate_moments", "pairwise_all", "leave_one_out_all", "total"))
        t_floor = min(r["floor_dsyrk"] for r in rounds)
        pair, loo = first_r2

        x = torch.from_numpy(x_np)
        sample_pairs = [("m00", "m01"), (names()[-1], "m02"), ("m01", names()[-1])]
        t_pairs_sample, check = 0.0, []
        for basis, target in sample_pairs:
            t, r2 = timed(lambda: baseline_fit(x, labels, cols[basis], cols[target]))
            t_pairs_sample += t
            ours = {r["split"]: r["r2"] for r in pair if r["basis"] == basis and r["target"] == target}
            check.append(max(abs(r2[s] - ours[s]) for s in lmd.SPLITS))
        target = "m00"
        t_loo_sample, r2 = timed(lambda: baseline_fit(x, labels, loo_cols, cols[target]))
        ours = {r["split"]: r["r2"] for r in loo if r["target"] == target}
        check.append(max(abs(r2[s] - ours[s]) for s in lmd.SPLITS))
        del x, x_np
        t_base = t_pairs_sample / len(sample_pairs) * n_pairs + t_loo_sample * MODELS
        print(f"baseline: {len(sample_pairs)} pairwise fits {t_pairs_sample:.1f}s, 1 LOO fit {t_loo_sample:.1f}s "
              f"→ extrapolated {t_base:.0f}s", flush=True)

        t_bound, bound_over_floor = bound_seconds(t_floor, n_all, MODELS, DIM)
        round_ratios = [r["over_bound"] for r in rounds]
        res.update({
            "seconds": {"write_shards": t_write, "accumulate_moments": t_acc, "pairwise_all": t_pair,
                        "leave_one_out_all": t_loo, "lmdecomp_total": t_total,
                        "floor_dsyrk": t_floor, "rounds": rounds, "baseline_sampled_pairwise_3": t_pairs_sample,
                        "baseline_sampled_loo_1": t_loo_sample, "baseline_extrapolated_all_fits": t_base},
            "baseline_vs_lmdecomp_max_abs_r2_diff": max(check),
            "floor_gflops_per_s": n_all * width**2 / t_floor / 1e9,
            "bound": {"flops": bound_flops(n_all, MODELS, DIM), "seconds": t_bound, "over_floor": bound_over_floor,
                      "lmdecomp_over_bound": t_total / t_bound, "lmdecomp_over_floor": t_total / t_floor,
                      "rounds_lmdecomp_over_bound": round_ratios},
            "mean_test_r2": {"pairwise": float(np.mean([r["r2"] for r in pair if r["split"] == "test"])),
                             "leave_one_out": float(np.mean([r["r2"] for r in loo if r["split"] == "test"]))},
        })
        rss = {}
        for n in rss_sizes:
            rss[n] = measure_rss(n, tmp)
            print(f"RSS N={n}: {rss[n]['peak_rss_mib']:.0f} MiB ({rss[n]['seconds']:.0f}s)", flush=True)
        res["peak_rss"] = {str(k): v for k, v in rss.items()}
        # Context, no target: the fits do not grow with N, so lmdecomp ÷ floor falls with N.
        big = rss_sizes[1]
        t_floor_big = chunked_floor(big)
        t_total_big = rss[big]["lmdecomp_seconds"]["total"]
        t_bound_big, bound_over_floor_big = bound_seconds(t_floor_big, rss[big]["rows"], MODELS, DIM)
        res["large_n"] = {"train_rows": big, "rows": rss[big]["rows"], "floor_dsyrk_chunked": t_floor_big,
                          "lmdecomp_seconds": rss[big]["lmdecomp_seconds"],
                          "bound_seconds": t_bound_big, "bound_over_floor": bound_over_floor_big,
                          "lmdecomp_over_bound": t_total_big / t_bound_big,
                          "lmdecomp_over_floor": t_total_big / t_floor_big}
        print(f"N={big}: lmdecomp {t_total_big:.1f}s, floor (chunked dsyrk) {t_floor_big:.1f}s, bound "
              f"{t_bound_big:.1f}s → {res['large_n']['lmdecomp_over_bound']:.2f} of the bound, "
              f"{res['large_n']['lmdecomp_over_floor']:.2f} of the floor", flush=True)

    small, large = (rss[n]["peak_rss_mib"] for n in rss_sizes)
    targets = [
        ("baseline (extrapolated) time / lmdecomp total", ">= 10", t_base / t_total, t_base / t_total >= 10),
        (f"lmdecomp total / bound, N={n_train}, best of {len(rounds)}", "<= 1.15",
         f"{t_total / t_bound:.3f} [{min(round_ratios):.3f}, {max(round_ratios):.3f}] (floor {t_total / t_floor:.3f})",
         t_total / t_bound <= BOUND_TARGET),
        (f"lmdecomp total / bound, N={big} (RSS child)", "<= 1.15",
         f"{res['large_n']['lmdecomp_over_bound']:.3f} (floor {res['large_n']['lmdecomp_over_floor']:.3f})",
         res["large_n"]["lmdecomp_over_bound"] <= BOUND_TARGET),
        (f"peak RSS N={rss_sizes[1]} vs N={rss_sizes[0]} (MiB)", "<= 1.10x + 100 MiB", f"{large:.0f} vs {small:.0f}", large <= 1.10 * small + 100),
    ]
    print(f"\n{'target':<50} {'wanted':<20} {'measured':<36} result")
    for name, wanted, measured, ok in targets:
        shown = f"{measured:.3f}" if isinstance(measured, float) else measured
        print(f"{name:<50} {wanted:<20} {shown:<36} {'PASS' if ok else 'FAIL'}")
    print(f"\ndetail: accumulate {t_acc:.1f}s, pairwise {t_pair:.1f}s, leave-one-out {t_loo:.1f}s, "
          f"floor {t_floor:.1f}s, bound {t_bound:.1f}s ({bound_over_floor:.3f} × floor; at N={big}: "
          f"{bound_over_floor_big:.3f} × floor), R² check vs baseline {max(check):.1e}")
    if args.zoo:
        with lmd.blas_threads(THREADS):
            zoo = res["zoo"] = zoo_report(args.zoo, Path(__file__).resolve().parents[1] / "params.yaml")
        sec = zoo["seconds"]
        print(f"\nreal default zoo ({len(zoo['models'])} models, widths {zoo['dims']}, rows {zoo['rows']}; no target):")
        print(f"  accumulate {sec['accumulate_moments']:.2f}s, pairwise {sec['pairwise_all']:.2f}s, "
              f"leave-one-out {sec['leave_one_out_all']:.2f}s, total {sec['lmdecomp_total']:.2f}s; "
              f"floor {sec['floor_dsyrk']:.3f}s; per-fit baseline, every fit timed, {sec['baseline_all_fits']:.2f}s")
        print(f"  baseline / lmdecomp {zoo['baseline_over_lmdecomp']:.1f}, lmdecomp / floor {zoo['lmdecomp_over_floor']:.1f}, "
              f"R² check vs baseline {zoo['baseline_vs_lmdecomp_max_abs_r2_diff']:.1e}")

    res["environment"] = {
        "python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
        "threads": THREADS, "cpu_count": os.cpu_count(), "quick": args.quick,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_average": os.getloadavg(),
    }
    res["targets"] = [{"name": n, "target": w, "measured": m, "pass": ok} for n, w, m, ok in targets]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0 if all(ok for *_, ok in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
