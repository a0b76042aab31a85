"""Closed-form ridge fits of one model's embeddings on others', from moments.

With the centred scatter S = C − n·μμᵀ (μ = s/n) on the train split:

    W = S_uz (S_zz + diag λ)⁻¹,   b = μ_u − W μ_z,   λ_i = α · tr(S_jj) / p_j  (i in model j)

i.e. the paper's W = Cov(u,z)(Cov(z,z) + αI)⁻¹ with each basis model scaled to unit mean
variance first, so one α suits models of any scale, no model dominates a concatenated basis
by its scale alone, and α = 0 is ordinary least squares (:func:`ridge_penalty`). Goodness of
fit on a split s, pooled over target dimensions, with ū_s the mean of the split being scored:

    R² = 1 − Σ‖u − Wz − b‖² / Σ‖u − ū_s‖²
    Σ‖u − Wz − b‖² = tr S_uu − 2 tr(W S_zu) + tr(W S_zz Wᵀ) + n_s ‖μ_u − W μ_z − b‖²

(all statistics of split s; the cross terms vanish because centred sums are zero).

:func:`fit_targets` / :func:`select_alpha` fit every target of one basis from one Cholesky
per α of a grid, keeping the α with the best val R²; :func:`fit_pairwise` takes such a grid
in place of one α.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# Imported at load time, not lazily: threadpoolctl (blas_threads) pins only the BLAS
# libraries already loaded, and scipy brings its own OpenBLAS.
from scipy.linalg.blas import dsyrk
from scipy.linalg.lapack import dpotrf, dpotri

from lmdecomp.lmd.alpha import _alpha_grid, _one_alpha, warn_if_alpha_at_grid_edge
from lmdecomp.lmd.errors import LMDError
from lmdecomp.lmd.moments import (SPLITS, Moments, _column_dots, _dims_of, _sub, _symmetrise_from_lower,
                                  _traces_with_lower)


def _check_basis(basis: Sequence[str], targets: Sequence[str]) -> None:
    if isinstance(basis, str):
        raise LMDError(f"give the basis as a list of model names, e.g. [{basis!r}]; got the string {basis!r}")
    if not len(basis):
        raise LMDError(f"fit of {list(targets)} on an empty basis: name at least one basis model")
    for t in targets:
        if t in basis:
            raise LMDError(f"target {t!r} cannot be part of its own basis")


# A model whose train scatter trace is below this fraction of its raw sum of squares Σ‖x_j‖² is
# taken as constant: the rounding left in C − n μμᵀ for a constant is typically ~ eps·√n of tr C
# (< 1e-12 up to ~10⁷ rows; beyond, a constant may pass and fail later as a singular fit), while a
# model needs std/|mean| < 1e-6 to fall below it — past float32's resolution for embeddings.
_CONSTANT_RTOL = 1e-12


def _check_basis_variance(names: Sequence[str], dims: Sequence[int], scatter_diagonal: np.ndarray,
                          square_diagonal: np.ndarray) -> None:
    """Refuse a basis model that is constant on train: tr(S_jj) = 0 makes its ridge
    λ_j = α · tr(S_jj) / p_j zero whatever α, so S_zz + diag λ is singular for every α and the
    usual advice (α > 0) cannot help. ``scatter_diagonal`` / ``square_diagonal``: the diagonals
    of the train S and C over the named models' columns, in order."""
    starts = np.cumsum([0, *dims])[:-1]
    scatter = np.add.reduceat(np.asarray(scatter_diagonal, dtype=np.float64), starts)
    square = np.add.reduceat(np.asarray(square_diagonal, dtype=np.float64), starts)
    for name, tr_s, tr_c in zip(names, scatter, square):
        if not tr_s > _CONSTANT_RTOL * tr_c:  # also catches NaN
            raise LMDError(f"basis model {name!r} is constant on the train split (tr S = {tr_s:.3g}): its "
                           "ridge λ = α·tr(S)/p is 0 for every α and the fit is singular; re-embed it or "
                           "drop it from models:")


def _check_moments_basis(moments: "Moments", basis: Sequence[str], cols: np.ndarray) -> None:
    _check_basis_variance(basis, _dims_of(moments, basis), moments.scatter_diagonal("train")[cols],
                          np.diagonal(moments.cross["train"])[cols])


def _check_two_models(names: Sequence[str], what: str) -> None:
    """LMD explains each model by the others: with one model there is nothing to fit (a
    leave-one-out fit on an empty basis would be intercept-only, R² ≈ 0, not an answer)."""
    if len(names) < 2:
        raise LMDError(f"LMD needs at least two models for {what}; these moments hold {list(names)}: "
                       "list two or more models under models: in the config")


@dataclass(frozen=True)
class RidgeFit:
    """u ≈ W z + b, fitted on the train split."""

    basis: tuple[str, ...]
    target: str
    alpha: float
    weight: np.ndarray  # (target dim, basis dim)
    bias: np.ndarray  # (target dim,)


def ridge_penalty(scatter_diagonal: np.ndarray, dims: Sequence[int], alpha: float) -> np.ndarray:
    """Per-column ridge λ (…, p) for a basis of models with widths ``dims``: every column of
    model j gets λ_j = α · tr(S_jj) / p_j, its model's mean train variance (scatter scale) times α.

    The same as scaling each basis model to unit mean variance and using λ = α there: α is
    unit-free, a fit does not depend on any model's overall scale, and a one-model basis gets
    the single λ = α · tr(S_zz) / p. Because a column's λ depends only on its own model, every
    leave-one-out fit is a block of one regularised joint matrix (:func:`fit_leave_one_out`).
    ``scatter_diagonal`` may carry leading batch axes (bootstrap replicates)."""
    alpha = _one_alpha(alpha, "ridge_penalty")
    diag = np.asarray(scatter_diagonal, dtype=np.float64)
    starts = np.cumsum([0, *dims])[:-1]
    block_mean = np.add.reduceat(diag, starts, axis=-1) / np.asarray(dims, dtype=np.float64)
    return alpha * np.repeat(block_mean, dims, axis=-1)


# The embeddings are stored in float32: a column that other columns explain up to its float32
# rounding is a linear combination of them as far as the data can tell (see _check_pivots).
_FLOAT32_UNIT_ROUNDOFF = 2.0**-24


_ROUNDING_MARGIN = 1e3


def _check_pivots(factor_diagonal: np.ndarray, raw_diagonal: np.ndarray, what: str,
                  column_names: Sequence[str] | None = None) -> None:
    """Refuse least squares (α = 0) on a basis that is singular to the float32 precision of the
    embeddings, from the Cholesky factor of its scatter (S = UᵀU).

    U_jj² is the part of column j's scatter that the columns before it leave unexplained. The
    float32 rounding of p columns carries ~p·u²·C_jj of it (u = 2⁻²⁴, C_jj the raw Σx_j²: the
    rounding is relative to x, not to its spread). A pivot below 1e3 times that means column j
    is a combination of earlier ones up to rounding, and least squares along that direction
    fits rounding noise, although Cholesky of the rounded matrix succeeded. LayerNorm outputs
    are such a case: Σ_j (x_j − β_j)/γ_j = 0 on every row (mean pooling keeps it). On the
    default zoo their last column's pivot is 0.7–1.0 × p·u²·C_jj and every other column's is
    above 4e9 × (minilm also has exactly dependent columns, pivots ~1e-52 ×). There, least
    squares of zoo-modernbert on minilm returned weights of norm 1e36 and a val R² of 0.333
    where the minimum-norm solution (the α → 0 limit of ridge) scores 0.316; val picked it.
    The test is per column, so it does not depend on any model's scale (α > 0 is never
    refused: its penalty is positive for every non-constant model)."""
    tolerance = _ROUNDING_MARGIN * len(raw_diagonal) * _FLOAT32_UNIT_ROUNDOFF**2
    unexplained = factor_diagonal**2 / raw_diagonal
    j = int(np.argmin(unexplained))
    if not unexplained[j] >= tolerance:
        column = f"column {j if column_names is None else column_names[j]}"
        raise LMDError(f"{what}: least squares is ill-posed: {column} is a linear combination of the columns "
                       f"before it up to the float32 rounding of the embeddings (unexplained "
                       f"{unexplained[j]:.1e} of Σx², below {tolerance:.1e}); set lmd.alpha > 0")


def _cholesky_inverse(a: np.ndarray, raw_diagonal: np.ndarray, what: str, check_pivots: bool,
                      column_names: Sequence[str] | None = None, symmetric: bool = True) -> np.ndarray | None:
    """a⁻¹ of the symmetric C-ordered ``a``, of which only the lower triangle is read, in place
    (one Cholesky, dpotrf, and its inverse, dpotri), returned as a full symmetric C-ordered
    matrix (``symmetric=False``: its lower triangle only, the upper one left as it was); None if
    ``a`` is not positive definite. With ``check_pivots`` (least squares, α = 0),
    :func:`_check_pivots` on the factor first, ``raw_diagonal`` the columns' Σx²."""
    # a is C-ordered, so its transpose is the same memory in Fortran order: LAPACK works on it
    # in place, and the triangle it reads and fills is the lower one of ``a``.
    factor, info = dpotrf(a.T, lower=0, clean=0, overwrite_a=1)
    if info != 0:
        return None
    if check_pivots:
        _check_pivots(np.diagonal(factor), raw_diagonal, what, column_names)
    inverse, info = dpotri(factor, lower=0, overwrite_c=1)
    if info != 0:
        return None
    out = inverse.T
    if symmetric:
        _symmetrise_from_lower(out)
    return out


def _ridge_solve(s_zz: np.ndarray, penalty: np.ndarray, rhs: np.ndarray, what: str,
                 raw_diagonal: np.ndarray) -> np.ndarray:
    """(S_zz + diag λ)⁻¹ rhs, C-ordered, as the Cholesky inverse times ``rhs`` (the matrix is
    symmetric positive definite when the fit is well posed; at α = 0, :func:`_check_pivots` with
    ``raw_diagonal``, the basis columns' Σx²). ``s_zz`` is a copy owned by the caller; it is
    overwritten.

    The inverse and one dgemm, not two triangular solves with the factor: the p³ of the inverse
    is small beside the 2·p²·k of the solve, and dgemm runs that at about twice the rate of
    dtrsm (2026-12-05, Intel Xeon with AMX, 2 threads, p = 768, k = 8,448: 0.11 s against
    0.20 s)."""
    s_zz[np.diag_indices_from(s_zz)] += penalty
    inverse = _cholesky_inverse(s_zz, raw_diagonal, what, check_pivots=not np.any(penalty))
    if inverse is None:
        raise LMDError(f"{what}: the basis covariance is singular; set lmd.alpha > 0")
    return inverse @ np.ascontiguousarray(rhs)


def _check_least_squares(n: int, p: int, alpha: float, what: str) -> None:
    if alpha == 0 and n <= p:
        raise LMDError(
            f"{what}: {n} train rows for a basis {p} wide; ordinary least squares needs more rows "
            "than basis dimensions: add sequences or set lmd.alpha > 0"
        )


def fit_ridge(moments: Moments, basis: Sequence[str], target: str, alpha: float) -> RidgeFit:
    """Closed-form ridge fit of ``target`` on the concatenated ``basis`` from train moments:
    Wᵀ = (S_zz + diag λ)⁻¹ S_zu with λ from :func:`ridge_penalty`, b = μ_u − W μ_z."""
    alpha = _one_alpha(alpha, "fit_ridge")
    _check_basis(basis, [target])
    what = f"fit of {target!r} on {list(basis)}"
    zi, ui = moments.columns(basis), moments.columns([target])
    n, mean = moments.count("train"), moments.mean("train")
    _check_moments_basis(moments, basis, zi)
    _check_least_squares(n, len(zi), alpha, what)
    s_zz = moments.scatter_block("train", zi, zi)
    penalty = ridge_penalty(np.diagonal(s_zz), _dims_of(moments, basis), alpha)
    weight = _ridge_solve(s_zz, penalty, moments.scatter_block("train", zi, ui), what,
                          np.diagonal(moments.cross["train"])[zi]).T
    bias = mean[ui] - weight @ mean[zi]
    return RidgeFit(tuple(basis), target, alpha, weight, bias)


def r_squared(moments: Moments, fit: RidgeFit, split: str) -> float:
    """Pooled R² of ``fit`` on ``split``, from that split's moments (formula in the module doc)."""
    return float(_targets_r2(moments, split, moments.columns(fit.basis), [fit.target], fit.weight.T, fit.bias)[0])


def _sst(moments: Moments, split: str, targets: Sequence[str], cols: np.ndarray, starts: np.ndarray,
         diagonal: np.ndarray | None = None) -> np.ndarray:
    """Per target, tr S_uu on ``split`` (``diagonal``: the split's diag S, if already at hand); an
    error for a target constant there. A constant leaves rounding noise in C − n μμᵀ that is
    positive about half the time, so the test is relative, as for a basis (``_CONSTANT_RTOL``):
    tr S_uu ≤ _CONSTANT_RTOL · tr C_uu. Dividing by that noise gave R² of −1e17."""
    if diagonal is None:
        diagonal = moments.scatter_diagonal(split)
    sst = np.add.reduceat(diagonal[cols], starts)
    square = np.add.reduceat(np.diagonal(moments.cross[split])[cols], starts)
    for name, value, raw in zip(targets, sst, square):
        if not value > _CONSTANT_RTOL * raw:  # also catches NaN
            raise LMDError(f"target {name!r} has zero variance on the {split} split (tr S = {value:.3g}, "
                           f"{_CONSTANT_RTOL:g} of its Σx² at most): R² is undefined; check that split's "
                           "embeddings, or drop the model from models:")
    return sst


def _targets_r2(moments: Moments, split: str, basis_cols: np.ndarray, targets: Sequence[str],
                weight_t: np.ndarray, bias: np.ndarray,
                train_penalty: tuple[np.ndarray, np.ndarray] | None = None,
                grams: list[np.ndarray] | None = None) -> np.ndarray:
    """R² on ``split`` of several targets fitted on one basis at once: ``weight_t`` (p × Q) holds
    each target's Wᵀ side by side in ``targets`` order, ``bias`` (Q,); R² of the module doc,
    pooled per target block (:func:`r_squared` is its one-target case).

    The scatter S = C − n μμᵀ is never formed: with w a row of W and a = w·μ_z,
    Σ_j w_j S_uj = w·C_uz − n μ_u a and w S_zz wᵀ = w C_zz wᵀ − n a².

    On train, ``train_penalty`` = (α per target column (Q,), λ of the basis columns at α = 1
    (p,)) skips the p² × Q product: the fit solves W (S_zz + diag λ) = S_uz, so
    tr(W S_zz Wᵀ) = tr(W S_zu) − Σ λ_i W_·i² and SSE = tr S_uu − tr(W S_zu) − Σ λ_i W_·i².

    Held out, ``grams`` (:func:`_block_grams` of ``weight_t``) gives each target block's
    tr(W_k C_zz W_kᵀ) as tr(C_zz H_k) instead of the 2·p²·Q product C_zz Wᵀ: the grams are one
    p²·Q syrk, shared by val and test."""
    cols = moments.columns(targets)
    starts = np.cumsum([0, *_dims_of(moments, targets)])[:-1]
    n, mean, cross = moments.count(split), moments.mean(split), moments.cross[split]
    diagonal = moments.scatter_diagonal(split)
    sst = _sst(moments, split, targets, cols, starts, diagonal)
    # Column-wise (p × Q) in C order throughout, the layout of a solve's dgemm and of the rows
    # C[basis] that hold C_zu, so that every product reads both operands in the same order
    # (elementwise products across mismatched layouts run several times slower).
    weight_t = np.ascontiguousarray(weight_t)
    weight_mean = mean[basis_cols] @ weight_t
    fitted = _column_dots(weight_t, cross, basis_cols, cols) - n * mean[cols] * weight_mean
    if train_penalty is not None:
        if split != "train":
            raise LMDError("internal: the penalty shortcut holds on the train split only")
        column_alpha, unit_penalty = train_penalty
        per_column = diagonal[cols] - fitted - column_alpha * (unit_penalty @ weight_t**2)
        return 1.0 - np.add.reduceat(per_column, starts) / sst
    offset = mean[cols] - weight_mean - bias
    c_zz = _sub(cross, basis_cols, basis_cols)
    if grams is None:
        # w C_zz wᵀ by one dgemm: at p = 768 it ran about as fast as a triangular product (dtrmm)
        # with half the arithmetic, and needs no transposed copy of the weights
        quadratic = np.einsum("ij,ij->j", c_zz @ weight_t, weight_t) - n * weight_mean**2
        per_column = diagonal[cols] - 2.0 * fitted + quadratic + n * offset**2
        return 1.0 - np.add.reduceat(per_column, starts) / sst
    per_column = diagonal[cols] - 2.0 * fitted - n * weight_mean**2 + n * offset**2
    quadratic = [_traces_with_lower(h.T, [c_zz])[0] for h in grams]  # h.T: the lower triangle, C-ordered
    return 1.0 - (np.add.reduceat(per_column, starts) + quadratic) / sst


def _block_grams(weight_t: np.ndarray, dims: Sequence[int]) -> list[np.ndarray]:
    """Per target block k (``dims`` its widths, in order) of ``weight_t`` (p × Q), the p × p Gram
    H_k = W_kᵀ W_k of its weights, in Fortran order (scipy's dsyrk), its upper triangle only and
    the lower one zero: H_k.T is the C-ordered lower triangle :func:`_traces_with_lower` reads."""
    starts = np.cumsum([0, *dims])
    return [dsyrk(1.0, weight_t[:, a:b]) for a, b in zip(starts[:-1], starts[1:])]


def fit_targets(moments: Moments, basis: Sequence[str], targets: Sequence[str], alpha,
                warn_edge: bool = True) -> dict[str, tuple[RidgeFit, list[dict]]]:
    """Ridge fits of every target on one shared ``basis``: one Cholesky per α for all targets
    (Wᵀ = (S_zz + diag λ)⁻¹ [S_zu₁ … S_zu_k]); with a grid, each target keeps the α of its
    highest val R² (first in grid order on ties). Returns {target: (fit, table)}, the table
    ``[{"alpha": α, "val_r2": R²}, …]`` in grid order, R² NaN where α is ill-posed (α = 0 on a
    singular basis or one wider than the train rows). With ``warn_edge``, a choice at the grid's
    edge warns (:func:`warn_if_alpha_at_grid_edge`)."""
    return _fit_targets(moments, basis, targets, alpha, warn_edge)[0]


def _fit_targets(moments: Moments, basis: Sequence[str], targets: Sequence[str], alpha, warn_edge: bool,
                 keep_grams: bool = False) -> tuple[dict[str, tuple[RidgeFit, list[dict]]], np.ndarray, np.ndarray,
                                                    list[np.ndarray] | None]:
    """:func:`fit_targets`, and the kept fits' Wᵀ (p × Q, C order) and b (Q,) side by side in
    ``targets`` order, of which each RidgeFit's weight and bias are views. With ``keep_grams``,
    val is scored through the targets' weight grams (:func:`_block_grams`), and the kept fits'
    grams are returned too, for scoring test without another p²·Q product (a one-model basis:
    p × p per target, no larger than its weights)."""
    if not targets:
        raise LMDError("no targets to fit")
    _check_basis(basis, targets)
    grid = _alpha_grid(alpha)
    strict = grid is None  # one α: an ill-posed fit is an error, not a skipped grid point
    grid = grid or (float(alpha),)
    zi, ti = moments.columns(basis), moments.columns(targets)
    starts = np.cumsum([0, *_dims_of(moments, targets)])
    n, mean = moments.count("train"), moments.mean("train")
    _check_moments_basis(moments, basis, zi)
    s_zz, s_zt = moments.scatter_block("train", zi, zi), moments.scatter_block("train", zi, ti)
    diagonal, raw_diagonal = np.diagonal(s_zz).copy(), np.diagonal(moments.cross["train"])[zi]
    val = np.full((len(grid), len(targets)), np.nan)
    best: dict[int, tuple[float, float]] = {}  # target → (val R², α) of the fit kept so far
    kept_t, kept_bias = np.empty((len(zi), len(ti))), np.empty(len(ti))  # that fit's Wᵀ and b
    kept_grams = [None] * len(targets) if keep_grams else None  # and its grams
    what = f"fit of {list(targets)} on {list(basis)}"
    for a, alpha_a in enumerate(grid):
        if strict:
            _check_least_squares(n, len(zi), alpha_a, what)
        elif alpha_a == 0 and n <= len(zi):
            continue
        penalty = ridge_penalty(diagonal, _dims_of(moments, basis), alpha_a)
        try:
            weight_t = _ridge_solve(s_zz.copy(), penalty, s_zt, what, raw_diagonal)
        except LMDError:
            if strict:
                raise
            continue
        bias = mean[ti] - mean[zi] @ weight_t
        grams = _block_grams(weight_t, np.diff(starts)) if keep_grams else None
        val[a] = _targets_r2(moments, "val", zi, targets, weight_t, bias, grams=grams)
        for k in range(len(targets)):
            if k not in best or val[a, k] > best[k][0]:
                block = slice(starts[k], starts[k + 1])
                best[k] = (val[a, k], alpha_a)
                kept_t[:, block], kept_bias[block] = weight_t[:, block], bias[block]
                if keep_grams:
                    kept_grams[k] = grams[k]
    out = {}
    for k, target in enumerate(targets):
        if k not in best:
            raise LMDError(f"fit of {target!r} on {list(basis)}: no α of {list(grid)} gives a well-posed "
                           "fit; include an α > 0")
        block = slice(starts[k], starts[k + 1])
        table = [{"alpha": g, "val_r2": float(v)} for g, v in zip(grid, val[:, k])]
        out[target] = (RidgeFit(tuple(basis), target, best[k][1], kept_t[:, block].T, kept_bias[block]), table)
    if warn_edge and not strict:
        warn_if_alpha_at_grid_edge(grid, {t: fit.alpha for t, (fit, _) in out.items()},
                                   f"fit on {list(basis)}")
    return out, kept_t, kept_bias, kept_grams


def select_alpha(
    moments: Moments, basis: Sequence[str], target: str, alphas: Sequence[float], warn_edge: bool = True
) -> tuple[RidgeFit, list[dict]]:
    """The α of the grid with the highest val R² (first in grid order on ties), refitted with
    :func:`fit_ridge` so the returned fit equals the fixed-α fit of that α exactly; and the
    table ``[{"alpha": α, "val_r2": R²}, …]`` in grid order (R² NaN where α is ill-posed)."""
    if isinstance(alphas, (numbers.Real, str)):
        raise LMDError(f"select_alpha chooses among a grid of α; got the single value {alphas!r}: "
                       "pass a list, or use fit_ridge for one α")
    grid = _alpha_grid(list(alphas))
    fit, table = fit_targets(moments, basis, [target], grid, warn_edge=warn_edge)[target]
    return fit_ridge(moments, basis, target, fit.alpha), table


def fit_with_alpha(moments: Moments, basis: Sequence[str], target: str, alpha, warn_edge: bool = True) -> RidgeFit:
    """A fixed-α fit, or the val-selected fit when ``alpha`` is a grid."""
    grid = _alpha_grid(alpha)
    if grid is None:
        return fit_ridge(moments, basis, target, alpha)
    return select_alpha(moments, basis, target, grid, warn_edge=warn_edge)[0]


def fit_pairwise(moments: Moments, alpha: "float | Sequence[float]") -> list[dict]:
    """Every ordered pair (basis → target), fitted on train, scored on every split.

    ``alpha`` is one ridge strength, or a list/tuple/array grid from which each fit picks
    its own α by val R²; each row's ``alpha`` is the one used. All targets of one basis model
    share its Cholesky factor (:func:`fit_targets`) and are scored together, val and test from
    one gram of each target's weights (:func:`_block_grams`; 2026-12-06, AMD EPYC, 12 models ×
    768: the 132 fits 4.3 → 3.7 s)."""
    _alpha_grid(alpha)
    _check_two_models(moments.names, "pairwise fits")
    _check_moments_basis(moments, moments.names, np.arange(moments.width))  # every model is a basis
    scores = {}
    for basis in moments.names:
        targets = [n for n in moments.names if n != basis]
        fits, weight_t, bias, grams = _fit_targets(moments, [basis], targets, alpha, warn_edge=False,  # warned below
                                                   keep_grams=True)
        zi = moments.columns([basis])
        unit = ridge_penalty(moments.scatter_diagonal("train")[zi], [len(zi)], 1.0)
        alphas = np.repeat([fits[t][0].alpha for t in targets], _dims_of(moments, targets))
        r2 = {"train": _targets_r2(moments, "train", zi, targets, weight_t, bias, (alphas, unit)),
              "val": [next(row["val_r2"] for row in fits[t][1] if row["alpha"] == fits[t][0].alpha) for t in targets],
              "test": _targets_r2(moments, "test", zi, targets, weight_t, bias, grams=grams)}
        for split in SPLITS:
            for target, value in zip(targets, r2[split]):
                scores[basis, target, split] = (float(value), fits[target][0].alpha)
    warn_if_alpha_at_grid_edge(alpha, {f"{b}→{t}": a for (b, t, s), (_, a) in scores.items() if s == "val"},
                               "pairwise fits")
    return [{"basis": basis, "target": target, "split": split, "r2": scores[basis, target, split][0],
             "alpha": scores[basis, target, split][1]}
            for target in moments.names for basis in moments.names if basis != target for split in SPLITS]
