"""Ridge refits of bootstrap replicates from one Cholesky factor per replicate and ridge strength,
shared by nested fits: the steps of a greedy selection path (basis ``path[:k]``, k = 1, 2, …).

For one α the regularised train scatter of the basis ``path[:k]`` is the leading principal block
of that of ``path[:K]`` (K the last step fitted at α): a column's ridge λ depends only on its own
model (:func:`lmdecomp.lmd.fits.ridge_penalty`) and the scatter of a prefix is a block of the
scatter. A Cholesky factor inherits this,

    A = L Lᵀ  ⇒  A[:P, :P] = L[:P, :P] L[:P, :P]ᵀ,

so replicate r of step k costs two triangular solves of width P_k on the leading block of one
factor L_r instead of a factorisation of its own (:func:`lmdecomp.lmd.bootstrap.path_r2_samples`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.linalg import cho_solve

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


def prefix_solve(factor: np.ndarray, s_zu: np.ndarray, width: int) -> np.ndarray:
    """(R, width, q) solutions W of (L Lᵀ)[:width, :width] W = S_zu[:width] per replicate, from the
    leading block of each factor (module doc)."""
    return np.stack([cho_solve((factor[r, :width, :width], True), s_zu[r, :width], check_finite=False)
                     for r in range(len(factor))])


def prefix_moments(moments: tuple[np.ndarray, ...], width: int, p: int) -> tuple[np.ndarray, ...]:
    """The replicate moments (n, μ, S_zz, S_zu, tr S_uu) of the basis' first ``width`` columns and
    the target, from those of the whole basis (``p`` columns, the target after them)."""
    n, mean, s_zz, s_zu, tr_uu = moments
    columns = np.r_[0:width, p:mean.shape[1]]
    return n, mean[:, columns], s_zz[:, :width, :width], s_zu[:, :width], tr_uu
