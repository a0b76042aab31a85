"""Leave-one-out fits: each model from all others, as blocks of one inverse of the
regularised joint scatter (:func:`fit_leave_one_out`), and the DVC summary metrics."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from lmdecomp.lmd.alpha import _alpha_grid, warn_if_alpha_at_grid_edge
from lmdecomp.lmd.errors import LMDError
from lmdecomp.lmd.fits import (
    _check_least_squares,
    _check_moments_basis,
    _check_two_models,
    _cholesky_inverse,
    _ridge_solve,
    _sst,
    fit_ridge,
    ridge_penalty,
)
from lmdecomp.lmd.moments import SPLITS, Moments, _GramTraces, _symmetrise_from_lower


def _ridge_inverse(moments: Moments, penalty: np.ndarray, band: int = 64) -> np.ndarray:
    """(S + diag λ)⁻¹ of the train scatter S = C − n μμᵀ, its lower triangle (C order; the upper
    one is not written, as :func:`_loo_residual_map` reads none of it):
    the lower triangle of S + diag λ written once, a band of rows at a time, into the array that
    one Cholesky and its inverse then overwrite (:func:`~lmdecomp.lmd.fits._cholesky_inverse`,
    which reads nothing else). Raises LMDError if it is not positive definite or, at α = 0,
    singular to float32 precision (:func:`~lmdecomp.lmd.fits._check_pivots`)."""
    cross = moments.cross["train"]
    root_n_mean = moments.root_n_mean("train")
    a = np.empty_like(cross)
    for lo in range(0, len(a), band):  # −n μμᵀ band by band: no width² temporary
        hi = min(lo + band, len(a))
        np.multiply.outer(root_n_mean[lo:hi], -root_n_mean[:hi], out=a[lo:hi, :hi])
        a[lo:hi, :hi] += cross[lo:hi, :hi]
    a[np.diag_indices_from(a)] += penalty
    check = not np.any(penalty)
    names = [f"{name}[{k}]" for name, dim in zip(moments.names, moments.dims) for k in range(dim)] if check else None
    inverse = _cholesky_inverse(a, np.diagonal(cross), "the joint covariance", check, names, symmetric=False)
    if inverse is None:
        raise LMDError("the joint covariance plus ridge is not positive definite")
    return inverse


def _singular_models(moments: Moments) -> set[str]:
    """Models whose own train scatter is singular to float32 precision
    (:func:`~lmdecomp.lmd.fits._check_pivots`). At α = 0 every basis holding one is too: a
    column that the rest of its model explains is explained at least as well by a larger basis.
    Costs one small Cholesky per model."""
    singular = set()
    for name in moments.names:
        cols = moments.columns([name])
        try:
            _ridge_solve(moments.scatter_block("train", cols, cols), np.zeros(len(cols)), np.zeros((len(cols), 1)),
                         name, np.diagonal(moments.cross["train"])[cols])
        except LMDError:
            singular.add(name)
    return singular


def _loo_residual_map(inverse: np.ndarray, block: slice) -> np.ndarray:
    """Rᵀ = P_mm⁻¹ P_m· (q × width, C order) of :func:`fit_leave_one_out` for target block m of
    the symmetric P of which ``inverse`` holds the lower triangle: the q × q inverse of P_mm
    times the rows P_m·, by dgemm (twice the rate of two triangular solves with P_mm's factor;
    see :func:`~lmdecomp.lmd.fits._ridge_solve`). P_m· is read from the lower triangle: left of
    the diagonal block as the rows themselves, right of it as the columns P_·m below it
    transposed, so P is never symmetrised (0.3 s of memory traffic at width 9,216)."""
    lower_mm = inverse[block, block]
    inverse_mm = _cholesky_inverse(lower_mm.copy(), np.diagonal(lower_mm), "P_mm", False)
    if inverse_mm is None:
        raise LMDError("internal: a diagonal block of the joint inverse is not positive definite")
    p_mm = lower_mm.copy()
    _symmetrise_from_lower(p_mm)
    residual_t = np.empty((block.stop - block.start, len(inverse)))
    np.matmul(inverse_mm, inverse[block, : block.start], out=residual_t[:, : block.start])
    np.matmul(inverse_mm, p_mm, out=residual_t[:, block])
    np.matmul(inverse_mm, inverse[block.stop :, block].T, out=residual_t[:, block.stop :])
    return residual_t


def fit_leave_one_out(moments: Moments, alpha: "float | Sequence[float]") -> list[dict]:
    """Each target on all other models concatenated, fitted on train, scored on every split.

    ``alpha``: one ridge strength, or a grid chosen per target on val (as :func:`fit_pairwise`).

    One factorisation of the regularised joint scatter serves all targets. With
    A = S + diag λ over all models (λ of :func:`ridge_penalty`, each model's own) and P = A⁻¹,
    the block inverse gives, for target block m and the rest r,

        Wᵀ = (S_rr + diag λ_r)⁻¹ S_rm = −P_rm P_mm⁻¹

    (λ_m is irrelevant to it). The residual map Rᵀ = P_mm⁻¹ P_m· (q × width) has −W on the
    basis columns and I on the target's, so e = Rᵀ(x − μ_train), and per split
    SSE = tr(C G) − n ‖Rᵀμ‖² + n ‖Rᵀ(μ − μ_train)‖² with G = R Rᵀ (width × width, never formed:
    one pass of dgemm bands over Rᵀ serves val and test; :class:`_GramTraces`); on train, where
    W(S_rr + diag λ_r) = S_mr, SSE = Σ Rᵀ∘S_m· − Σ_i λ_i ‖W_·i‖² needs no product with S.
    Cost per α: one Cholesky inverse of the joint width, and per target q·width² for G,
    instead of a fresh Cholesky of the basis width per target. Every split is scored at every
    α (the traces are memory-bound passes, cheap beside G), so nothing is refitted for test."""
    grid = _alpha_grid(alpha)
    strict = grid is None
    grid = grid or (float(alpha),)
    _check_two_models(moments.names, "leave-one-out fits")
    names, width = moments.names, moments.width
    n = moments.count("train")
    _check_moments_basis(moments, names, np.arange(width))  # every model is in some basis
    bounds = np.cumsum([0, *moments.dims])
    diagonal = moments.scatter_diagonal("train")
    best: dict[int, tuple[float, dict[str, float]]] = {}  # target → (α, R² per split) of the best val R²
    traces = _GramTraces(width)  # its buffers serve every target and α
    for alpha_a in grid:
        penalty = ridge_penalty(diagonal, moments.dims, alpha_a)
        _fit_one_alpha(moments, alpha_a, penalty, bounds, n, strict, best, traces)
    rows = _loo_rows(moments, best, grid)
    if not strict:
        warn_if_alpha_at_grid_edge(grid, {names[m]: best[m][0] for m in best}, "leave-one-out fits")
    return rows


def _fit_one_alpha(moments: Moments, alpha_a: float, penalty: np.ndarray, bounds: np.ndarray, n: int, strict: bool,
                   best: dict[int, tuple[float, dict[str, float]]], traces: _GramTraces) -> None:
    """Fit and score every target at ``alpha_a`` (``penalty`` its λ over all columns) and keep in
    ``best`` (target index → (α, R² per split)) the fits that beat its val R² so far (first in
    grid order on ties). ``strict`` (one α, not a grid): an ill-posed fit is an error, not
    skipped. ``traces``: for :func:`_residual_r2`. The joint inverse is
    freed on return, before the next α's is made."""
    names, width = moments.names, moments.width
    inverse = _joint_inverse(moments, penalty, alpha_a, n)
    # at α = 0, skip (or refuse) the targets whose basis holds a singular model up front,
    # instead of one refused Cholesky of nearly the joint width per target
    singular = _singular_models(moments) if inverse is None and alpha_a == 0 else set()
    for m, target in enumerate(names):
        block = slice(bounds[m], bounds[m + 1])
        basis = [t for t in names if t != target]
        what = f"fit of {target!r} on {basis}"
        if strict:
            _check_least_squares(n, width - (block.stop - block.start), alpha_a, what)
        elif alpha_a == 0 and n <= width - (block.stop - block.start):
            continue
        if inverse is not None:
            residual_t = _loo_residual_map(inverse, block)
        else:
            residual_t = _direct_residual_map(moments, target, basis, block, alpha_a, singular, strict, what)
            if residual_t is None:
                continue
        basis_penalty = penalty.copy()
        basis_penalty[block] = 0.0
        r2 = _residual_r2(moments, target, block, residual_t, basis_penalty, traces)
        if m not in best or r2["val"] > best[m][1]["val"]:
            best[m] = (alpha_a, r2)


def _joint_inverse(moments: Moments, penalty: np.ndarray, alpha_a: float, n: int) -> np.ndarray | None:
    """P = (S + diag λ)⁻¹ of :func:`_ridge_inverse`, or None where it fails (at α = 0 a singular
    joint scatter, certain with no more train rows than the joint width, so not even tried):
    then each target is fitted on its own (:func:`_direct_residual_map`)."""
    if alpha_a > 0 or n > moments.width:
        try:
            return _ridge_inverse(moments, penalty)
        except LMDError:
            pass
    return None


def _direct_residual_map(moments: Moments, target: str, basis: list[str], block: slice, alpha_a: float,
                         singular: set[str], strict: bool, what: str) -> np.ndarray | None:
    """Rᵀ (q × width) of :func:`fit_leave_one_out` from a fresh :func:`fit_ridge` of ``target`` on
    ``basis``, for when there is no joint inverse; None (or, ``strict``, an error) where the fit
    is ill-posed: a basis holding a model of ``singular`` (:func:`_singular_models`), or a
    refused fit."""
    if singular & set(basis):
        if strict:
            raise LMDError(f"{what}: least squares is ill-posed: the train scatter of "
                           f"{sorted(singular & set(basis))} alone is singular to float32 "
                           "precision; set lmd.alpha > 0")
        return None
    try:
        fit = fit_ridge(moments, basis, target, alpha_a)
    except LMDError:
        if strict:
            raise
        return None
    residual_t = np.zeros((block.stop - block.start, moments.width))
    residual_t[:, moments.columns(basis)] = -fit.weight
    residual_t[:, block] = np.eye(block.stop - block.start)
    return residual_t


def _loo_rows(moments: Moments, best: dict[int, tuple[float, dict[str, float]]], grid: Sequence[float]) -> list[dict]:
    """The fit rows (target, split, r2, alpha) of each target's chosen fit in ``best``."""
    rows = []
    for m, target in enumerate(moments.names):
        if m not in best:
            raise LMDError(f"leave-one-out fit of {target!r}: no α of {list(grid)} gives a well-posed fit; "
                           "include an α > 0")
        alpha_m, r2 = best[m]
        rows.extend({"target": target, "split": split, "r2": r2[split], "alpha": alpha_m} for split in SPLITS)
    return rows


def _residual_r2(moments: Moments, target: str, block: slice, residual_t: np.ndarray, basis_penalty: np.ndarray,
                 traces: _GramTraces) -> dict[str, float]:
    """R² on every split of the fit whose residual is e = Rᵀ(x − μ_train) (Rᵀ: q × width).

    Train by the shortcut of :func:`fit_leave_one_out`'s docstring (``basis_penalty``, width:
    the basis columns' λ, 0 on the target's), with no width² product. Held out from C itself
    (S = C − n μμᵀ is never formed): Σ_rows r S rᵀ = tr(C G) − n ‖Rᵀμ‖², G = R Rᵀ, its lower
    triangle computed band by band and read by val and test while in cache (``traces``). Against a
    triangular product of C and R per split (2·q·width² for the two), half the arithmetic:
    2026-12-07, AMD EPYC, 2 threads, 12 models × 768: the 24 scores 13.8–14.0 s → 7.5–8.4 s."""
    sst = {s: _sst(moments, s, [target], np.arange(block.start, block.stop), np.array([0]))[0] for s in SPLITS}
    n, mean = moments.count("train"), moments.mean("train")
    # Σ Rᵀ∘S_m· with S_m· = C_m· − n μ_m μᵀ, from the rows C_m· in place: Σ Rᵀ∘(μ_m μᵀ) = μ_m·(Rᵀμ)
    sse = {"train": np.vdot(residual_t, moments.cross["train"][block]) - n * mean[block] @ (residual_t @ mean)
           - basis_penalty @ np.einsum("ij,ij->j", residual_t, residual_t)}
    held_out = [s for s in SPLITS if s != "train"]
    for split, quadratic in zip(held_out, traces(residual_t, [moments.cross[s] for s in held_out])):
        n_s, mean_s = moments.count(split), moments.mean(split)
        residual_mean, offset = residual_t @ mean_s, residual_t @ (mean_s - mean)
        sse[split] = quadratic - n_s * residual_mean @ residual_mean + n_s * offset @ offset
    return {s: float(1.0 - sse[s] / sst[s]) for s in SPLITS}


def summary_metrics(pairwise: list[dict], loo: list[dict]) -> dict:
    """The DVC metrics: mean and per-model leave-one-out test R², mean pairwise test R²."""
    loo_test = {r["target"]: r["r2"] for r in loo if r["split"] == "test"}
    pair_test = [r["r2"] for r in pairwise if r["split"] == "test"]
    return {
        "loo_test_r2_mean": float(np.mean(list(loo_test.values()))),
        "loo_test_r2": dict(sorted(loo_test.items())),
        "pairwise_test_r2_mean": float(np.mean(pair_test)) if pair_test else None,
    }
