"""Representation-similarity baselines to set beside LMD's R².

* Linear CKA with the biased HSIC estimator (Kornblith et al. 2019). For centred X (n×d),
  Y (n×e) and linear Gram matrices K = XXᵀ, L = YYᵀ,

      HSIC(K, L) = tr(K H L H) / (n−1)²,   H = I − 11ᵀ/n
      CKA(X, Y)  = HSIC(K, L) / √(HSIC(K, K) HSIC(L, L)) = ‖YᵀX‖_F² / (‖XᵀX‖_F ‖YᵀY‖_F)

  which needs only the centred scatter blocks S_xy, S_xx, S_yy: it is computed from the
  same :class:`~lmdecomp.lmd.Moments` as the LMD fits (:func:`cka_from_moments`).

* Linear CKA with the unbiased HSIC estimator (Song et al. 2012; used by Nguyen et al.
  2021). With K̃, L̃ the Gram matrices with zeroed diagonal,

      HSIC_u(K, L) = [tr(K̃ L̃) + (1ᵀK̃1)(1ᵀL̃1) / ((n−1)(n−2)) − 2/(n−2) · 1ᵀK̃L̃1] / (n(n−3))

  It needs the Gram diagonals (row norms), which moments do not hold, so it is computed
  from embeddings (:func:`cka_unbiased`) — in O(n·d) memory via feature-space identities.

* Mutual k-nearest-neighbour alignment (Huh et al. 2024, "The Platonic Representation
  Hypothesis"): the mean over samples i of |N_X(i) ∩ N_Y(i)| / k, N the k nearest other
  samples by cosine similarity (:func:`mutual_knn`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from lmdecomp.lmd.errors import LMDError
from lmdecomp.lmd.moments import SPLITS, Moments


def cka_from_moments(moments: Moments, a: str | Sequence[str], b: str | Sequence[str], split: str = "test") -> float:
    """Linear CKA (biased HSIC) between models ``a`` and ``b`` on ``split``, from the centred
    scatter S = C − n μμᵀ of the moments: ‖S_ab‖_F² / (‖S_aa‖_F ‖S_bb‖_F). ``a``/``b`` may be
    lists of models (their embeddings concatenated)."""
    if split not in SPLITS:
        raise LMDError(f"unknown split {split!r}")
    ai = moments.columns([a] if isinstance(a, str) else a)
    bi = moments.columns([b] if isinstance(b, str) else b)
    s_ab = moments.scatter_block(split, ai, bi)
    norm = np.linalg.norm(moments.scatter_block(split, ai, ai)) * np.linalg.norm(moments.scatter_block(split, bi, bi))
    if norm <= 0:
        raise LMDError(f"a model has zero variance on the {split} split; CKA is undefined")
    return float(np.sum(s_ab * s_ab) / norm)


def cka_pairwise(moments: Moments, split: str = "test") -> list[dict]:
    """Linear CKA of every unordered pair of models: rows ``{"a", "b", "split", "cka"}``."""
    names = moments.names
    return [{"a": a, "b": b, "split": split, "cka": cka_from_moments(moments, a, b, split)}
            for i, a in enumerate(names) for b in names[i + 1:]]


def _hsic_unbiased_terms(x: np.ndarray, y: np.ndarray, xty: np.ndarray, kx: np.ndarray, ky: np.ndarray) -> float:
    """HSIC_u of linear kernels from feature-space quantities (formula in the module doc):

        tr(K̃L̃)   = ‖XᵀY‖_F² − Σ_i k_i l_i                (k_i = ‖x_i‖², l_i = ‖y_i‖²)
        1ᵀK̃1     = ‖Xᵀ1‖² − Σ_i k_i
        1ᵀK̃L̃1   = (X Xᵀ1 − k)ᵀ (Y Yᵀ1 − l)
    """
    n = x.shape[0]
    sx, sy = x.sum(axis=0), y.sum(axis=0)
    trace = np.sum(xty * xty) - kx @ ky
    sum_k, sum_l = sx @ sx - kx.sum(), sy @ sy - ky.sum()
    cross = (x @ sx - kx) @ (y @ sy - ky)
    return float((trace + sum_k * sum_l / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * cross) / (n * (n - 3)))


def _centred_pair(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Paired rows, checked for the unbiased estimator, each centred (only for rounding)."""
    x, y = _as_rows(x), _as_rows(y)
    if x.shape[0] != y.shape[0]:
        raise LMDError(f"x has {x.shape[0]} rows, y has {y.shape[0]}")
    if x.shape[0] < 4:
        raise LMDError("the unbiased HSIC estimator needs at least 4 samples")
    return x - x.mean(axis=0), y - y.mean(axis=0)


def hsic_unbiased(x: np.ndarray, y: np.ndarray) -> float:
    """Unbiased HSIC (Song et al. 2012) of linear kernels on rows of ``x`` and ``y``, in O(n·(d+e))
    memory plus the d×e matrix XᵀY. It is invariant to shifting either representation (the
    U-statistic estimates ‖Cov(x, y)‖_F²); rows are centred first only for rounding."""
    x, y = _centred_pair(x, y)
    return _hsic_unbiased_terms(x, y, x.T @ y, np.einsum("ij,ij->i", x, x), np.einsum("ij,ij->i", y, y))


def cka_unbiased(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA with unbiased HSIC: HSIC_u(K, L) / √(HSIC_u(K, K) HSIC_u(L, L)).

    Memory O(n·(d+e) + (d+e)²): XᵀX, YᵀY, XᵀY, row norms and column sums replace the n×n
    Gram matrices (time O(n·(d+e)²)). Unlike biased CKA it can be slightly negative for
    unrelated representations, and is undefined (error) if a self-HSIC_u is not positive."""
    x, y = _centred_pair(x, y)
    kx, ky = np.einsum("ij,ij->i", x, x), np.einsum("ij,ij->i", y, y)
    hxy = _hsic_unbiased_terms(x, y, x.T @ y, kx, ky)
    hxx = _hsic_unbiased_terms(x, x, x.T @ x, kx, kx)
    hyy = _hsic_unbiased_terms(y, y, y.T @ y, ky, ky)
    if hxx <= 0 or hyy <= 0:
        raise LMDError("a self-HSIC_u is not positive (too few samples or a constant representation)")
    return float(hxy / np.sqrt(hxx * hyy))


def _as_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise LMDError(f"expected a (samples × features) matrix, got shape {x.shape}")
    return x


def knn_indices(x: np.ndarray, k: int, chunk: int = 1024) -> np.ndarray:
    """(n, k) indices of each row's k most cosine-similar other rows (self excluded), most
    similar first. Chunked: O(n·chunk) memory for similarities, O(n²·d) time. Zero rows
    have similarity 0 to everything."""
    x = _as_rows(x)
    n = x.shape[0]
    if not 1 <= k <= n - 1:
        raise LMDError(f"k must be in 1..{n - 1} for {n} samples; got {k}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    unit = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
    out = np.empty((n, k), dtype=np.int64)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        sim = unit[lo:hi] @ unit.T
        sim[np.arange(hi - lo), np.arange(lo, hi)] = -np.inf  # a sample is not its own neighbour
        top = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(sim, top, axis=1), axis=1, kind="stable")
        out[lo:hi] = np.take_along_axis(top, order, axis=1)
    return out


def mutual_knn(x: np.ndarray, y: np.ndarray, k: int = 10, chunk: int = 1024) -> float:
    """Mutual k-NN alignment (Huh et al. 2024): mean_i |N_X(i) ∩ N_Y(i)| / k, N = the k nearest
    other samples by cosine similarity. 1 for identical representations, ≈ k/(n−1) for
    unrelated ones. Memory O(n·(chunk + k)); ties between equal similarities break arbitrarily."""
    x, y = _as_rows(x), _as_rows(y)
    if x.shape[0] != y.shape[0]:
        raise LMDError(f"x has {x.shape[0]} rows, y has {y.shape[0]}")
    nx, ny = knn_indices(x, k, chunk), knn_indices(y, k, chunk)
    n = x.shape[0]
    # |N_X(i) ∩ N_Y(i)| via one sort per row: both index sets are duplicate-free.
    both = np.sort(np.concatenate([nx, ny], axis=1), axis=1)
    overlap = np.sum(both[:, 1:] == both[:, :-1], axis=1)
    return float(np.mean(overlap) / k) if n else float("nan")


def split_rows(folders: Mapping[str, str | Path], split: str, max_rows: int) -> dict[str, np.ndarray]:
    """Per model, float64 embeddings of the first ``max_rows`` rows of ``split``, aligned across
    models (sequence rows, or the words every model has; see :func:`lmdecomp.lmd.aligned_shards`)."""
    from lmdecomp.lmd.stream import aligned_shards

    aligned = aligned_shards(folders)
    rows, have = [], 0
    for part_split, x, _ in aligned.rows:
        keep = part_split == split
        rows.append(x[keep])
        have += int(keep.sum())
        if have >= max_rows:
            break
    x = np.concatenate(rows)[:max_rows]
    edges = np.cumsum([0, *aligned.dims])
    return {name: x[:, edges[i]:edges[i + 1]] for i, name in enumerate(aligned.names)}


def similarity_table(
    moments: Moments, folders: Mapping[str, str | Path], split: str, max_rows: int, k: int
) -> list[dict]:
    """Every unordered model pair: linear CKA with biased HSIC on all rows of ``split`` (from the
    moments), and unbiased-HSIC CKA and mutual k-NN alignment on its first ``max_rows`` rows."""
    names = list(folders)
    data = split_rows(folders, split, max_rows)
    rows = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            x, y = data[a], data[b]
            rows.append({
                "a": a, "b": b, "split": split, "rows": len(x),
                "cka": cka_from_moments(moments, a, b, split),
                "cka_unbiased": cka_unbiased(x, y),
                "mutual_knn": mutual_knn(x, y, k=min(k, len(x) - 1)),
                "knn_k": min(k, len(x) - 1),
            })
    return rows
