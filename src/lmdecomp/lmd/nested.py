"""Ridge refits of bootstrap replicates from one Cholesky factor per replicate and ridge strength,
shared by nested fits: the steps of a greedy selection path (basis ``path[:k]``, k = 1, 2, …).

For one α the regularised train scatter of the basis ``path[:k]`` is the leading principal block
of that of ``path[:K]`` (K the last step fitted at α): a column's ridge λ depends only on its own
model (:func:`lmdecomp.lmd.fits.ridge_penalty`) and the scatter of a prefix is a block of the
scatter. A Cholesky factor inherits this,

    A = L Lᵀ  ⇒  A[:P, :P] = L[:P, :P] L[:P, :P]ᵀ,

so replicate r of step k costs one backward triangular solve of width P_k on the leading block
of one factor L_r instead of a factorisation of its own; the forward solve L_r Y = S_zu is shared
by every step too, since its first P_k rows are those of the prefix's (:func:`lmdecomp.lmd.bootstrap.path_r2_samples`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.linalg import solve_triangular

from lmdecomp.lmd.fits import ridge_penalty


def train_factor(s_zz: np.ndarray, dims: Sequence[int], alpha: float) -> np.ndarray | None:
    """(R, P, P) lower Cholesky factors of the replicates' regularised train scatters
    S_zz + diag λ (λ of :func:`ridge_penalty` on each replicate's own S_zz, basis widths ``dims``),
    or None where a replicate's matrix is not numerically positive definite (α = 0 on a nearly
    singular resample: the caller falls back to an LU solve)."""
    regularised = s_zz.copy()
    diagonal = np.arange(s_zz.shape[-1])
    regularised[:, diagonal, diagonal] += ridge_penalty(np.diagonal(s_zz, axis1=1, axis2=2), dims, alpha)
    try:
        return np.linalg.cholesky(regularised)
    except np.linalg.LinAlgError:
        return None


def forward_solve(factor: np.ndarray, s_zu: np.ndarray) -> np.ndarray:
    """(R, P, q) Y = L⁻¹ S_zu per replicate, for the whole basis. Forward substitution reads
    the leading rows only, so Y[:P_k] = L[:P_k, :P_k]⁻¹ S_zu[:P_k] for every prefix: one forward
    solve serves every step of a path (:func:`prefix_solve`)."""
    return np.stack([solve_triangular(factor[r], s_zu[r], lower=True, check_finite=False)
                     for r in range(len(factor))])


def prefix_solve(factor: np.ndarray, forward: np.ndarray, width: int) -> np.ndarray:
    """(R, width, q) solutions W of (L Lᵀ)[:width, :width] W = S_zu[:width] per replicate: the
    backward solve L[:width, :width]ᵀ W = Y[:width] on the leading rows of the shared forward
    solution Y (:func:`forward_solve`; module doc)."""
    return np.stack([solve_triangular(factor[r, :width, :width], forward[r, :width], lower=True, trans="T",
                                      check_finite=False)
                     for r in range(len(factor))])


def prefix_moments(moments: tuple[np.ndarray, ...], width: int, p: int) -> tuple[np.ndarray, ...]:
    """The replicate moments (n, μ, S_zz, S_zu, tr S_uu) of the basis' first ``width`` columns and
    the target, from those of the whole basis (``p`` columns, the target after them)."""
    n, mean, s_zz, s_zu, tr_uu = moments
    columns = np.r_[0:width, p:mean.shape[1]]
    return n, mean[:, columns], s_zz[:, :width, :width], s_zu[:, :width], tr_uu
