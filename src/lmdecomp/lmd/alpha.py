"""The ridge strength α: one value or a grid chosen on val, and the warning when the
chosen α sits at an edge of its grid."""

from __future__ import annotations

import numbers
import warnings
from typing import Mapping

import numpy as np

from lmdecomp.lmd.errors import AlphaGridEdgeWarning, LMDError


def _alpha_grid(alpha) -> tuple[float, ...] | None:
    """A grid of α as a tuple of floats, or None when ``alpha`` is one number; either way every α
    is checked to be finite and >= 0 (every fit entry point goes through here or
    :func:`_one_alpha`: a negative λ makes S_zz + diag λ indefinite, a NaN poisons every R²)."""
    if isinstance(alpha, (list, tuple, np.ndarray)):
        grid = tuple(float(a) for a in np.asarray(alpha, dtype=np.float64).ravel())
        if not grid:
            raise LMDError("the α grid is empty; give at least one ridge strength")
        if not all(np.isfinite(a) and a >= 0 for a in grid):
            raise LMDError(f"every α of the grid must be finite and >= 0; got {list(grid)}")
        return grid
    if not isinstance(alpha, numbers.Real) or isinstance(alpha, bool):
        raise LMDError(f"α must be a number >= 0 or a list of them (a grid); got {alpha!r}")
    value = float(alpha)
    if not (np.isfinite(value) and value >= 0):
        raise LMDError(f"α must be finite and >= 0 (0 = least squares); got {alpha!r}: set lmd.alpha to "
                       "e.g. 0.01, or a grid such as [0.001, 0.01, 0.1]")
    return None


def warn_if_alpha_at_grid_edge(alpha, chosen: Mapping[str, float], what: str) -> None:
    """Warn (:class:`AlphaGridEdgeWarning`, once per call) when some fit's val-selected α is the
    largest of the grid ``alpha``, or its smallest when that is > 0: the val R² may still rise
    beyond it, so the grid should be widened. No warning for a single α or a one-point grid, or
    at α = 0 (least squares: nothing lies below it). ``chosen``: fit label → its α."""
    grid = _alpha_grid(alpha)
    if grid is None or min(grid) == max(grid):
        return
    lo, hi = min(grid), max(grid)
    edges = []
    at_hi = [t for t, a in chosen.items() if a == hi]
    at_lo = [t for t, a in chosen.items() if a == lo and lo > 0]
    if at_hi:
        edges.append(f"the largest α {hi:g} for {at_hi} (add larger α)")
    if at_lo:
        edges.append(f"the smallest α {lo:g} for {at_lo} (add smaller α, or 0)")
    if edges:
        warnings.warn(f"{what}: val R² chose {' and '.join(edges)} of the grid {list(grid)}; the best α may "
                      "lie outside it: widen lmd.alpha", AlphaGridEdgeWarning, stacklevel=3)


def _one_alpha(alpha, what: str) -> float:
    """One checked α (:func:`_alpha_grid`); a grid is an error naming ``what`` refused it."""
    if _alpha_grid(alpha) is not None:
        raise LMDError(f"{what} takes one α, not the grid {list(np.ravel(alpha))}; use fit_with_alpha or "
                       "select_alpha to choose one on val")
    return float(alpha)
