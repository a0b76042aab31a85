"""LMD on arrays: :func:`decompose` for embeddings already in memory (a notebook's), with the
same fits, tables and intervals as the pipeline's ``lmd_fit`` stage.

    >>> result = lmdecomp.decompose({"a": emb_a, "b": emb_b, "c": emb_c}, split, alpha=[0, 0.01, 0.1])
    >>> result.pairwise          # basis, target, split, r2, alpha  (+ r2_lo, r2_hi with bootstrap > 0)
    >>> result.loo               # target, split, r2, alpha         (+ r2_lo, r2_hi)

Rows are aligned across models (row i of every array describes the same text); widths may
differ. The pipeline does the same from streamed moments of its Parquet shards, so on the same
rows the two agree to rounding (tests/workflow/test_workflow.py checks 1e-10 on the smoke run's
shards; tests/test_api.py checks the fits against explicit numpy ones).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import polars as pl

from lmdecomp.lmd.blocks import BlockMoments
from lmdecomp.lmd.bootstrap import BootstrapCache, add_confidence_intervals
from lmdecomp.lmd.errors import LMDError
from lmdecomp.lmd.fits import fit_pairwise
from lmdecomp.lmd.loo import fit_leave_one_out, summary_metrics
from lmdecomp.lmd.moments import SPLITS, Moments, blas_threads

DEFAULT_ALPHA = (0.0, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # params.yaml's lmd.alpha
_CHUNK_ROWS = 2048  # rows per moment update: bounds the float64 copy of a chunk


@dataclass
class Decomposition:
    """The fits of :func:`decompose`: ``pairwise`` and ``loo`` with the columns of
    ``results/lmd/pairwise.parquet`` and ``loo.parquet``; ``moments`` the joint moments they came from."""

    pairwise: pl.DataFrame
    loo: pl.DataFrame
    moments: Moments

    def summary(self) -> dict:
        """Mean and per-model leave-one-out test R², mean pairwise test R² (``results/lmd/metrics.json``)."""
        return summary_metrics(self.pairwise.to_dicts(), self.loo.to_dicts())


def _check_inputs(embeddings: Mapping[str, object], split) -> tuple[list[str], list[np.ndarray], np.ndarray]:
    if not isinstance(embeddings, Mapping) or len(embeddings) < 2:
        raise LMDError("embeddings must map at least two model names to arrays (rows × width)")
    names, arrays = [str(n) for n in embeddings], []
    for name, value in embeddings.items():
        a = np.asarray(value)
        if a.ndim != 2 or a.shape[1] == 0 or not np.issubdtype(a.dtype, np.number):
            raise LMDError(f"embeddings[{name!r}] must be a 2-D numeric array (rows × width); got shape {a.shape}, "
                           f"dtype {a.dtype}")
        if not np.isfinite(a).all():
            raise LMDError(f"embeddings[{name!r}] holds NaN or inf (first at row {np.argwhere(~np.isfinite(a))[0][0]})")
        arrays.append(a)
    labels = np.asarray(split).astype(str).reshape(-1)
    rows = {name: len(a) for name, a in zip(names, arrays)}
    if len(set(rows.values())) != 1 or len(labels) != arrays[0].shape[0]:
        raise LMDError(f"every array and split need the same number of rows (one per text); got {rows} and "
                       f"{len(labels)} split labels")
    unknown = sorted(set(labels) - set(SPLITS))
    if unknown:
        raise LMDError(f"split labels must be 'train', 'val' or 'test'; got {unknown[:5]}")
    return names, arrays, labels


def _update(moments: Moments, arrays: Sequence[np.ndarray], labels: np.ndarray, rows: np.ndarray) -> None:
    """Add ``rows`` (row indices, ascending) of the joint embedding to ``moments``, per split."""
    for split in SPLITS:
        chosen = rows[labels[rows] == split]
        for start in range(0, len(chosen), _CHUNK_ROWS):
            idx = chosen[start:start + _CHUNK_ROWS]
            moments.update(split, np.concatenate([a[idx] for a in arrays], axis=1, dtype=np.float64))


def decompose(
    embeddings: Mapping[str, object],
    split: Sequence[str],
    alpha: float | Sequence[float] = DEFAULT_ALPHA,
    *,
    bootstrap: int = 0,
    n_blocks: int = 40,
    level: float = 0.9,
    seed: int = 0,
    threads: int | None = None,
) -> Decomposition:
    """Pairwise and leave-one-out LMD of ``embeddings`` ({model name: rows × width array}).

    ``split`` gives each row's "train", "val" or "test": fits use train, α is chosen on val
    when ``alpha`` is a grid (as ``lmd.alpha``), and every split is scored (R² pooled over the
    target's dimensions). ``bootstrap`` > 0 adds ``r2_lo``/``r2_hi``: block-bootstrap intervals
    at ``level`` over ``n_blocks`` blocks of consecutive rows (keep rows of one document
    together, as the pipeline keeps its sequences in document order). ``threads`` caps BLAS.
    """
    names, arrays, labels = _check_inputs(embeddings, split)
    dims = [a.shape[1] for a in arrays]
    n = len(labels)
    with blas_threads(threads) if threads else contextlib.nullcontext():
        if bootstrap > 0:
            if not 1 <= n_blocks <= n:
                raise LMDError(f"n_blocks must be between 1 and the {n} rows; got {n_blocks}")
            per_block = -(-n // n_blocks)
            parts = []
            for start in range(0, n, per_block):
                part = Moments(names, dims)
                _update(part, arrays, labels, np.arange(start, min(start + per_block, n)))
                parts.append(part)
            blocks = BlockMoments.from_moments(parts)
            moments = blocks.total()
        else:
            moments = Moments(names, dims)
            _update(moments, arrays, labels, np.arange(n))
        pairwise, loo = fit_pairwise(moments, alpha), fit_leave_one_out(moments, alpha)
        if bootstrap > 0:
            ci = dict(n_boot=bootstrap, level=level, seed=seed, cache=BootstrapCache(blocks, bootstrap, seed))
            pairwise = add_confidence_intervals(pairwise, blocks, **ci)
            loo = add_confidence_intervals(loo, blocks, **ci)
    return Decomposition(pl.DataFrame(pairwise), pl.DataFrame(loo), moments)

