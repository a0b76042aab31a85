"""lmdecomp.lmd.loo: leave-one-out fits read off one joint inverse, for one α or a grid (checked
beside fit_pairwise's), against numpy least squares, explicit ridge solves on each concatenated
basis and select_alpha."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import moments_of, r2_direct, ridge_reference
from lmd_helpers import lstsq_fit, planted
from lmd_helpers import data, noisy  # noqa: F401  (fixtures)
from lmdecomp import lmd

GRID = [0.0, 1e-3, 1e-2, 0.03, 0.1, 0.3, 1.0, 3.0]


def test_leave_one_out_equals_numpy_lstsq_on_concatenated_basis(data):
    blocks, split = data
    names = ["a", "b", "c"]
    m = moments_of(blocks, names, split)
    rows = {r["target"] + r["split"]: r["r2"] for r in lmd.fit_leave_one_out(m, alpha=0.0)}
    train = split == "train"
    for ti, target in enumerate(names):
        z = np.hstack([blocks[i] for i in range(3) if i != ti])
        w, b = lstsq_fit(z[train], blocks[ti][train])
        for s in lmd.SPLITS:
            assert rows[target + s] == pytest.approx(r2_direct(z[split == s], blocks[ti][split == s], w, b), abs=1e-8)


@pytest.mark.parametrize("scales", [(1.0, 1e3, 1e-2, 30.0), (1.0, 1e4, 1e-4, 30.0)])
@pytest.mark.parametrize("alpha", [0.05, [0.0, 1e-3, 0.05, 1.0]])
def test_leave_one_out_from_one_joint_inverse_equals_separate_solves(alpha, scales):
    """Every leave-one-out fit is read off one inverse of the regularised joint scatter; each
    must equal an explicit ridge solve on its own concatenated basis, on every split, also
    when the models' scales differ by orders of magnitude (a variance ratio of 1e16 makes the
    joint scatter's condition number ~1e16: the singularity check must not refuse it)."""
    rng = np.random.default_rng(24)  # a seed where the grid's targets choose different α
    n, widths = 700, [6, 4, 8, 5]
    blocks = [b * s for b, s in zip(planted(rng, n, widths, noise=1.0), scales)]
    split = rng.choice(np.array(lmd.SPLITS, dtype=object), size=n, p=[0.5, 0.25, 0.25])
    names = ["a", "b", "c", "d"]
    m = moments_of(blocks, names, split)
    rows = lmd.fit_leave_one_out(m, alpha)
    grid = alpha if isinstance(alpha, list) else [alpha]
    train = split == "train"
    for ti, target in enumerate(names):
        others = [i for i in range(4) if i != ti]
        z = np.hstack([blocks[i] for i in others])
        scores = {}
        for a in grid:  # brute force over the grid: fit on train, score on every split
            w, b = ridge_reference(z[train], blocks[ti][train], a, [widths[i] for i in others])
            scores[a] = {s: r2_direct(z[split == s], blocks[ti][split == s], w, b) for s in lmd.SPLITS}
        chosen = max(grid, key=lambda a: scores[a]["val"])
        got = {r["split"]: r for r in rows if r["target"] == target}
        for s in lmd.SPLITS:
            assert got[s]["alpha"] == chosen
            assert got[s]["r2"] == pytest.approx(scores[chosen][s], abs=1e-10)
    if len(grid) > 1:  # the targets' rows come from different α: each split's R² is its own α's
        assert len({r["alpha"] for r in rows}) > 1


def test_leave_one_out_without_ridge_when_the_joint_scatter_is_singular():
    """α = 0 with fewer train rows than the joint width but more than each basis width: the
    joint inverse does not exist, each fit still does (one solve per target instead)."""
    rng = np.random.default_rng(22)
    widths = [3, 4, 5]
    blocks = planted(rng, 40, widths)
    split = np.array(["train"] * 11 + ["val"] * 14 + ["test"] * 15, dtype=object)
    m = moments_of(blocks, ["a", "b", "c"], split)
    rows = lmd.fit_leave_one_out(m, 0.0)
    train = split == "train"
    for ti, target in enumerate(["a", "b", "c"]):
        z = np.hstack([blocks[i] for i in range(3) if i != ti])
        w, b = lstsq_fit(z[train], blocks[ti][train])
        for r in rows:
            if r["target"] == target:
                expected = r2_direct(z[split == r["split"]], blocks[ti][split == r["split"]], w, b)
                assert r["r2"] == pytest.approx(expected, abs=1e-8)


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
