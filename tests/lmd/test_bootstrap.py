"""lmdecomp.lmd.bootstrap: block-bootstrap replicates, intervals (also of selection steps), their
cache and memory budget, against explicit fits on resampled rows and the coverage of a known
population R²."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import moments_of, r2_direct, ridge_reference
from lmdecomp import lmd
from lmdecomp.lmd import bootstrap as lmd_bootstrap  # patched where the replicates are chunked

SPLIT_NAMES = np.array(lmd.SPLITS, dtype=object)


def test_bootstrap_replicates_of_a_two_model_basis_use_each_models_own_ridge():
    """A replicate's ridge is recomputed per basis model from the replicate's train moments:
    equal to an explicit ridge fit on resampled rows with two basis models at scales 1 and 100."""
    rng = np.random.default_rng(17)
    n, n_blocks = 320, 10
    z1, z2 = rng.normal(size=(n, 3)), 100 * rng.normal(size=(n, 2))
    u = z1 @ rng.normal(size=(3, 2)) + z2 @ rng.normal(size=(2, 2)) / 100 + rng.normal(size=(n, 2))
    split = rng.choice(SPLIT_NAMES, size=n, p=[0.6, 0.2, 0.2])
    edges = np.linspace(0, n, n_blocks + 1).astype(int)
    blocks = [moments_of([z1[lo:hi], z2[lo:hi], u[lo:hi]], ["a", "b", "u"], split[lo:hi])
              for lo, hi in zip(edges[:-1], edges[1:])]
    samples = lmd.bootstrap_r2_samples(blocks, ["a", "b"], "u", 0.3, n_boot=5, seed=2, split=["val", "test"])
    z = np.hstack([z1, z2])
    for r, w in enumerate(lmd.bootstrap_weights(n_blocks, 5, seed=2)):
        rows = np.concatenate([np.arange(lo, hi) for lo, hi, k in zip(edges[:-1], edges[1:], w) for _ in range(k)])
        train = rows[split[rows] == "train"]
        wt, bias = ridge_reference(z[train], u[train], 0.3, [3, 2])
        for s in ("val", "test"):
            held = rows[split[rows] == s]
            assert samples[s][r] == pytest.approx(r2_direct(z[held], u[held], wt, bias), abs=1e-9)


def _planted_blocks(rng, n, n_blocks, p=3, q=2, sigma=1.0):
    """z ~ N(2, I_p), u = zB + 1 + σ ε: population pooled R² = 1 − qσ² / (tr BᵀB + qσ²)."""
    b = np.array([[1.0, 0.5], [-0.5, 1.0], [0.3, -0.2]])[:p, :q]
    z = rng.normal(size=(n, p)) + 2
    u = z @ b + 1.0 + sigma * rng.normal(size=(n, q))
    true_r2 = 1 - q * sigma**2 / (np.trace(b.T @ b) + q * sigma**2)
    split = rng.choice(SPLIT_NAMES, size=n, p=[0.6, 0.2, 0.2])
    edges = np.linspace(0, n, n_blocks + 1).astype(int)
    blocks = [moments_of([z[lo:hi], u[lo:hi]], ["z", "u"], split[lo:hi]) for lo, hi in zip(edges[:-1], edges[1:])]
    return z, u, split, edges, blocks, true_r2


@pytest.mark.parametrize("alpha", [0.0, 0.2])
def test_bootstrap_replicates_equal_fits_on_explicitly_resampled_rows(alpha):
    rng = np.random.default_rng(13)
    z, u, split, edges, blocks, _ = _planted_blocks(rng, 300, 12)
    samples = lmd.bootstrap_r2_samples(blocks, ["z"], "u", alpha, n_boot=6, seed=5, split="val")
    weights = lmd.bootstrap_weights(len(blocks), 6, seed=5)
    assert weights.shape == (6, 12) and (weights.sum(1) == 12).all()
    for r, w in enumerate(weights):
        rows = np.concatenate([np.arange(lo, hi) for lo, hi, k in zip(edges[:-1], edges[1:], w) for _ in range(k)])
        train, val = rows[split[rows] == "train"], rows[split[rows] == "val"]
        wt, bias = ridge_reference(z[train], u[train], alpha)
        assert samples[r] == pytest.approx(r2_direct(z[val], u[val], wt, bias), abs=1e-9)
    # BlockMoments or a list of Moments: the same replicates.
    np.testing.assert_array_equal(
        lmd.bootstrap_r2_samples(lmd.BlockMoments.from_moments(blocks), ["z"], "u", alpha, n_boot=6, seed=5,
                                 split="val"), samples)


def test_bootstrap_interval_covers_the_population_r2_at_its_level():
    hits = 0
    for rep in range(100):
        rng = np.random.default_rng(1000 + rep)
        *_, blocks, true_r2 = _planted_blocks(rng, 2400, 40)
        lo, hi = lmd.bootstrap_r2(blocks, ["z"], "u", 0.0, n_boot=200, seed=rep, level=0.9)
        assert lo < hi
        hits += lo <= true_r2 <= hi
    assert 80 <= hits <= 97


@pytest.mark.slow
def test_recentred_interval_covers_where_the_percentile_interval_is_biased_low():
    """A basis 40 wide for ~720 train rows: bootstrap refits on resampled blocks overfit more than
    the real fit (duplicated rows), so their test R² sits about one standard error low. The
    truth is the expected population R² of the fit at this train size (Monte Carlo over fresh
    data sets; z ~ N(0, I) gives it in closed form per fit)."""
    p, q, n, sigma = 40, 4, 1200, 1.0
    b = np.random.default_rng(0).normal(size=(p, q)) * 0.25

    def draw(seed):
        rng = np.random.default_rng(seed)
        z = rng.normal(size=(n, p))
        return z, z @ b + sigma * rng.normal(size=(n, q)), rng.choice(SPLIT_NAMES, size=n, p=[0.6, 0.2, 0.2])

    def population_r2(fit):
        # E‖u − Wz − c‖² = ‖B − Wᵀ‖² + qσ² + ‖c‖² for z ~ N(0, I), u = zB + σε
        return 1 - (np.sum((b - fit.weight.T) ** 2) + q * sigma**2 + fit.bias @ fit.bias) / (np.sum(b**2) + q * sigma**2)

    truth = np.mean([population_r2(lmd.fit_ridge(moments_of(list(draw(10_000 + r)[:2]), ["z", "u"], draw(10_000 + r)[2]),
                                                 ["z"], "u", 0.0)) for r in range(200)])
    centred = percentile = 0
    shifts = []
    for rep in range(200):
        z, u, split = draw(rep)
        edges = np.linspace(0, n, 41).astype(int)
        blocks = lmd.BlockMoments.from_moments(
            [moments_of([z[lo:hi], u[lo:hi]], ["z", "u"], split[lo:hi]) for lo, hi in zip(edges[:-1], edges[1:])])
        samples = lmd.bootstrap_r2_samples(blocks, ["z"], "u", 0.0, n_boot=200, seed=rep)
        total = blocks.total()
        estimate = lmd.r_squared(total, lmd.fit_ridge(total, ["z"], "u", 0.0), "test")
        lo, hi = np.quantile(samples, [0.05, 0.95])
        percentile += lo <= truth <= hi
        lo, hi = lmd.bootstrap_r2(blocks, ["z"], "u", 0.0, n_boot=200, seed=rep, level=0.9)
        assert lo <= estimate <= hi
        centred += lo <= truth <= hi
        shifts.append(np.median(samples) - estimate)
    assert np.mean(shifts) < -0.01  # the replicates' location bias this corrects
    assert percentile < 160  # plain percentile: ≈ 65% here
    assert 160 <= centred <= 194  # re-centred: ≈ 90%


def test_bootstrap_refuses_a_grid_and_replicates_without_the_scored_split():
    rng = np.random.default_rng(14)
    *_, blocks, _ = _planted_blocks(rng, 200, 10)
    with pytest.raises(lmd.LMDError, match="one α"):
        lmd.bootstrap_r2(blocks, ["z"], "u", [0.1, 1.0])
    only_train = lmd.Moments(["z", "u"], [3, 2])
    only_train.update("train", rng.normal(size=(30, 5)))
    with pytest.raises(lmd.LMDError, match="replicates have an empty"):
        lmd.bootstrap_r2([*blocks[:2], only_train], ["z"], "u", 0.1, n_boot=50)


def test_selection_intervals_are_the_bootstrap_of_each_steps_basis():
    rng = np.random.default_rng(16)
    n, names = 1200, ["m0", "m1", "m2", "u"]
    xs = [rng.normal(size=(n, w)) for w in (4, 3, 5)]
    u = xs[0] @ rng.normal(size=(4, 3)) + xs[2] @ rng.normal(size=(5, 3)) + rng.normal(size=(n, 3))
    split = rng.choice(SPLIT_NAMES, size=n, p=[0.6, 0.2, 0.2])
    edges = np.linspace(0, n, 21).astype(int)
    blocks = lmd.BlockMoments.from_moments(
        [moments_of([x[lo:hi] for x in [*xs, u]], names, split[lo:hi]) for lo, hi in zip(edges[:-1], edges[1:])])
    rows = lmd.greedy_selection(blocks.total(), "u", [0.01, 1.0])
    got = lmd.add_selection_intervals(rows, blocks, n_boot=40, level=0.8, seed=2)
    basis = []
    for row in got:
        basis.append(row["added_model"])
        for s in ("val", "test"):
            lo, hi = lmd.bootstrap_r2(blocks, basis, "u", row["alpha"], n_boot=40, seed=2, level=0.8, split=s)
            assert (row[f"{s}_r2_lo"], row[f"{s}_r2_hi"]) == pytest.approx((lo, hi), abs=1e-10)
            assert row[f"{s}_r2_lo"] <= row[f"{s}_r2"] <= row[f"{s}_r2_hi"]
    assert [r["k"] for r in got] == [1, 2, 3]


def test_one_bootstrap_cache_shares_the_fits_that_the_tables_have_in_common():
    """lmd_fit's three tables through one cache: a selection step whose basis (as a set), target
    and α equal a pairwise or leave-one-out fit reuses that fit's replicates; every interval
    equals the one drawn without a cache (to rounding: the basis order differs)."""
    rng = np.random.default_rng(17)
    n, names = 900, ["m0", "m1", "m2", "m3"]
    latent = rng.normal(size=(n, 3))
    xs = [latent @ rng.normal(size=(3, w)) + rng.normal(size=(n, w)) for w in (4, 3, 5, 2)]
    split = rng.choice(SPLIT_NAMES, size=n, p=[0.6, 0.2, 0.2])
    edges = np.linspace(0, n, 16).astype(int)
    blocks = lmd.BlockMoments.from_moments(
        [moments_of([x[lo:hi] for x in xs], names, split[lo:hi]) for lo, hi in zip(edges[:-1], edges[1:])])
    total, grid = blocks.total(), [0.01, 1.0]
    pairwise, loo = lmd.fit_pairwise(total, grid), lmd.fit_leave_one_out(total, grid)
    selection = [row for t in names for row in lmd.greedy_selection(total, t, grid)]
    ci = dict(n_boot=30, level=0.9, seed=5)
    cache = lmd.BootstrapCache(blocks, 30, 5)
    shared = [lmd.add_confidence_intervals(pairwise, blocks, **ci, cache=cache),
              lmd.add_confidence_intervals(loo, blocks, **ci, cache=cache),
              lmd.add_selection_intervals(selection, blocks, **ci, cache=cache)]
    alone = [lmd.add_confidence_intervals(pairwise, blocks, **ci), lmd.add_confidence_intervals(loo, blocks, **ci),
             lmd.add_selection_intervals(selection, blocks, **ci)]
    for got, expected in zip(shared, alone):
        for g, e in zip(got, expected):
            for key in (k for k in e if k.endswith(("_lo", "_hi"))):
                assert g[key] == pytest.approx(e[key], abs=1e-12)
    # the fits drawn: every pairwise and leave-one-out fit, plus the selection steps that are neither
    fits = {(frozenset([r["basis"]]), r["target"], r["alpha"]) for r in pairwise}
    fits |= {(frozenset(n for n in names if n != r["target"]), r["target"], r["alpha"]) for r in loo}
    n_table_fits = len(fits)
    for row in selection:
        basis = [r["added_model"] for r in selection if r["target"] == row["target"] and r["k"] <= row["k"]]
        fits.add((frozenset(basis), row["target"], row["alpha"]))
    assert len(cache) == len(fits) < n_table_fits + len(selection)
    with pytest.raises(lmd.LMDError, match="one set of block moments, n_boot and seed"):
        lmd.add_selection_intervals(selection, blocks, n_boot=30, level=0.9, seed=6, cache=cache)


def test_bootstrap_memory_stays_within_its_documented_budget(monkeypatch):
    """Peak allocation of bootstrap_r2_samples ≤ the gathered block cross-products + 3 arrays of
    (chunk, w, w) float64 (its docstring); it was ≈ 6 arrays when every split's scatter and the
    centring temporaries were alive at once. The chunk size must not change any replicate."""
    import tracemalloc

    rng = np.random.default_rng(18)
    n, n_blocks, widths = 600, 6, (48, 32, 16)
    xs = [rng.normal(size=(n, d)) for d in widths]
    split = rng.choice(SPLIT_NAMES, size=n, p=[0.6, 0.2, 0.2])
    edges = np.linspace(0, n, n_blocks + 1).astype(int)
    blocks = lmd.BlockMoments.from_moments([moments_of([x[lo:hi] for x in xs], ["a", "b", "u"], split[lo:hi])
                                            for lo, hi in zip(edges[:-1], edges[1:])])
    args = (blocks, ["a", "b"], "u", 0.1)
    whole = lmd.bootstrap_r2_samples(*args, n_boot=60, seed=3, split=["train", "val", "test"])
    w = sum(widths)
    monkeypatch.setattr(lmd_bootstrap, "_BOOTSTRAP_ARRAY_BYTES", 20 * w * w * 8)  # chunks of 20 replicates
    tracemalloc.start()
    try:
        chunked = lmd.bootstrap_r2_samples(*args, n_boot=60, seed=3, split=["train", "val", "test"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    gathered = 3 * n_blocks * w * w * 8
    assert peak <= gathered + 3 * 20 * w * w * 8
    for s in lmd.SPLITS:
        np.testing.assert_array_equal(chunked[s], whole[s])


def test_a_selection_paths_replicates_equal_each_steps_own_bootstrap_and_explicit_refits():
    """path_r2_samples shares one Cholesky factor per replicate and α across the nested bases of a
    path: every step's replicates equal bootstrap_r2_samples of that step alone (1e-12) and, for
    the first replicates, an explicit ridge fit on the resampled rows (1e-9)."""
    rng = np.random.default_rng(23)
    n, names, widths = 600, ["m0", "m1", "m2", "u"], (3, 4, 2, 2)
    latent = rng.normal(size=(n, 3))
    xs = [latent @ rng.normal(size=(3, w)) + rng.normal(size=(n, w)) for w in widths]
    split = rng.choice(SPLIT_NAMES, size=n, p=[0.6, 0.2, 0.2])
    edges = np.linspace(0, n, 13).astype(int)
    blocks = lmd.BlockMoments.from_moments(
        [moments_of([x[lo:hi] for x in xs], names, split[lo:hi]) for lo, hi in zip(edges[:-1], edges[1:])])
    path, alphas = ["m2", "m0", "m1"], [0.5, 0.01, 0.5]  # steps 1 and 3 share a factor
    got = lmd_bootstrap.path_r2_samples(blocks, path, "u", alphas, n_boot=9, seed=4, splits=lmd.SPLITS)
    weights = lmd.bootstrap_weights(len(blocks), 9, seed=4)
    for k, alpha in enumerate(alphas, 1):
        alone = lmd.bootstrap_r2_samples(blocks, path[:k], "u", alpha, n_boot=9, seed=4, split=list(lmd.SPLITS))
        for s in lmd.SPLITS:
            np.testing.assert_allclose(got[k - 1][s], alone[s], rtol=0, atol=1e-12)
        z = np.hstack([xs[names.index(m)] for m in path[:k]])
        for r, w in enumerate(weights[:3]):
            rows = np.concatenate([np.arange(lo, hi) for lo, hi, c in zip(edges[:-1], edges[1:], w) for _ in range(c)])
            train = rows[split[rows] == "train"]
            wt, bias = ridge_reference(z[train], xs[3][train], alpha, [widths[names.index(m)] for m in path[:k]])
            held = rows[split[rows] == "test"]
            assert got[k - 1]["test"][r] == pytest.approx(r2_direct(z[held], xs[3][held], wt, bias), abs=1e-9)


def test_train_factor_refuses_a_scatter_that_is_not_positive_definite():
    """The shared factor is L Lᵀ = S_zz + diag λ; None (the path then refits that step by LU) where
    the matrix is not positive definite."""
    s_zz = np.array([[[1.0, 2.0], [2.0, 1.0]], [[2.0, 0.5], [0.5, 1.0]]])  # indefinite; definite
    assert lmd_bootstrap.nested.train_factor(s_zz, [2], 0.0) is None
    factor = lmd_bootstrap.nested.train_factor(s_zz[1:], [1, 1], 0.5)  # λ = 0.5 · S_jj per column
    np.testing.assert_allclose(factor[0] @ factor[0].T, s_zz[1] + np.diag([1.0, 0.5]), rtol=0, atol=1e-15)


def test_one_forward_solve_serves_every_prefix():
    """prefix_solve on the shared forward solution equals a direct solve of each leading block:
    forward substitution reads the leading rows only (lmdecomp.lmd.nested's module doc)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 40, 6))
    s_zz, s_zu = np.einsum("rni,rnj->rij", x, x), rng.standard_normal((2, 6, 3))
    factor = lmd_bootstrap.nested.train_factor(s_zz, [2, 1, 3], 0.1)
    forward = lmd_bootstrap.nested.forward_solve(factor, s_zu)
    regularised = factor @ np.swapaxes(factor, 1, 2)
    for width in (2, 3, 6):
        want = np.linalg.solve(regularised[:, :width, :width], s_zu[:, :width])
        np.testing.assert_allclose(lmd_bootstrap.nested.prefix_solve(factor, forward, width), want, rtol=1e-12, atol=1e-12)
