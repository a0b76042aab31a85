"""Uncertainty of fine-tuning results: bootstrap intervals over test examples, the paired
bootstrap of a variant's difference from the dense base, and the claim's three-valued verdict.

What varies and what is held fixed. A variant is fine-tuned with several seeds (head init,
dropout, batch order); its *score* is the task metric averaged over seeds,
``m̄ = (1/S) Σ_s metric(pred_s, gold)``. The test examples are a sample of the task, so a
replicate r resamples the n test example indices with replacement once,
``idx_r ∈ {0 … n−1}ⁿ``, and applies them to every seed of every variant:

    m̄_r(v) = (1/S_v) Σ_s metric(pred_{v,s}[idx_r], gold[idx_r])

— the metric is recomputed on the resample (MCC, F1 and the correlations are not means of
per-example scores). The interval of a variant is the percentile interval of m̄_r(v); the
difference from the base is paired, ``d_r = m̄_r(v) − m̄_r(base)`` on the *same* idx_r, so
examples both get right or both get wrong cancel.

With ``resample_seeds`` the replicate also redraws each variant's S seeds with replacement,
``m̄_r(v) = (1/S) Σ_j metric(pred_{v,s_rj}[idx_r], gold[idx_r])``, so the interval carries the
seed-to-seed spread too: the claim is about the fine-tuning recipe, not about three particular
runs (measured on the default tasks, the spread over seeds was as wide as the test-sample
interval). The draw ``s_r·`` is shared by all variants with the same number of seeds (seed j of
every variant has the same head init and batch order). With few seeds this under-states the
seed part of the variance by the factor (S − 1)/S; without ``resample_seeds`` the intervals
cover the test-sample uncertainty of these runs only.

Determinism: replicate r's indices come from ``numpy.random.default_rng([seed, r // 100])``,
row r mod 100 of that chunk's (100, n) draw, and its seed draw from
``default_rng([seed, r // 100, S])``, so the numbers depend on ``seed`` and ``replicates`` only
(not on memory), and the work is vectorised per chunk.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

__all__ = ["CHUNK", "CLAIM_COLUMNS", "MARGIN_POINTS", "VERDICTS", "resample_indices", "bootstrap_scores", "percentile_interval",
           "verdict", "compare_task"]

CHUNK = 100  # replicates drawn (and scored) together
MARGIN_POINTS = 1.0  # the claim: at most 1 point below the base
VERDICTS = ("holds", "fails", "inconclusive")
CLAIM_COLUMNS = ["task", "variant", "layers", "reference_layers", "parameters", "reference_parameters", "fewer_parameters",
                 "points_vs_reference", "points_lo", "points_hi", "ci_level", "verdict",
                 "points_vs_ceiling", "ceiling_lo", "ceiling_hi"]

Score = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (pred, gold) of shape (..., n) -> (...)


def resample_indices(n: int, replicates: int, seed: int) -> Iterator[np.ndarray]:
    """Chunks of at most :data:`CHUNK` rows of the (replicates, n) matrix of resampled test
    example indices (with replacement); chunk k is drawn from ``default_rng([seed, k])``."""
    if n < 1 or replicates < 1:
        raise ValueError(f"the bootstrap needs at least one test example and one replicate (got n={n}, replicates={replicates})")
    for k, start in enumerate(range(0, replicates, CHUNK)):
        rows = min(CHUNK, replicates - start)
        yield np.random.default_rng([seed, k]).integers(0, n, size=(rows, n))


def bootstrap_scores(predictions: Mapping[str, np.ndarray], gold: np.ndarray, score: Score, replicates: int,
                     seed: int, resample_seeds: bool = False) -> dict[str, np.ndarray]:
    """{name: (replicates,) seed-averaged scores m̄_r} for every (seeds, n) prediction matrix
    in ``predictions``, all on the same resamples (see the module docstring)."""
    gold = np.asarray(gold)
    preds = {name: np.asarray(p) for name, p in predictions.items()}
    for name, p in preds.items():
        if p.ndim != 2 or p.shape[1] != len(gold):
            raise ValueError(f"predictions of {name!r} have shape {p.shape}; expected (seeds, {len(gold)}) like the test labels")
    out: dict[str, list[np.ndarray]] = {name: [] for name in preds}
    for k, idx in enumerate(resample_indices(len(gold), replicates, seed)):
        g, rows = gold[idx], np.arange(len(idx))[:, None]
        picks: dict[int, np.ndarray] = {}  # (chunk, S) seed positions per seed count
        for name, p in preds.items():
            per_seed = np.stack([score(p_s[idx], g) for p_s in p])  # (S, chunk)
            if resample_seeds:
                if len(p) not in picks:
                    picks[len(p)] = np.random.default_rng([seed, k, len(p)]).integers(0, len(p), size=(len(idx), len(p)))
                out[name].append(per_seed[picks[len(p)], rows].mean(axis=1))
            else:
                out[name].append(per_seed.mean(axis=0))
    return {name: np.concatenate(parts) for name, parts in out.items()}


def percentile_interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    """The ``(1 − level)/2`` and ``(1 + level)/2`` quantiles of ``samples`` (numpy's linear
    interpolation between order statistics)."""
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    lo, hi = np.quantile(np.asarray(samples, dtype=np.float64), [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def verdict(lo: float, hi: float, fewer_parameters: bool, margin: float = MARGIN_POINTS) -> str:
    """The MPOBERT claim — *fewer parameters than the base and at most ``margin`` points
    below it* — judged on the closed interval [lo, hi] of the difference (points = 100 × the
    metric difference, variant − base):

    * ``fails`` when the variant does not have fewer parameters (equal or more): the parameter
      count is exact, so that half of the claim is false whatever the interval says;
    * ``holds`` when ``lo ≥ −margin``: every difference in the interval satisfies the claim
      (an interval starting exactly at −1 point holds, as "within 1 point" includes 1);
    * ``fails`` when ``hi < −margin``: no difference in it does (ending exactly at −1 is not
      below −1, so that interval is inconclusive);
    * ``inconclusive`` otherwise (``lo < −margin ≤ hi``): the test set cannot decide.

    A 90% two-sided interval makes each of ``holds``/``fails`` a one-sided 95% decision."""
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi:
        raise ValueError(f"the difference interval must be finite with lo ≤ hi, got [{lo}, {hi}]")
    if not fewer_parameters:
        return "fails"
    if lo >= -margin:
        return "holds"
    if hi < -margin:
        return "fails"
    return "inconclusive"


def _claim(task: str, run: Mapping, ref: Mapping, diff: np.ndarray, estimate: float, level: float) -> dict:
    lo, hi = percentile_interval(diff, level)
    fewer = run["parameters"] < ref["parameters"]
    return {"task": task, "variant": run["variant"], "layers": run["layers"], "reference_layers": ref["layers"],
            "parameters": run["parameters"], "reference_parameters": ref["parameters"], "fewer_parameters": fewer,
            "points_vs_reference": round(estimate, 4), "points_lo": round(lo, 4), "points_hi": round(hi, 4),
            "ci_level": level, "verdict": verdict(lo, hi, fewer)}


def compare_task(task: str, runs: Sequence[Mapping], gold: np.ndarray, score: Score, replicates: int, level: float,
                 seed: int, reference: str = "dense", resample_seeds: bool = False, ceiling: str | None = None,
                 baselines: Sequence[str] = ()) -> tuple[dict[str, dict], list[dict]]:
    """Intervals for one task. ``runs``: one mapping per variant with ``variant``, ``layers``,
    ``parameters`` and ``predictions`` ((seeds, n) test predictions, example order as ``gold``).

    Returns ({variant: {test_metric, test_metric_lo, test_metric_hi, seed_min, seed_max,
    seed_std}}, claims) (``resample_seeds``: see :func:`bootstrap_scores`): the claims compare
    every variant deeper than ``reference`` with it (:func:`verdict`), except the ``baselines``
    (a probe, the deep dense ceiling: they frame the claims, they make none); none when
    ``reference`` is not among the runs. With a ``ceiling`` among the runs, each claim also
    gets the paired difference from it (``points_vs_ceiling`` with its interval), else None."""
    preds = {r["variant"]: np.asarray(r["predictions"]) for r in runs}
    boot = bootstrap_scores(preds, gold, score, replicates, seed, resample_seeds)
    stats = {}
    for name, p in preds.items():
        per_seed = np.array([float(score(p_s, np.asarray(gold))) for p_s in p])
        lo, hi = percentile_interval(boot[name], level)
        stats[name] = {"test_metric": float(per_seed.mean()), "test_metric_lo": lo, "test_metric_hi": hi,
                       "seeds": len(per_seed), "seed_min": float(per_seed.min()), "seed_max": float(per_seed.max()),
                       "seed_std": float(per_seed.std(ddof=1)) if len(per_seed) > 1 else 0.0}
    ref = next((r for r in runs if r["variant"] == reference), None)
    top = ceiling if ceiling in preds else None
    claims = []
    for run in runs if ref is not None else []:
        name = run["variant"]
        if run["layers"] > ref["layers"] and name not in baselines and name != top:
            estimate = 100 * (stats[name]["test_metric"] - stats[reference]["test_metric"])
            claim = _claim(task, run, ref, 100 * (boot[name] - boot[reference]), estimate, level)
            claim.update(points_vs_ceiling=None, ceiling_lo=None, ceiling_hi=None)
            if top is not None:
                lo, hi = percentile_interval(100 * (boot[name] - boot[top]), level)
                claim.update(points_vs_ceiling=round(100 * (stats[name]["test_metric"] - stats[top]["test_metric"]), 4),
                             ceiling_lo=round(lo, 4), ceiling_hi=round(hi, 4))
            claims.append(claim)
    return stats, claims
