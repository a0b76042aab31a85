"""α selection on val, block moments and the block bootstrap, greedy basis selection —
each against an independent reference (per-α solves, explicit resampled rows, brute force)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from conftest import moments_of, r2_direct, ridge_reference, write_embeddings
from lmdecomp import lmd
from lmdecomp.lmd import bootstrap as lmd_bootstrap  # patched where the replicates are chunked

SPLIT_NAMES = np.array(lmd.SPLITS, dtype=object)
GRID = [0.0, 1e-3, 1e-2, 0.03, 0.1, 0.3, 1.0, 3.0]


@pytest.fixture(scope="module")
def noisy():
    """Few train rows for wide bases and weak shared signal, so ridge helps and the val
    optimum of α lies inside the grid for some fits."""
    rng = np.random.default_rng(10)
    n = 260
    latent = rng.normal(size=(n, 4))
    widths = [12, 9, 15, 6]
    blocks = [latent @ rng.normal(size=(4, w)) * 0.5 + rng.normal(size=w) * 2 + rng.normal(size=(n, w))
              for w in widths]
    split = rng.choice(SPLIT_NAMES, size=n, p=[0.5, 0.25, 0.25])
    names = ["a", "b", "c", "d"]
    return blocks, names, split, moments_of(blocks, names, split)


# ----------------------------------------------------------------------- α selection


def test_targets_sharing_a_basis_equal_per_alpha_fit_ridge(noisy):
    """fit_targets solves every target of a basis with one factor per α; each target's fit and
    its val table equal separate fit_ridge / r_squared calls for every α of the grid."""
    blocks, names, split, m = noisy
    fits = lmd.fit_targets(m, ["a", "c"], ["b", "d"], GRID)
    for target in ("b", "d"):
        fit, table = fits[target]
        per_alpha = [lmd.fit_ridge(m, ["a", "c"], target, alpha) for alpha in GRID]
        vals = [lmd.r_squared(m, f, "val") for f in per_alpha]
        np.testing.assert_allclose([row["val_r2"] for row in table], vals, rtol=0, atol=1e-10)
        chosen = per_alpha[int(np.argmax(vals))]
        assert fit.alpha == chosen.alpha
        np.testing.assert_allclose(fit.weight, chosen.weight, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(fit.bias, chosen.bias, rtol=1e-9, atol=1e-10)


def test_select_alpha_picks_the_brute_force_val_optimum(noisy):
    blocks, names, split, m = noisy
    chosen = []
    for target in names:
        for basis in ([n for n in names if n != target], [names[(names.index(target) + 1) % 4]]):
            fit, table = lmd.select_alpha(m, basis, target, GRID)
            brute = []
            for alpha in GRID:  # independent reference: one solve and one explicit score per α
                zi = np.hstack([blocks[names.index(b)] for b in basis])
                w, b = ridge_reference(zi[split == "train"], blocks[names.index(target)][split == "train"], alpha,
                                    [blocks[names.index(b)].shape[1] for b in basis])
                brute.append(r2_direct(zi[split == "val"], blocks[names.index(target)][split == "val"], w, b))
            assert [row["alpha"] for row in table] == GRID
            np.testing.assert_allclose([row["val_r2"] for row in table], brute, rtol=0, atol=1e-9)
            assert fit.alpha == GRID[int(np.argmax(brute))]
            ref = lmd.fit_ridge(m, basis, target, fit.alpha)
            np.testing.assert_array_equal(fit.weight, ref.weight)
            chosen.append(fit.alpha)
    # The data were built so that selection matters: neither end of the grid always wins.
    assert len(set(chosen)) > 1 and any(0 < a < GRID[-1] for a in chosen)


def test_pairwise_and_loo_accept_a_grid_and_keep_scalar_behaviour(noisy):
    blocks, names, split, m = noisy
    grid_rows = lmd.fit_pairwise(m, GRID)
    for row in grid_rows:
        fit, _ = lmd.select_alpha(m, [row["basis"]], row["target"], GRID)
        assert row["alpha"] == fit.alpha
        assert row["r2"] == pytest.approx(lmd.r_squared(m, fit, row["split"]), abs=1e-10)
    loo_rows = lmd.fit_leave_one_out(m, tuple(GRID))
    for row in loo_rows:
        basis = [n for n in names if n != row["target"]]
        assert row["alpha"] == lmd.select_alpha(m, basis, row["target"], GRID)[0].alpha
        ref = lmd.r_squared(m, lmd.fit_ridge(m, basis, row["target"], row["alpha"]), row["split"])
        assert row["r2"] == pytest.approx(ref, abs=1e-10)
    scalar = lmd.fit_leave_one_out(m, 0.1)
    assert {r["alpha"] for r in scalar} == {0.1} and set(scalar[0]) == {"target", "split", "r2", "alpha"}
    assert lmd.fit_pairwise(m, [0.1]) == lmd.fit_pairwise(m, 0.1)


def test_least_squares_in_a_grid_is_skipped_when_the_basis_is_too_wide():
    rng = np.random.default_rng(11)
    z, u = rng.normal(size=(40, 8)), rng.normal(size=(40, 2))
    split = np.array(["train"] * 6 + ["val"] * 17 + ["test"] * 17, dtype=object)
    m = moments_of([z, u], ["z", "u"], split)
    fit, table = lmd.select_alpha(m, ["z"], "u", [0.0, 0.5, 2.0])
    assert np.isnan(table[0]["val_r2"]) and fit.alpha in (0.5, 2.0)
    with pytest.raises(lmd.LMDError, match="no α"):
        lmd.select_alpha(m, ["z"], "u", [0.0])
    with pytest.raises(lmd.LMDError, match="empty"):
        lmd.fit_pairwise(m, [])


# ------------------------------------------------------------------- block moments


def test_block_moments_stream_per_shard_and_per_fixed_block(tmp_path):
    rng = np.random.default_rng(12)
    n = 230
    blocks = [rng.normal(size=(n, w)).astype(np.float32) + 1 for w in (3, 5)]
    split = rng.choice(SPLIT_NAMES, size=n)
    names = ["m0", "m1"]
    for name, block in zip(names, blocks):
        write_embeddings(tmp_path / name, name, np.arange(n), split, block, rows_per_shard=64)
    folders = {name: tmp_path / name for name in names}
    x = np.concatenate(blocks, axis=1).astype(np.float64)
    for rows_per_block, edges in ((None, range(0, n, 64)), (50, range(0, n, 50))):
        bm = lmd.accumulate_block_moments(folders, rows_per_block=rows_per_block)
        assert len(bm) == len(edges)
        for b, start in enumerate(edges):  # blocks of 50 rows straddle the 64-row shards
            rows, sp = x[start:start + (rows_per_block or 64)], split[start:start + (rows_per_block or 64)]
            for k, s in enumerate(lmd.SPLITS):
                assert bm.n[b, k] == (sp == s).sum()
                np.testing.assert_allclose(bm.sums[b, k], rows[sp == s].sum(0), rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(bm.cross[b, k], rows[sp == s].T @ rows[sp == s], rtol=1e-12, atol=1e-12)
        pooled, total = lmd.accumulate_moments(folders), bm.total()
        for s in lmd.SPLITS:
            assert total.n[s] == pooled.n[s]
            np.testing.assert_allclose(total.cross[s], pooled.cross[s], rtol=1e-12)
    bm.save(tmp_path / "blocks.safetensors")
    loaded = lmd.BlockMoments.load(tmp_path / "blocks.safetensors")
    assert loaded.names == names and loaded.dims == [3, 5]
    np.testing.assert_array_equal(loaded.cross, bm.cross)
    np.testing.assert_array_equal(loaded[2].cross["val"], bm.cross[2, 1])


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


# ------------------------------------------------------------------ greedy selection


def test_greedy_selection_picks_the_planted_models_first():
    rng = np.random.default_rng(15)
    n = 1500
    names = ["m0", "m1", "m2", "m3", "m4", "u"]
    xs = [rng.normal(size=(n, w)) + rng.normal(size=w) for w in (4, 6, 5, 3, 4)]
    u = xs[1] @ rng.normal(size=(6, 5)) + xs[3] @ rng.normal(size=(3, 5)) + 0.5 * rng.normal(size=(n, 5))
    split = rng.choice(SPLIT_NAMES, size=n, p=[0.6, 0.2, 0.2])
    m = moments_of([*xs, u], names, split)
    rows = lmd.greedy_selection(m, "u", 0.01)
    assert [r["k"] for r in rows] == [1, 2, 3, 4, 5]
    assert {rows[0]["added_model"], rows[1]["added_model"]} == {"m1", "m3"}
    assert sorted(r["added_model"] for r in rows) == ["m0", "m1", "m2", "m3", "m4"]
    assert 0 < rows[0]["val_r2"] < rows[1]["val_r2"]
    assert rows[1]["val_r2"] > 0.9 and rows[1]["test_r2"] > 0.9
    # Brute force of step 1 and step 2: every candidate scored with an explicit fit.
    basis: list[str] = []
    for row in rows[:2]:
        scores = {}
        for cand in names[:5]:
            if cand in basis:
                continue
            zi = np.hstack([xs[names.index(b)] for b in [*basis, cand]])
            w, b = ridge_reference(zi[split == "train"], u[split == "train"], 0.01,
                                [xs[names.index(b)].shape[1] for b in [*basis, cand]])
            scores[cand] = r2_direct(zi[split == "val"], u[split == "val"], w, b)
        assert row["added_model"] == max(scores, key=scores.get)
        assert row["val_r2"] == pytest.approx(scores[row["added_model"]], abs=1e-9)
        basis.append(row["added_model"])
    assert len(lmd.greedy_selection(m, "u", [0.01, 1.0], max_k=2)) == 2


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


# ------------------------------------------------------------------ α at the grid's edge


def test_alpha_chosen_at_the_grid_edge_warns_once_per_call(noisy):
    """The val optimum of these fits lies inside [0, 3] (see the brute force above): cutting the grid
    just below or above it makes the choice sit on the cut edge, which must warn; the full grid and
    a single α must not; α = 0 at the bottom edge is least squares and never warns."""
    blocks, names, split, m = noisy
    fit, table = lmd.select_alpha(m, ["a"], "b", GRID)
    best = GRID.index(fit.alpha)
    assert 0 < best < len(GRID) - 1  # an interior optimum for this fit
    with warnings.catch_warnings():
        warnings.simplefilter("error", lmd.AlphaGridEdgeWarning)
        lmd.fit_targets(m, ["a"], ["b"], GRID)
        lmd.fit_ridge(m, ["a"], "b", GRID[-1])
        lmd.fit_targets(m, ["a"], ["b"], [fit.alpha])
    below = GRID[:best]  # the optimum is above this grid: its largest α is chosen
    with pytest.warns(lmd.AlphaGridEdgeWarning, match=rf"largest α {below[-1]:g} for \['b'\]"):
        lmd.fit_targets(m, ["a"], ["b"], below)
    above = GRID[best + 1:]  # its smallest α (> 0) is chosen
    with pytest.warns(lmd.AlphaGridEdgeWarning, match=rf"smallest α {above[0]:g} for \['b'\]"):
        lmd.fit_targets(m, ["a"], ["b"], above)
    for call in (lambda: lmd.fit_pairwise(m, [10.0, 30.0]), lambda: lmd.fit_leave_one_out(m, [10.0, 30.0]),
                 lambda: lmd.greedy_selection(m, "b", [10.0, 30.0], max_k=2)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        edge = [w for w in caught if issubclass(w.category, lmd.AlphaGridEdgeWarning)]
        assert len(edge) == 1 and "smallest α 10" in str(edge[0].message)


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
