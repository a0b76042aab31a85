"""Bootstrap intervals of fine-tuning metrics, the paired difference from the base, the verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmdecomp.mpo import intervals, metrics


def test_resampling_is_seeded_and_does_not_depend_on_how_many_replicates_follow():
    a = np.concatenate(list(intervals.resample_indices(50, 250, seed=3)))
    b = np.concatenate(list(intervals.resample_indices(50, 120, seed=3)))
    assert a.shape == (250, 50) and a.min() >= 0 and a.max() < 50
    assert np.array_equal(a[:120], b)
    assert np.array_equal(a, np.concatenate(list(intervals.resample_indices(50, 250, seed=3))))
    assert not np.array_equal(a, np.concatenate(list(intervals.resample_indices(50, 250, seed=4))))


def accuracy_dataset(rng, n):
    """Variant a (two seeds) and b (one seed) on n binary examples with a known accuracy
    difference: P(a right, b right) = .6, P(a only) = .15, P(b only) = .1 -> 0.75 - 0.70 = 0.05."""
    gold = rng.integers(0, 2, n)
    u = rng.random(n)
    a_right, b_right = u < 0.75, (u < 0.6) | (u >= 0.75) & (u < 0.85)
    a2_right = rng.random(n) < 0.75
    flip = lambda right: np.where(right, gold, 1 - gold)  # noqa: E731
    return gold, {"a": np.stack([flip(a_right), flip(a2_right)]), "b": flip(b_right)[None]}


def test_the_paired_bootstrap_interval_covers_a_known_accuracy_difference_at_the_nominal_rate():
    rng = np.random.default_rng(0)
    covered = 0
    for k in range(200):
        gold, preds = accuracy_dataset(rng, 300)
        boot = intervals.bootstrap_scores(preds, gold, metrics.accuracy, replicates=200, seed=k)
        lo, hi = intervals.percentile_interval(boot["a"] - boot["b"], 0.9)
        covered += lo <= 0.05 <= hi
    # 200 intervals at 90%: the count is Binomial(200, 0.9), sd 4.2; 3 sd either side
    assert 180 - 13 <= covered <= 180 + 13, covered


def test_the_paired_bootstrap_interval_covers_a_known_pearson_difference():
    """A metric that is no mean of per-example scores: gold z ~ N(0, 1), predictions z + σ e,
    Pearson correlation 1 / sqrt(1 + σ²)."""
    rng = np.random.default_rng(1)
    truth = 1 / math.sqrt(1 + 0.5**2) - 1 / math.sqrt(1 + 0.8**2)
    covered = 0
    for k in range(200):
        z = rng.normal(size=300)
        preds = {"a": (z + 0.5 * rng.normal(size=300))[None], "b": (z + 0.8 * rng.normal(size=300))[None]}
        boot = intervals.bootstrap_scores(preds, z, metrics.pearson, replicates=200, seed=k)
        lo, hi = intervals.percentile_interval(boot["a"] - boot["b"], 0.9)
        covered += lo <= truth <= hi
    assert 180 - 13 <= covered <= 180 + 13, covered


def test_compare_task_recomputes_the_metric_on_each_resample_for_every_seed():
    """Against an explicit loop over replicates and seeds, with MCC (not a mean over examples)."""
    rng = np.random.default_rng(2)
    gold = rng.integers(0, 3, 40)
    noisy = lambda p: np.where(rng.random(40) < p, gold, rng.integers(0, 3, 40))  # noqa: E731
    runs = [{"variant": "dense", "layers": 2, "parameters": 100, "predictions": np.stack([noisy(0.7), noisy(0.6)])},
            {"variant": "deep", "layers": 8, "parameters": 90, "predictions": np.stack([noisy(0.8), noisy(0.5), noisy(0.7)])},
            {"variant": "same", "layers": 2, "parameters": 50, "predictions": noisy(0.9)[None]}]
    score = lambda p, g: metrics.mcc(p, g, 3)  # noqa: E731
    stats, claims = intervals.compare_task("t", runs, gold, score, replicates=150, level=0.8, seed=5)
    idx = np.concatenate(list(intervals.resample_indices(40, 150, seed=5)))
    loop = {r["variant"]: [sum(float(metrics.mcc(p[i], gold[i], 3)) for p in r["predictions"]) / len(r["predictions"]) for i in idx]
            for r in runs}
    per_seed = [float(metrics.mcc(p, gold, 3)) for p in runs[1]["predictions"]]
    assert stats["deep"]["test_metric"] == pytest.approx(np.mean(per_seed), abs=1e-12)
    assert (stats["deep"]["seed_min"], stats["deep"]["seed_max"]) == (min(per_seed), max(per_seed))
    assert stats["deep"]["seed_std"] == pytest.approx(np.std(per_seed, ddof=1), abs=1e-12)
    assert (stats["deep"]["test_metric_lo"], stats["deep"]["test_metric_hi"]) == pytest.approx(np.quantile(loop["deep"], [0.1, 0.9]), abs=1e-12)
    assert [c["variant"] for c in claims] == ["deep"]  # only deeper variants are compared with dense
    diff = 100 * (np.array(loop["deep"]) - np.array(loop["dense"]))
    (claim,) = claims
    assert (claim["points_lo"], claim["points_hi"]) == pytest.approx(np.quantile(diff, [0.1, 0.9]), abs=1e-4)
    assert claim["points_vs_reference"] == pytest.approx(100 * (stats["deep"]["test_metric"] - stats["dense"]["test_metric"]), abs=1e-4)
    assert claim["fewer_parameters"] and claim["verdict"] == intervals.verdict(claim["points_lo"], claim["points_hi"], True)
    assert list(claim) == intervals.CLAIM_COLUMNS


def test_baselines_make_no_claim_and_every_claim_gets_its_paired_difference_from_the_ceiling():
    """A probe and the deep dense model frame the claims: no claim rows of their own, and the
    shared variant's difference from the ceiling against an explicit loop over the resamples."""
    rng = np.random.default_rng(3)
    gold = rng.integers(0, 2, 60)
    noisy = lambda p: np.where(rng.random(60) < p, gold, 1 - gold)  # noqa: E731
    runs = [{"variant": "dense", "layers": 2, "parameters": 100, "predictions": noisy(0.7)[None]},
            {"variant": "probe", "layers": 2, "parameters": 100, "predictions": noisy(0.6)[None]},
            {"variant": "shared", "layers": 8, "parameters": 60, "predictions": noisy(0.75)[None]},
            {"variant": "ceiling", "layers": 8, "parameters": 400, "predictions": noisy(0.85)[None]}]
    acc = lambda p, g: (p == g).mean(axis=-1)  # noqa: E731
    stats, claims = intervals.compare_task("t", runs, gold, acc, replicates=120, level=0.9, seed=1, ceiling="ceiling",
                                           baselines=["probe"])
    assert [c["variant"] for c in claims] == ["shared"]
    idx = np.concatenate(list(intervals.resample_indices(60, 120, seed=1)))
    r = {v["variant"]: np.array([float(acc(v["predictions"][0][i], gold[i])) for i in idx]) for v in runs}
    (claim,) = claims
    assert (claim["ceiling_lo"], claim["ceiling_hi"]) == pytest.approx(np.quantile(100 * (r["shared"] - r["ceiling"]), [0.05, 0.95]), abs=1e-4)
    assert claim["points_vs_ceiling"] == pytest.approx(100 * (stats["shared"]["test_metric"] - stats["ceiling"]["test_metric"]), abs=1e-4)
    _, without = intervals.compare_task("t", runs[:3], gold, acc, replicates=120, level=0.9, seed=1, ceiling="ceiling")
    assert [c["points_vs_ceiling"] for c in without] == [None]  # no ceiling among the runs


@pytest.mark.parametrize("lo, hi, fewer, want", [
    (-0.5, 2.0, True, "holds"),
    (-1.0, 0.3, True, "holds"),  # starts exactly at -1 point: within 1 point
    (-1.0001, 3.0, True, "inconclusive"),
    (-3.0, -1.0, True, "inconclusive"),  # ends exactly at -1 point: not below it
    (-3.0, -1.0001, True, "fails"),
    (-1.0, -1.0, True, "holds"),
    (0.5, 2.0, False, "fails"),  # as good, but not fewer parameters
    (-3.0, -2.0, False, "fails"),
])
def test_the_verdict_on_hand_made_intervals_including_the_edges(lo, hi, fewer, want):
    assert intervals.verdict(lo, hi, fewer) == want


def test_a_broken_interval_is_an_error_not_a_verdict():
    with pytest.raises(ValueError, match="finite"):
        intervals.verdict(float("nan"), 1.0, True)
    with pytest.raises(ValueError, match="lo ≤ hi"):
        intervals.verdict(2.0, 1.0, True)
    with pytest.raises(ValueError, match="expected \\(seeds, 3\\)"):
        intervals.bootstrap_scores({"a": np.zeros(3)}, np.zeros(3), metrics.accuracy, 10, 0)


def test_resampling_seeds_redraws_them_per_replicate_and_widens_the_interval_by_their_spread():
    rng = np.random.default_rng(3)
    gold = rng.integers(0, 2, 200)
    right = lambda p: np.where(rng.random(200) < p, gold, 1 - gold)  # noqa: E731
    spread = np.stack([right(0.6), right(0.9), right(0.75)])  # seeds far apart
    same = np.stack([right(0.8)] * 3)  # three identical seeds
    plain = intervals.bootstrap_scores({"spread": spread, "same": same}, gold, metrics.accuracy, 250, seed=1)
    redrawn = intervals.bootstrap_scores({"spread": spread, "same": same}, gold, metrics.accuracy, 250, seed=1, resample_seeds=True)
    assert np.allclose(redrawn["same"], plain["same"], atol=1e-12)  # nothing to redraw
    # an explicit loop: replicate r of chunk k averages the seeds drawn by default_rng([seed, k, S])
    idx = list(intervals.resample_indices(200, 250, seed=1))
    want = []
    for k, chunk in enumerate(idx):
        picks = np.random.default_rng([1, k, 3]).integers(0, 3, size=(len(chunk), 3))
        for i, row in zip(chunk, picks):
            want.append(np.mean([float(metrics.accuracy(spread[s][i], gold[i])) for s in row]))
    assert redrawn["spread"] == pytest.approx(want, abs=1e-12)
    width = lambda samples: np.subtract(*intervals.percentile_interval(samples, 0.9)[::-1])  # noqa: E731
    assert width(redrawn["spread"]) > 2 * width(plain["spread"])
