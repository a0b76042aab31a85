"""Streaming joint moments of all models' embeddings, per split (LMD, arXiv 2210.10289).

One pass over the embedding shards of all models accumulates, per split and in float64,
the joint sufficient statistics of the concatenated embeddings x = [x_1 | … | x_M]:

    n = Σ 1,   s = Σ x,   C = Σ x xᵀ           (:class:`Moments`)

Any fit of a target model on a basis is then solved from blocks of those statistics
(:mod:`lmdecomp.lmd.fits`) without re-reading embeddings. The fits read the centred scatter
S = C − n·μμᵀ (μ = s/n) as model blocks (:meth:`Moments.scatter_block`). Moments are
additive, so shards can be reduced in any order or in parallel jobs (:func:`reduce_moments`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from lmdecomp.atomic import atomic_path
from lmdecomp.lmd.blas import syrk_lower
from lmdecomp.lmd.errors import LMDError

if TYPE_CHECKING:  # annotation only: blocks imports this module
    from lmdecomp.lmd.blocks import BlockMoments


SPLITS = ("train", "val", "test")


def blas_threads(threads: int):
    """Pin the BLAS thread count: a reduction split over a different number of threads
    rounds differently, and artifacts must not depend on how many cores a job was given
    (Snakemake sets OMP_NUM_THREADS per job, DVC does not)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=max(1, int(threads)), user_api="blas")


def _columns(all_names: Sequence[str], dims: Sequence[int], names: Iterable[str]) -> np.ndarray:
    if isinstance(names, str):
        raise LMDError(f"give model names as a list, e.g. [{names!r}]; got the string {names!r}")
    names = list(names)
    if not names:
        raise LMDError("no models named: a basis (or target list) needs at least one model")
    unknown = [n for n in names if n not in all_names]
    if unknown:
        raise LMDError(f"unknown model(s) {unknown}; these moments hold {list(all_names)}")
    starts = np.cumsum([0, *dims])
    index = {name: i for i, name in enumerate(all_names)}
    return np.concatenate([np.arange(starts[index[n]], starts[index[n] + 1]) for n in names])


def _traces_with_lower(lower: np.ndarray, symmetric: Sequence[np.ndarray], band: int = 256) -> np.ndarray:
    """tr(C H) = Σ C∘H for each symmetric C of ``symmetric`` and the symmetric H of which
    ``lower`` (C order, or a view) holds the lower triangle with the diagonal, its strict upper
    triangle zero: 2 Σ_{i ≥ j} C_ij H_ij − Σ_i C_ii H_ii.

    Reads only the lower triangles, a band of rows at a time, every C in the same pass over H:
    at width 9,216 these are memory-bound passes, so each byte is read once."""
    width = lower.shape[0]
    totals = np.zeros(len(symmetric))
    for lo in range(0, width, band):
        hi = min(lo + band, width)
        h_band = lower[lo:hi, :hi]  # the band's part of the triangle (its diagonal block's upper part is zero)
        for k, c in enumerate(symmetric):
            totals[k] += np.einsum("ij,ij->", c[lo:hi, :hi], h_band)
    h_diagonal = np.diagonal(lower)
    return 2.0 * totals - np.array([np.diagonal(c) @ h_diagonal for c in symmetric])


class _GramTraces:
    """tr(C G) for symmetric width × width matrices C and the Gram G = R Rᵀ of the columns of
    Rᵀ (k × width), without forming G (a call per Rᵀ; the buffers are kept between calls):

        tr(C G) = Σ_bands [2 Σ C_band,left ∘ (R_band R_leftᵀ) + tr(C_bb G_bb)]

    over bands of ``band`` rows of G's lower triangle, the band's part left of its diagonal
    block by one dgemm, the diagonal block by one syrk, each read by every C while in cache.
    Against one syrk of all of G and then a pass over it (:func:`_traces_with_lower`): the same
    arithmetic and no width² array, which at width 9,216 is 680 MB, and a first touch of such
    an array cost 0.8 s of a leave-one-out fit at 12 × 768 (2026-12-07, AMD EPYC VM)."""

    def __init__(self, width: int, band: int = 768) -> None:
        self.band = band
        self.left = np.empty(band * width)  # flat: each band's (rows × left) product is C-contiguous
        self.diagonal: dict[int, np.ndarray] = {}  # by size; syrk writes the lower triangle, the upper stays 0

    def __call__(self, rows_t: np.ndarray, symmetric: Sequence[np.ndarray]) -> np.ndarray:
        width = rows_t.shape[1]
        totals = np.zeros(len(symmetric))
        for lo in range(0, width, self.band):
            hi = min(lo + self.band, width)
            band_t = rows_t[:, lo:hi]
            if lo:
                left = self.left[: (hi - lo) * lo].reshape(hi - lo, lo)
                np.matmul(band_t.T, rows_t[:, :lo], out=left)
                for i, c in enumerate(symmetric):
                    totals[i] += 2.0 * np.einsum("ij,ij->", c[lo:hi, :lo], left)
            if hi - lo not in self.diagonal:
                self.diagonal[hi - lo] = np.zeros((hi - lo, hi - lo))
            block = self.diagonal[hi - lo]
            syrk_lower(block, np.ascontiguousarray(band_t), beta=0.0)
            totals += _traces_with_lower(block, [c[lo:hi, lo:hi] for c in symmetric])
        return totals


def _symmetrise_from_lower(a: np.ndarray, block: int = 64) -> None:
    """Copy the lower triangle of the C-ordered square ``a`` onto its upper one, in place, one
    ``block`` × ``block`` tile at a time (no width² temporaries). Tiles, not bands of rows: a
    transposed copy reads one cache line per element, and a 64 × 64 tile's lines stay in L1
    (2026-12-07, AMD EPYC, width 9,216: 0.27 s per matrix in bands of 512 rows, 0.08 s in tiles)."""
    width = a.shape[0]
    for lo in range(0, width, block):
        hi = min(lo + block, width)
        for right in range(hi, width, block):
            a[lo:hi, right:right + block] = a[right:right + block, lo:hi].T
        tile = a[lo:hi, lo:hi]
        upper = np.triu_indices(hi - lo, 1)
        tile[upper] = tile.T[upper]


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise LMDError(f"unknown split {split!r}; the splits are {list(SPLITS)}")


@dataclass
class Moments:
    """Joint float64 moments (count, sum, cross-product) of several models' embeddings per split."""

    names: list[str]
    dims: list[int]
    n: dict[str, int] = field(default_factory=dict)
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    cross: dict[str, np.ndarray] = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # provenance, e.g. words kept and dropped by alignment

    def __post_init__(self) -> None:
        if len(self.names) != len(self.dims):
            raise LMDError(f"{len(self.names)} model names {list(self.names)} but the widths "
                           f"{list(self.dims)}: give one width per model")
        width = sum(self.dims)
        for split in SPLITS:
            self.n.setdefault(split, 0)
            self.sums.setdefault(split, np.zeros(width))
            self.cross.setdefault(split, np.zeros((width, width)))

    @property
    def width(self) -> int:
        return sum(self.dims)

    def columns(self, names: Iterable[str]) -> np.ndarray:
        """Column indices of the named models' blocks, in the order given."""
        return _columns(self.names, self.dims, names)

    def update(self, split: str, x: np.ndarray) -> None:
        """Add rows ``x`` (rows × width) of one split."""
        self._add(split, x)
        _symmetrise_from_lower(self.cross[split])

    def _add(self, split: str, x: np.ndarray) -> None:
        """Add rows to n, the sums and the lower triangle of the cross-product only."""
        _check_split(split)
        x = np.ascontiguousarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.width:
            raise LMDError(f"rows to add must be a (rows × {self.width}) array, the joint width of "
                           f"{self.names}; got shape {x.shape}")
        self.n[split] += x.shape[0]
        self.sums[split] += x.sum(axis=0)
        syrk_lower(self.cross[split], x)  # the GIL released: the pass's reader runs meanwhile

    def merge(self, other: "Moments") -> "Moments":
        if other.names != self.names or other.dims != self.dims:
            raise LMDError("cannot merge moments of different model sets")
        for split in SPLITS:
            self.n[split] += other.n[split]
            self.sums[split] += other.sums[split]
            self.cross[split] += other.cross[split]
        return self

    def count(self, split: str) -> int:
        """The split's row count n; an error if the split is empty (nothing to fit or score)."""
        _check_split(split)
        n = self.n[split]
        if n == 0:
            raise LMDError(f"the {split} split is empty: no rows to fit or score")
        return n

    def mean(self, split: str) -> np.ndarray:
        return self.sums[split] / self.count(split)

    def root_n_mean(self, split: str) -> np.ndarray:
        """√n μ: S = C + (√n μ)(−√n μ)ᵀ is formed from it, so that every S entry is the same sum
        wherever it is computed (and S is exactly symmetric)."""
        return np.sqrt(self.count(split)) * self.mean(split)

    def scatter_diagonal(self, split: str) -> np.ndarray:
        """diag S = diag C − n μ², without forming S."""
        return np.diagonal(self.cross[split]) - self.root_n_mean(split)**2

    def scatter_block(self, split: str, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """S[rows][:, cols] of S = C − n μμᵀ as a new array, without forming the width² S (0.7 GB
        per split at the joint width 9,216, and first touching one costs more than its
        arithmetic): the block of C plus the block of −n μμᵀ."""
        root_n_mean = self.root_n_mean(split)
        return np.multiply.outer(root_n_mean[rows], -root_n_mean[cols]) + _sub(self.cross[split], rows, cols)

    def save(self, path: str | Path) -> None:
        from safetensors.numpy import save_file

        tensors = {}
        for split in SPLITS:
            tensors[f"{split}.n"] = np.array([self.n[split]], dtype=np.int64)
            tensors[f"{split}.sum"] = self.sums[split]
            tensors[f"{split}.cross"] = self.cross[split]
        # One metadata key only: safetensors keeps metadata in a hash map whose order varies
        # between processes, and the file bytes must not.
        meta = {"layout": json.dumps({"names": self.names, "dims": self.dims, "info": self.info}, sort_keys=True)}
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> "Moments":
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as fh:
            layout = json.loads(fh.metadata()["layout"])
            m = cls(layout["names"], layout["dims"], info=layout.get("info", {}))
            for split in SPLITS:
                m.n[split] = int(fh.get_tensor(f"{split}.n")[0])
                m.sums[split] = fh.get_tensor(f"{split}.sum")
                m.cross[split] = fh.get_tensor(f"{split}.cross")
        return m


def reduce_moments(parts: Iterable[Moments]) -> Moments:
    """Add the moments of :func:`accumulate_moments` jobs over disjoint shard ranges (given in
    shard order, covering every shard once: :class:`_PartCoverage`) into the moments of all
    shards. ``parts`` may be a generator (e.g. loading each file): one part is held at a time."""
    coverage, out, kept = _PartCoverage(), None, 0
    for part in parts:
        coverage.add(part)
        if out is None:
            out = Moments(list(part.names), list(part.dims),
                          info={k: v for k, v in part.info.items() if k not in _PART_KEYS})
        out.merge(part)
        kept += part.info.get("words_kept", 0)
    if out is None:
        raise LMDError("no partial moments to reduce")
    coverage.finish()
    if "words" in out.info:
        out.info.update(words_kept=kept, words_dropped=out.info["words"] - kept)
    return out


def _dims_of(moments: Moments, names: Sequence[str]) -> list[int]:
    return [moments.dims[moments.names.index(n)] for n in names]


def _runs(idx: np.ndarray) -> list[tuple[slice, slice]]:
    """The contiguous runs of an index array, as (positions in ``idx``, the indices they hold)."""
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    starts, stops = [0, *breaks.tolist()], [*breaks.tolist(), len(idx)]
    return [(slice(a, b), slice(int(idx[a]), int(idx[a]) + b - a)) for a, b in zip(starts, stops)]


def _sub(matrix: np.ndarray, rows: np.ndarray, cols: np.ndarray, max_runs: int = 64) -> np.ndarray:
    """matrix[..., rows, cols] over the last two axes (any leading ones, e.g. bootstrap blocks,
    are kept): a view when both are one contiguous run (a single model's block), else a copy
    made run by run when they are a few runs (model blocks). np.take or np.ix_ on a width²
    matrix is a random-access gather, ~20× slower than copying the same blocks."""
    row_runs = _runs(rows) if len(rows) else []
    col_runs = _runs(cols) if len(cols) else []
    if len(row_runs) == 1 and len(col_runs) == 1:
        return matrix[..., row_runs[0][1], col_runs[0][1]]
    if len(row_runs) * len(col_runs) > max_runs:
        return matrix[..., rows[:, None], cols[None, :]]
    out = np.empty((*matrix.shape[:-2], len(rows), len(cols)), dtype=matrix.dtype)
    for at_rows, src_rows in row_runs:
        for at_cols, src_cols in col_runs:
            out[..., at_rows, at_cols] = matrix[..., src_rows, src_cols]
    return out


def _column_dots(a: np.ndarray, matrix: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Σ_i a[i, k] · matrix[rows[i], cols[k]] for every k: the column-wise dot products of ``a``
    (len(rows) × len(cols)) with the block ``matrix[rows][:, cols]``, summed run by run over
    views of ``matrix`` where the indices are a few runs (model blocks), so the block is never
    copied (as :func:`_sub` would copy it)."""
    row_runs, col_runs = _runs(rows), _runs(cols)
    if len(row_runs) * len(col_runs) > 64:
        return np.einsum("ij,ij->j", a, _sub(matrix, rows, cols))
    out = np.zeros(len(cols))
    for at_rows, src_rows in row_runs:
        for at_cols, src_cols in col_runs:
            out[at_cols] += np.einsum("ij,ij->j", a[at_rows, at_cols], matrix[src_rows, src_cols])
    return out


_PART_KEYS = ("block_offset", "blocks_total", "shard_range", "n_shards")  # a part's own, not the reduce's


class _PartCoverage:
    """Checks, one part at a time, that the parts' shard ranges tile 0..n_shards−1 in the order
    given: each starting where the previous ended. A part passed twice would otherwise be added
    twice (block offsets alone cannot tell: neighbouring parts share the block that straddles
    their boundary)."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []
        self.n_shards: int | None = None

    def _shown(self) -> str:
        return ", ".join(f"{lo}..{hi - 1}" for lo, hi in self.ranges)

    def add(self, part: "Moments | BlockMoments") -> None:
        if "shard_range" not in part.info or "n_shards" not in part.info:
            raise LMDError("a part's moments do not record their shard range (written by an older "
                           "version); rerun every moments_part job")
        n_shards = int(part.info["n_shards"])
        if self.n_shards is not None and n_shards != self.n_shards:
            raise LMDError(f"the parts were computed over embeddings of different shard counts "
                           f"{sorted({self.n_shards, n_shards})}; rerun every moments_part job")
        self.n_shards = n_shards
        lo, hi = (int(v) for v in part.info["shard_range"])
        end = self.ranges[-1][1] if self.ranges else 0
        self.ranges.append((lo, hi))
        where = f"(parts so far cover {self._shown()} of {n_shards} shards)"
        if lo < end:
            raise LMDError(f"part {len(self.ranges) - 1} (shards {lo}..{hi - 1}) overlaps the parts before it, "
                           f"which reach shard {end - 1} {where}: pass each part once, in shard order")
        if lo > end:
            raise LMDError(f"shards {end}..{lo - 1} are in no part {where}: pass every part, in shard order")

    def finish(self) -> None:
        end = self.ranges[-1][1]
        if end != self.n_shards:
            raise LMDError(f"shards {end}..{self.n_shards - 1} are in no part (parts cover {self._shown()} of "
                           f"{self.n_shards} shards): pass every part, in shard order")
