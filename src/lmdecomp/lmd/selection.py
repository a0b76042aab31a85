"""Greedy forward selection of basis models on val R²."""

from __future__ import annotations

from typing import Sequence

from lmdecomp.lmd.alpha import _alpha_grid, warn_if_alpha_at_grid_edge
from lmdecomp.lmd.errors import LMDError
from lmdecomp.lmd.fits import _check_two_models, fit_with_alpha, r_squared
from lmdecomp.lmd.moments import Moments


def greedy_selection(
    moments: Moments, target: str, alpha: "float | Sequence[float]", max_k: int | None = None
) -> list[dict]:
    """Forward selection of a basis for ``target``: step k adds the model whose addition gives
    the highest val R² of the fit on the selected set (first in ``moments.names`` order on ties).

    ``alpha``: one ridge strength or a grid (chosen on val per candidate fit). Rows, one per
    step: ``{"target", "k", "added_model", "alpha", "val_r2", "test_r2"}``; the basis at step k
    is the ``added_model`` of steps 1..k. Cost: Σ_k (M−k) fits of width up to the full basis."""
    candidates = [n for n in moments.names if n != target]
    if target not in moments.names:
        raise LMDError(f"unknown target {target!r}; models are {moments.names}")
    _alpha_grid(alpha)
    _check_two_models(moments.names, "greedy basis selection")
    if max_k is not None and max_k < 1:
        raise LMDError(f"max_k must be at least 1 basis model (got {max_k}); None selects up to all of them")
    steps = len(candidates) if max_k is None else min(int(max_k), len(candidates))
    selected: list[str] = []
    rows = []
    for k in range(1, steps + 1):
        best = None
        for cand in candidates:
            if cand in selected:
                continue
            fit = fit_with_alpha(moments, [*selected, cand], target, alpha, warn_edge=False)  # warned below
            val = r_squared(moments, fit, "val")
            if best is None or val > best[0]:
                best = (val, cand, fit)
        val, cand, fit = best
        selected.append(cand)
        rows.append({"target": target, "k": k, "added_model": cand, "alpha": fit.alpha,
                     "val_r2": float(val), "test_r2": r_squared(moments, fit, "test")})
    # one warning for the chosen fits, not one per candidate tried
    warn_if_alpha_at_grid_edge(alpha, {f"step {r['k']}": r["alpha"] for r in rows},
                               f"greedy selection for {target!r}")
    return rows
