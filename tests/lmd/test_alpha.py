"""lmdecomp.lmd.alpha: one α checked at every fit entry point, and the warning when val picks an
edge of the α grid (cut around the optimum found by brute force)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from lmd_helpers import _three_models
from lmd_helpers import noisy  # noqa: F401  (fixture)
from lmdecomp import lmd

GRID = [0.0, 1e-3, 1e-2, 0.03, 0.1, 0.3, 1.0, 3.0]


ENTRY_POINTS = {
    "fit_ridge": lambda m, bm, a: lmd.fit_ridge(m, ["a"], "b", a),
    "fit_targets": lambda m, bm, a: lmd.fit_targets(m, ["a"], ["b", "c"], a),
    "fit_with_alpha": lambda m, bm, a: lmd.fit_with_alpha(m, ["a", "c"], "b", a),
    "fit_pairwise": lambda m, bm, a: lmd.fit_pairwise(m, a),
    "fit_leave_one_out": lambda m, bm, a: lmd.fit_leave_one_out(m, a),
    "greedy_selection": lambda m, bm, a: lmd.greedy_selection(m, "b", a),
    "bootstrap_r2_samples": lambda m, bm, a: lmd.bootstrap_r2_samples(bm, ["a"], "b", a, n_boot=5),
    "bootstrap_r2": lambda m, bm, a: lmd.bootstrap_r2(bm, ["a"], "b", a, n_boot=5),
    "ridge_penalty": lambda m, bm, a: lmd.ridge_penalty(np.ones(3), [3], a),
}


@pytest.mark.parametrize("alpha", [-0.5, float("nan"), float("inf"), "0.1"])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_one_alpha_must_be_finite_and_non_negative_everywhere(entry, alpha):
    """The grid's check applies to a single α too: a negative ridge ran silently, NaN gave all-NaN
    R² (or a StopIteration in fit_pairwise)."""
    m, bm = _three_models()
    ENTRY_POINTS[entry](m, bm, 0.1)  # the same call with a valid α runs
    with pytest.raises(lmd.LMDError, match="α must be"):
        ENTRY_POINTS[entry](m, bm, alpha)


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
