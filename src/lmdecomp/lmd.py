"""Language Model Decomposition (LMD, arXiv 2210.10289) from streaming moments.

One pass over the embedding shards of all models accumulates, per split and in float64,
the joint sufficient statistics of the concatenated embeddings x = [x_1 | … | x_M]:

    n = Σ 1,   s = Σ x,   C = Σ x xᵀ           (:class:`Moments`)

Any fit of a target model u on a basis z (one model, or all others concatenated) is
then solved from blocks of those statistics without re-reading embeddings. With the
centred scatter S = C − n·μμᵀ (μ = s/n) on the train split:

    W = S_uz (S_zz + diag λ)⁻¹,   b = μ_u − W μ_z,   λ_i = α · tr(S_jj) / p_j  (i in model j)

i.e. the paper's W = Cov(u,z)(Cov(z,z) + αI)⁻¹ with each basis model scaled to unit mean
variance first, so one α suits models of any scale, no model dominates a concatenated basis
by its scale alone, and α = 0 is ordinary least squares (:func:`ridge_penalty`). Goodness of
fit on a split s, pooled over target dimensions, with ū_s the mean of the split being scored:

    R² = 1 − Σ‖u − Wz − b‖² / Σ‖u − ū_s‖²
    Σ‖u − Wz − b‖² = tr S_uu − 2 tr(W S_zu) + tr(W S_zz Wᵀ) + n_s ‖μ_u − W μ_z − b‖²

(all statistics of split s; the cross terms vanish because centred sums are zero).
Moments are additive, so shards can be reduced in any order or in parallel jobs.

Beyond the fixed-α fits:

* :func:`fit_targets` / :func:`select_alpha` — every target of one basis from one Cholesky
  per α of a grid, the α with the best val R² kept; ``fit_pairwise`` / ``fit_leave_one_out``
  take such a grid in place of one α. Leave-one-out fits are blocks of one inverse of the
  regularised joint scatter (:func:`fit_leave_one_out`).
* :class:`BlockMoments` / :func:`accumulate_block_moments` / :func:`bootstrap_r2` — moments
  per block of sequences; a bootstrap replicate is a multinomial-weighted sum of blocks.
* :func:`greedy_selection` — forward selection of basis models on val R².
"""

from __future__ import annotations

import json
import numbers
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np

# Imported at load time, not lazily: threadpoolctl (blas_threads) pins only the BLAS
# libraries already loaded, and scipy brings its own OpenBLAS.
from scipy.linalg import cho_factor, cho_solve
from scipy.linalg.blas import dsyrk, dtrmm, dtrsm
from scipy.linalg.lapack import dpotrf, dpotri

from . import shards
from .atomic import atomic_path

SPLITS = ("train", "val", "test")


class LMDError(ValueError):
    """Embeddings or settings that cannot give a well-posed fit."""


class AlphaGridEdgeWarning(UserWarning):
    """The val-selected α is the largest (or smallest non-zero) of its grid: the optimum may lie outside."""


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


def _syrk_lower(cross: np.ndarray, rows: np.ndarray) -> None:
    """cross += rowsᵀ rows on the lower triangle of the C-ordered square ``cross``, in place: one
    BLAS symmetric rank-k update (dsyrk), half the arithmetic of the full product. The upper
    triangle is left as it was (:func:`_symmetrise_from_lower` completes it)."""
    # cross.T is the same memory in Fortran order, whose upper triangle is cross's lower one;
    # rows.T of C-ordered rows is Fortran-ordered: neither is copied.
    out = dsyrk(1.0, rows.T, beta=1.0, c=cross.T, trans=0, lower=0, overwrite_c=1)
    if not np.shares_memory(out, cross):
        raise LMDError("internal: dsyrk did not update the cross-product in place")


def _quadratic_forms(scatter: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """r S rᵀ for every row r of ``rows`` (k × w, C order), S = ``scatter`` symmetric (w × w).

    With S = T + Tᵀ − D (T its lower triangle with the diagonal, D the diagonal),
    r S rᵀ = 2 r T rᵀ − Σ_j S_jj r_j²: one triangular product (dtrmm), half the arithmetic of
    ``rows @ S``. This is the held-out scoring of every fit, the largest cost after the moments."""
    # rows.T is rows' own memory in Fortran order (w × k), and scatter.T is S itself (symmetric)
    # in Fortran order, so BLAS reads both without a transposing copy.
    lower_times_rows = dtrmm(1.0, scatter.T, np.ascontiguousarray(rows).T, side=0, lower=1)  # T rᵀ, w × k
    return (2.0 * np.einsum("ij,ij->i", lower_times_rows.T, rows)
            - np.einsum("ij,ij,j->i", rows, rows, np.diagonal(scatter)))


def _symmetrise_from_lower(a: np.ndarray, block: int = 512) -> None:
    """Copy the lower triangle of the C-ordered square ``a`` onto its upper one, in place, a
    band of rows at a time (no width² temporaries)."""
    width = a.shape[0]
    for lo in range(0, width, block):
        hi = min(lo + block, width)
        a[lo:hi, hi:] = a[hi:, lo:hi].T
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
        _syrk_lower(self.cross[split], x)

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


@dataclass
class ShardGroup:
    """The same shard of every source, aligned: per row its split and seq_id, and per source its
    float32 block of the row's vectors (rows × dim_m), in the sources' order."""

    split: np.ndarray
    seq_id: np.ndarray
    blocks: list[np.ndarray]

    @property
    def width(self) -> int:
        return sum(b.shape[1] for b in self.blocks)

    def gather(self, index: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Rows ``index`` of the float64 concatenation [x_1 | … | x_M] written into ``out``
        (len(index) × width), block by block: one gather-and-convert pass per block, with no
        joint temporary (allocating and then gathering from one cost more than the copy)."""
        start = 0
        for block in self.blocks:
            stop = start + block.shape[1]
            out[:, start:stop] = block[index]
            start = stop
        return out

    def joint(self) -> np.ndarray:
        """The float64 concatenation [x_1 | … | x_M] of all rows."""
        return self.gather(slice(None), np.empty((len(self.split), self.width)))


@dataclass
class AlignedShards:
    """Rows of several embedding columns read shard by shard and aligned on their row key.

    ``groups`` yields one :class:`ShardGroup` per shard; ``rows`` yields the same as
    (split, x, seq_id), x the float64 concatenation [x_1 | … | x_M] of the named columns (only
    one of the two can be consumed: they read the same files). Sequence rows must match
    exactly; word rows (seq_id, word_idx) are intersected, so a word some model truncated away
    is dropped for all. ``info`` (granularity, and for words: words, words_kept,
    words_dropped) is complete once the shards are exhausted."""

    names: list[str]
    dims: list[int]
    n_shards: int
    groups: Iterator[ShardGroup]
    info: dict
    sequence_starts: list[int]  # sequences before each shard (n_shards + 1 entries)

    @property
    def rows(self) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return ((g.split, g.joint(), g.seq_id) for g in self.groups)


def aligned_shards(
    sources: Mapping[str, "str | Path | tuple[str | Path, str]"], shard_range: tuple[int, int] | None = None
) -> AlignedShards:
    """Align the embeddings of ``sources``: name → a model's embedding folder (its ``embedding``
    column) or (folder, column) (e.g. a ``hidden_K`` column of ``embed.layers``); only shards
    lo..hi−1 with ``shard_range=(lo, hi)``."""
    parsed = {name: (Path(v[0]), v[1]) if isinstance(v, tuple) else (Path(v), "embedding")
              for name, v in sources.items()}
    names = list(parsed)
    folders = list(dict.fromkeys(folder for folder, _ in parsed.values()))
    manifests = {f: shards.read_manifest(f) for f in folders}
    columns = {f: list(dict.fromkeys(c for g, c in parsed.values() if g == f)) for f in folders}
    granularity = {f: m.get("granularity", "sequence") for f, m in manifests.items()}
    first = folders[0]
    for f in folders[1:]:
        if granularity[f] != granularity[first]:
            raise LMDError(f"{first} holds {granularity[first]} rows but {f} holds {granularity[f]} rows; "
                           "embed every model with the same embed.granularity")
    words = granularity[first] == "word"
    layout = {f: [e.get("sequences", e["rows"]) if words else e["rows"] for e in m["shards"]]
              for f, m in manifests.items()}
    for f in folders[1:]:
        if layout[f] != layout[first]:
            a, b = manifests[first]["model"], manifests[f]["model"]
            unit = "sequences" if words else "rows"
            if len(layout[f]) != len(layout[first]):
                what = f"{len(layout[first])} vs {len(layout[f])} shards"
            else:  # same count: name the first shard whose size differs
                k = next(i for i, (x, y) in enumerate(zip(layout[first], layout[f])) if x != y)
                what = f"shard {k} holds {layout[first][k]} {unit} for {a!r} but {layout[f][k]} for {b!r}"
            raise LMDError(
                f"models {a!r} and {b!r} were embedded with different shard layouts ({what}); embed both "
                "from the same sequences.parquet with the same embed.shard_rows"
            )
    dims = [int(manifests[folder]["dim"]) for folder, _ in parsed.values()]
    n_shards = len(layout[first])
    lo, hi = shard_range or (0, n_shards)
    if not 0 <= lo < hi <= n_shards:
        raise LMDError(f"shard range {lo}..{hi - 1} is outside the {n_shards} shards of the embeddings")
    sequences = [e.get("sequences", e["rows"]) for e in manifests[first]["shards"]]
    info: dict = {"granularity": granularity[first]}
    if words:
        info.update(words=int(manifests[first].get("words", 0)), words_kept=0)

    def groups():
        readers = [shards.iter_shards(f, columns=columns[f], indices=range(lo, hi)) for f in folders]
        for group in zip(*readers):
            parts = dict(zip(folders, group))
            base = parts[first]
            if words:
                keys = {f: (p.seq_id << 32) + p.word_idx.astype(np.int64) for f, p in parts.items()}
                for f, k in keys.items():
                    if np.any(np.diff(k) <= 0):
                        raise LMDError(f"{f}: word rows are not sorted by (seq_id, word_idx); re-embed it")
                common = keys[first]
                for f in folders[1:]:
                    common = np.intersect1d(common, keys[f], assume_unique=True)
                select = {f: np.searchsorted(k, common) for f, k in keys.items()}
                info["words_kept"] += len(common)
                info["words_dropped"] = info["words"] - info["words_kept"]
            else:
                for f, p in parts.items():
                    if not np.array_equal(p.seq_id, base.seq_id):
                        raise LMDError(
                            f"models {manifests[first]['model']!r} and {manifests[f]['model']!r} have "
                            "different seq_id sets in the same shard; re-embed both from the same sequences.parquet"
                        )
                select = {f: slice(None) for f in folders}
            yield ShardGroup(base.split[select[first]], base.seq_id[select[first]],
                             [parts[f].columns[c][select[f]] for f, c in parsed.values()])

    return AlignedShards(names, dims, n_shards, groups(), info, [0, *np.cumsum(sequences).tolist()])


def accumulate_moments(folders: Mapping[str, str | Path], progress: bool = False, flush_rows: int = 2048,
                       shard_range: tuple[int, int] | None = None, group_shards: int | None = None) -> Moments:
    """One streaming pass over the shards of all models, aligned on seq_id, into :class:`Moments`:
    per split, one in-place rank-k update (dsyrk) of the cross-product per ``flush_rows`` rows.

    ``shard_range=(lo, hi)`` reads shards lo..hi−1 only, one job of a scale-out without
    bootstrap blocks (``info["shard_range"]``, ``info["n_shards"]``); :func:`reduce_moments`
    adds the jobs' moments. ``group_shards=k`` makes one pass compute exactly that: the moments
    of shards [0, k), [k, 2k), … each on its own, added in order, so one pass and a scale-out
    with ``lmd.shards_per_job: k`` agree to the bit (rows are flushed at group boundaries, and
    the sums are added in the same order). It holds two sets of moments instead of one."""
    from tqdm.auto import tqdm

    if group_shards is not None:
        if shard_range is not None:
            raise LMDError("give shard_range (one part) or group_shards (all parts in one pass), not both")
        if group_shards < 1:
            raise LMDError(f"group_shards must be >= 1; got {group_shards}")
        n_shards = aligned_shards(folders).n_shards
        groups = [(lo, min(lo + group_shards, n_shards)) for lo in range(0, n_shards, group_shards)]
        return reduce_moments(accumulate_moments(folders, flush_rows=flush_rows, shard_range=group)
                              for group in tqdm(groups, desc=f"moments ({group_shards} shards a group)",
                                                unit="group", disable=not progress))

    aligned = aligned_shards(folders, shard_range)
    moments = Moments(aligned.names, aligned.dims)
    # Rows are gathered per split until there are ``flush_rows`` of them: a rank-k update reads
    # and writes the whole width² triangle, so a few hundred rows per update would cost as
    # much in memory traffic as in arithmetic. The buffers live for the whole pass: a fresh
    # width-wide array per shard costs its page faults again every time.
    buffers = {s: np.empty((flush_rows, moments.width)) for s in SPLITS}
    filled = dict.fromkeys(SPLITS, 0)

    def flush(s):
        if filled[s]:
            moments._add(s, buffers[s][:filled[s]])
            filled[s] = 0

    for group in tqdm(aligned.groups, total=aligned.n_shards, desc="moments", unit="shard", disable=not progress):
        for s in SPLITS:
            index = np.flatnonzero(group.split == s)
            # Top the buffer up to exactly flush_rows before each update and carry the rest of
            # the shard's rows over: flushing a shard's ~0.8 × flush_rows train rows on their own
            # made a fifth more updates, each reading and writing the whole width² triangle.
            while len(index):
                part, index = index[:flush_rows - filled[s]], index[flush_rows - filled[s]:]
                group.gather(part, buffers[s][filled[s]:filled[s] + len(part)])
                filled[s] += len(part)
                if filled[s] == flush_rows:
                    flush(s)
    for s in SPLITS:
        flush(s)
        _symmetrise_from_lower(moments.cross[s])
    moments.info = dict(aligned.info)
    if shard_range is not None:
        moments.info.update(shard_range=[int(v) for v in shard_range], n_shards=int(aligned.n_shards))
    return moments


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


@dataclass(frozen=True)
class RidgeFit:
    """u ≈ W z + b, fitted on the train split."""

    basis: tuple[str, ...]
    target: str
    alpha: float
    weight: np.ndarray  # (target dim, basis dim)
    bias: np.ndarray  # (target dim,)


def _dims_of(moments: Moments, names: Sequence[str]) -> list[int]:
    return [moments.dims[moments.names.index(n)] for n in names]


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


def _ridge_solve(s_zz: np.ndarray, penalty: np.ndarray, rhs: np.ndarray, what: str,
                 raw_diagonal: np.ndarray) -> np.ndarray:
    """(S_zz + diag λ)⁻¹ rhs by Cholesky (the matrix is symmetric positive definite when the fit is
    well posed; at α = 0, :func:`_check_pivots` with ``raw_diagonal``, the basis columns' Σx²).
    ``s_zz`` is a copy owned by the caller; it is overwritten."""
    s_zz[np.diag_indices_from(s_zz)] += penalty
    try:
        factor = cho_factor(s_zz, lower=False, overwrite_a=True, check_finite=False)
    except np.linalg.LinAlgError as exc:
        raise LMDError(f"{what}: the basis covariance is singular; set lmd.alpha > 0") from exc
    if not np.any(penalty):
        _check_pivots(np.diagonal(factor[0]), raw_diagonal, what)
    return cho_solve(factor, rhs, check_finite=False)


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
                train_penalty: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """R² on ``split`` of several targets fitted on one basis at once: ``weight_t`` (p × Q) holds
    each target's Wᵀ side by side in ``targets`` order, ``bias`` (Q,); R² of the module doc,
    pooled per target block (:func:`r_squared` is its one-target case).

    The scatter S = C − n μμᵀ is never formed: with w a row of W and a = w·μ_z,
    Σ_j w_j S_uj = w·C_uz − n μ_u a and w S_zz wᵀ = w C_zz wᵀ − n a².

    On train, ``train_penalty`` = (α per target column (Q,), λ of the basis columns at α = 1
    (p,)) skips the p² × Q product: the fit solves W (S_zz + diag λ) = S_uz, so
    tr(W S_zz Wᵀ) = tr(W S_zu) − Σ λ_i W_·i² and SSE = tr S_uu − tr(W S_zu) − Σ λ_i W_·i²."""
    cols = moments.columns(targets)
    starts = np.cumsum([0, *_dims_of(moments, targets)])[:-1]
    n, mean, cross = moments.count(split), moments.mean(split), moments.cross[split]
    diagonal = moments.scatter_diagonal(split)
    sst = _sst(moments, split, targets, cols, starts, diagonal)
    # Row-wise (Q × p) in C order throughout: a LAPACK solve returns Wᵀ in Fortran order, so its
    # transpose W is C-ordered for free, and C_uz is a copy of whole model blocks of C.
    # Elementwise products across mismatched layouts run several times slower.
    weight = np.ascontiguousarray(weight_t.T)
    weight_mean = weight @ mean[basis_cols]
    fitted = np.einsum("ij,ij->i", weight, _sub(cross, cols, basis_cols)) - n * mean[cols] * weight_mean
    if train_penalty is not None:
        if split != "train":
            raise LMDError("internal: the penalty shortcut holds on the train split only")
        column_alpha, unit_penalty = train_penalty
        per_column = diagonal[cols] - fitted - column_alpha * (weight**2 @ unit_penalty)
    else:
        quadratic = _quadratic_forms(_sub(cross, basis_cols, basis_cols), weight) - n * weight_mean**2
        offset = mean[cols] - weight_mean - bias
        per_column = diagonal[cols] - 2.0 * fitted + quadratic + n * offset**2
    return 1.0 - np.add.reduceat(per_column, starts) / sst


def fit_targets(moments: Moments, basis: Sequence[str], targets: Sequence[str], alpha,
                warn_edge: bool = True) -> dict[str, tuple[RidgeFit, list[dict]]]:
    """Ridge fits of every target on one shared ``basis``: one Cholesky per α for all targets
    (Wᵀ = (S_zz + diag λ)⁻¹ [S_zu₁ … S_zu_k]); with a grid, each target keeps the α of its
    highest val R² (first in grid order on ties). Returns {target: (fit, table)}, the table
    ``[{"alpha": α, "val_r2": R²}, …]`` in grid order, R² NaN where α is ill-posed (α = 0 on a
    singular basis or one wider than the train rows). With ``warn_edge``, a choice at the grid's
    edge warns (:func:`warn_if_alpha_at_grid_edge`)."""
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
    best: dict[int, tuple[float, float, np.ndarray, np.ndarray]] = {}  # target → (val R², α, W, b)
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
        val[a] = _targets_r2(moments, "val", zi, targets, weight_t, bias)
        for k in range(len(targets)):
            if k not in best or val[a, k] > best[k][0]:
                block = slice(starts[k], starts[k + 1])
                best[k] = (val[a, k], alpha_a, weight_t[:, block].T.copy(), bias[block].copy())
    out = {}
    for k, target in enumerate(targets):
        if k not in best:
            raise LMDError(f"fit of {target!r} on {list(basis)}: no α of {list(grid)} gives a well-posed "
                           "fit; include an α > 0")
        _, alpha_k, weight, bias = best[k]
        table = [{"alpha": g, "val_r2": float(v)} for g, v in zip(grid, val[:, k])]
        out[target] = (RidgeFit(tuple(basis), target, alpha_k, weight, bias), table)
    if warn_edge and not strict:
        warn_if_alpha_at_grid_edge(grid, {t: fit.alpha for t, (fit, _) in out.items()},
                                   f"fit on {list(basis)}")
    return out


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
    share its Cholesky factor (:func:`fit_targets`) and are scored together."""
    _alpha_grid(alpha)
    _check_two_models(moments.names, "pairwise fits")
    _check_moments_basis(moments, moments.names, np.arange(moments.width))  # every model is a basis
    scores = {}
    for basis in moments.names:
        targets = [n for n in moments.names if n != basis]
        fits = fit_targets(moments, [basis], targets, alpha, warn_edge=False)  # warned below, once
        zi = moments.columns([basis])
        weight_t = np.concatenate([fits[t][0].weight for t in targets]).T  # Fortran order, as a solve's
        bias = np.concatenate([fits[t][0].bias for t in targets])
        unit = ridge_penalty(moments.scatter_diagonal("train")[zi], [len(zi)], 1.0)
        alphas = np.repeat([fits[t][0].alpha for t in targets], _dims_of(moments, targets))
        r2 = {"train": _targets_r2(moments, "train", zi, targets, weight_t, bias, (alphas, unit)),
              "val": [next(row["val_r2"] for row in fits[t][1] if row["alpha"] == fits[t][0].alpha) for t in targets],
              "test": _targets_r2(moments, "test", zi, targets, weight_t, bias)}
        for split in SPLITS:
            for target, value in zip(targets, r2[split]):
                scores[basis, target, split] = (float(value), fits[target][0].alpha)
    warn_if_alpha_at_grid_edge(alpha, {f"{b}→{t}": a for (b, t, s), (_, a) in scores.items() if s == "val"},
                               "pairwise fits")
    return [{"basis": basis, "target": target, "split": split, "r2": scores[basis, target, split][0],
             "alpha": scores[basis, target, split][1]}
            for target in moments.names for basis in moments.names if basis != target for split in SPLITS]


def _ridge_inverse(moments: Moments, penalty: np.ndarray, band: int = 64) -> np.ndarray:
    """(S + diag λ)⁻¹ of the train scatter S = C − n μμᵀ, as a full symmetric C-ordered matrix:
    S + diag λ written once, a band of rows at a time, into the array that one Cholesky (dpotrf)
    and its inverse (dpotri) then overwrite. Raises LMDError if it is not positive definite or,
    at α = 0, singular to float32 precision (:func:`_check_pivots`)."""
    cross = moments.cross["train"]
    root_n_mean = moments.root_n_mean("train")
    a = np.empty_like(cross)
    for lo in range(0, len(a), band):  # −n μμᵀ band by band: no width² temporary
        np.multiply.outer(root_n_mean[lo:lo + band], -root_n_mean, out=a[lo:lo + band])
        a[lo:lo + band] += cross[lo:lo + band]
    a[np.diag_indices_from(a)] += penalty
    # a is C-ordered and symmetric, so its transpose is the same matrix in Fortran order: LAPACK
    # works on it in place, and the triangle it fills is the lower one of ``a``.
    factor, info = dpotrf(a.T, lower=0, clean=0, overwrite_a=1)
    if info == 0 and not np.any(penalty):
        _check_pivots(np.diagonal(factor), np.diagonal(cross), "the joint covariance",
                      [f"{name}[{k}]" for name, dim in zip(moments.names, moments.dims) for k in range(dim)])
    if info == 0:
        inverse, info = dpotri(factor, lower=0, overwrite_c=1)
    if info != 0:
        raise LMDError("the joint covariance plus ridge is not positive definite")
    out = inverse.T
    _symmetrise_from_lower(out)
    return out


def _singular_models(moments: Moments) -> set[str]:
    """Models whose own train scatter is singular to float32 precision (:func:`_check_pivots`).
    At α = 0 every basis holding one is too: a column that the rest of its model explains is
    explained at least as well by a larger basis. Costs one small Cholesky per model."""
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
    the symmetric P = ``inverse``.

    Solved as its transpose R = P_·m L⁻ᵀ L⁻¹ (P_mm = L Lᵀ, two triangular solves from the right):
    C-ordered Rᵀ is Fortran-ordered R, so the result needs no transposing copy, and the scores'
    products read it in the order they want."""
    factor, info = dpotrf(inverse[block, block], lower=1, clean=1)
    if info != 0:
        raise LMDError("internal: a diagonal block of the joint inverse is not positive definite")
    residual_t = inverse[block].copy()  # C-ordered P_m·; its transpose is P_·m in Fortran order
    for transposed in (1, 0):  # · L⁻ᵀ, then · L⁻¹
        out = dtrsm(1.0, factor, residual_t.T, side=1, lower=1, trans_a=transposed, overwrite_b=1)
        if not np.shares_memory(out, residual_t):
            raise LMDError("internal: dtrsm did not solve in place")
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
    SSE = Σ (Rᵀ S)∘Rᵀ + n ‖Rᵀ(μ − μ_train)‖²; on train, where W(S_rr + diag λ_r) = S_mr,
    SSE = Σ Rᵀ∘S_m· − Σ_i λ_i ‖W_·i‖² needs no product with S. Cost per α: one Cholesky
    inverse of the joint width plus, per target and held-out split, one triangular
    width² × q product (:func:`_quadratic_forms`), instead of a fresh Cholesky of the basis
    width per target."""
    grid = _alpha_grid(alpha)
    strict = grid is None
    grid = grid or (float(alpha),)
    _check_two_models(moments.names, "leave-one-out fits")
    names, width = moments.names, moments.width
    n = moments.count("train")
    _check_moments_basis(moments, names, np.arange(width))  # every model is in some basis
    bounds = np.cumsum([0, *moments.dims])
    diagonal = moments.scatter_diagonal("train")
    best: dict[int, tuple[float, float, np.ndarray, np.ndarray]] = {}  # target → (val R², α, Rᵀ, λ)
    for alpha_a in grid:
        penalty = ridge_penalty(diagonal, moments.dims, alpha_a)
        inverse = None  # without it (α = 0 and a singular joint scatter): one solve per target
        if alpha_a > 0 or n > width:
            try:
                inverse = _ridge_inverse(moments, penalty)
            except LMDError:
                pass
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
                if singular & set(basis):
                    if strict:
                        raise LMDError(f"{what}: least squares is ill-posed: the train scatter of "
                                       f"{sorted(singular & set(basis))} alone is singular to float32 "
                                       "precision; set lmd.alpha > 0")
                    continue
                try:
                    fit = fit_ridge(moments, basis, target, alpha_a)
                except LMDError:
                    if strict:
                        raise
                    continue
                residual_t = np.zeros((block.stop - block.start, width))
                residual_t[:, moments.columns(basis)] = -fit.weight
                residual_t[:, block] = np.eye(block.stop - block.start)
            val = _residual_r2(moments, "val", target, block, residual_t)
            if m not in best or val > best[m][0]:
                best[m] = (val, alpha_a, residual_t, penalty)
        del inverse
    rows = []
    for m, target in enumerate(names):
        if m not in best:
            raise LMDError(f"leave-one-out fit of {target!r}: no α of {list(grid)} gives a well-posed fit; "
                           "include an α > 0")
        val, alpha_m, residual_t, penalty = best[m]
        block = slice(bounds[m], bounds[m + 1])
        basis_penalty = penalty.copy()
        basis_penalty[block] = 0.0
        r2 = {"train": _residual_r2(moments, "train", target, block, residual_t, basis_penalty), "val": val,
              "test": _residual_r2(moments, "test", target, block, residual_t)}
        rows.extend({"target": target, "split": split, "r2": float(r2[split]), "alpha": alpha_m} for split in SPLITS)
    if not strict:
        warn_if_alpha_at_grid_edge(grid, {names[m]: best[m][1] for m in best}, "leave-one-out fits")
    return rows


def _residual_r2(moments: Moments, split: str, target: str, block: slice, residual_t: np.ndarray,
                 train_penalty: np.ndarray | None = None) -> float:
    """R² on ``split`` of the fit whose residual is e = Rᵀ(x − μ_train) (Rᵀ: q × width). On train,
    ``train_penalty`` (width,: the basis columns' λ, 0 on the target's) gives the shortcut of
    :func:`fit_leave_one_out`'s docstring instead of the width² × q product. Held out, from C
    itself (S = C − n μμᵀ is never formed): Σ_rows r S rᵀ = Σ r C rᵀ − n ‖Rᵀμ‖²."""
    n, mean = moments.count(split), moments.mean(split)
    target_cols = np.arange(block.start, block.stop)
    sst = _sst(moments, split, [target], target_cols, np.array([0]))[0]
    if train_penalty is not None:
        if split != "train":
            raise LMDError("internal: the penalty shortcut holds on the train split only")
        scatter_rows = moments.scatter_block("train", target_cols, np.arange(moments.width))
        sse = np.sum(residual_t * scatter_rows) - np.sum(train_penalty * residual_t**2)
    else:
        residual_mean = residual_t @ mean
        offset = residual_t @ (mean - moments.mean("train"))
        sse = (np.sum(_quadratic_forms(moments.cross[split], residual_t)) - n * residual_mean @ residual_mean
               + n * offset @ offset)
    return float(1.0 - sse / sst)


def summary_metrics(pairwise: list[dict], loo: list[dict]) -> dict:
    """The DVC metrics: mean and per-model leave-one-out test R², mean pairwise test R²."""
    loo_test = {r["target"]: r["r2"] for r in loo if r["split"] == "test"}
    pair_test = [r["r2"] for r in pairwise if r["split"] == "test"]
    return {
        "loo_test_r2_mean": float(np.mean(list(loo_test.values()))),
        "loo_test_r2": dict(sorted(loo_test.items())),
        "pairwise_test_r2_mean": float(np.mean(pair_test)) if pair_test else None,
    }



# ---------------------------------------------------------------------------------------
# Block moments and the block bootstrap
# ---------------------------------------------------------------------------------------


@dataclass
class BlockMoments:
    """Moments of B disjoint blocks of sequences, stacked: the moments of any weighted union
    of blocks are Σ_b w_b · (n_b, s_b, C_b), so a bootstrap replicate is one weighted sum.

    Arrays (split axis in :data:`SPLITS` order): ``n`` (B, 3) int64, ``sums`` (B, 3, width),
    ``cross`` (B, 3, width, width) float64. Memory is 24 · B · width² bytes for ``cross``
    (e.g. 7 models × 768 dims, width 5376, 64 blocks: 44 GB — too much; 3 models × 384,
    width 1152, 64 blocks: 2 GB): choose ``rows_per_block`` so that B is a few dozen, or
    run the bootstrap on moments of the columns you need (:meth:`select`).
    """

    names: list[str]
    dims: list[int]
    n: np.ndarray
    sums: np.ndarray
    cross: np.ndarray
    info: dict = field(default_factory=dict)

    @classmethod
    def zeros(cls, names: Sequence[str], dims: Sequence[int], n_blocks: int) -> "BlockMoments":
        w, k = sum(dims), len(SPLITS)
        return cls(list(names), [int(d) for d in dims], np.zeros((n_blocks, k), np.int64),
                   np.zeros((n_blocks, k, w)), np.zeros((n_blocks, k, w, w)))

    @classmethod
    def from_moments(cls, blocks: Sequence[Moments]) -> "BlockMoments":
        if not blocks:
            raise LMDError("no blocks")
        first = blocks[0]
        out = cls.zeros(first.names, first.dims, len(blocks))
        for b, m in enumerate(blocks):
            if m.names != first.names or m.dims != first.dims:
                raise LMDError("cannot stack moments of different model sets")
            for k, s in enumerate(SPLITS):
                out.n[b, k], out.sums[b, k], out.cross[b, k] = m.n[s], m.sums[s], m.cross[s]
        return out

    @property
    def width(self) -> int:
        return sum(self.dims)

    def __len__(self) -> int:
        return self.n.shape[0]

    def __getitem__(self, b: int) -> Moments:
        return self.weighted(np.eye(len(self))[b])

    def columns(self, names: Iterable[str]) -> np.ndarray:
        return _columns(self.names, self.dims, names)

    def select(self, names: Sequence[str]) -> "BlockMoments":
        """The blocks restricted to the named models (in the order given)."""
        cols = self.columns(names)
        return BlockMoments(list(names), [self.dims[self.names.index(n)] for n in names], self.n.copy(),
                            self.sums[:, :, cols], self.cross[:, :, cols[:, None], cols[None, :]])

    def weighted(self, weights: np.ndarray) -> Moments:
        """Moments of the union of blocks with multiplicities ``weights`` (B,)."""
        w = np.asarray(weights, dtype=np.float64)
        m = Moments(list(self.names), list(self.dims))
        for k, s in enumerate(SPLITS):
            m.n[s] = int(round(float(w @ self.n[:, k])))
            m.sums[s] = np.tensordot(w, self.sums[:, k], axes=1)
            m.cross[s] = np.tensordot(w, self.cross[:, k], axes=1)
        return m

    def total(self) -> Moments:
        """Moments of all blocks together (block by block, in order, as the streaming pass)."""
        m = Moments(list(self.names), list(self.dims), info=dict(self.info))
        for b in range(len(self)):
            for k, s in enumerate(SPLITS):
                m.n[s] += int(self.n[b, k])
                m.sums[s] += self.sums[b, k]
                m.cross[s] += self.cross[b, k]
        return m

    def save(self, path: str | Path) -> None:
        from safetensors.numpy import save_file

        tensors = {"n": self.n, "sums": self.sums, "cross": self.cross}
        meta = {"layout": json.dumps({"names": self.names, "dims": self.dims, "splits": list(SPLITS),
                                      "info": self.info}, sort_keys=True)}
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> "BlockMoments":
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as fh:
            layout = json.loads(fh.metadata()["layout"])
            if layout.get("splits") != list(SPLITS):
                raise LMDError(f"{path}: block moments of splits {layout.get('splits')}, expected {list(SPLITS)}")
            return cls(layout["names"], layout["dims"], fh.get_tensor("n"), fh.get_tensor("sums"),
                       fh.get_tensor("cross"), layout.get("info", {}))


def available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo (Linux), else None."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_block_memory(n_blocks: int, width: int, available: int | None = None) -> None:
    """Refuse block moments that cannot fit in memory, before allocating them: they take
    8 · B · 3 · width² bytes (B blocks, three splits, one float64 width² cross-product each),
    which for wide models dwarfs everything else (12 models of 768: 76 GiB at B = 40).
    ``available`` defaults to the machine's MemAvailable."""
    needed = 8 * n_blocks * len(SPLITS) * width * width
    available = available_memory_bytes() if available is None else available
    if available is not None and needed > 0.8 * available:
        gib = 2.0**30
        raise LMDError(
            f"the bootstrap's block moments need {needed / gib:.1f} GiB ({n_blocks} blocks × {len(SPLITS)} splits × "
            f"{width}² float64 for a joint width of {width}) but {available / gib:.1f} GiB of memory is available: "
            "lower lmd.bootstrap_blocks (memory is linear in it), or set lmd.bootstrap: 0 to fit without "
            f"intervals (one {width}² matrix per split)"
        )


def accumulate_block_moments(
    folders: Mapping[str, str | Path],
    rows_per_block: int | None = None,
    progress: bool = False,
    shard_range: tuple[int, int] | None = None,
) -> BlockMoments:
    """One streaming pass like :func:`accumulate_moments`, keeping one block of moments per
    shard (``rows_per_block=None``) or per run of ``rows_per_block`` consecutive sequences in
    seq_id order (blocks may span shards). ``.total()`` gives the pooled :class:`Moments`.

    Sequences follow document order, so contiguous blocks keep most chunks of a document
    together and the block bootstrap respects that dependence. Memory: see :class:`BlockMoments`.

    ``shard_range=(lo, hi)`` reads shards lo..hi−1 only and returns just the blocks they touch
    (``info["block_offset"]``, ``info["blocks_total"]``, and ``info["shard_range"]`` = [lo, hi],
    ``info["n_shards"]`` for the reduce to check coverage): one job of a scale-out, combined by
    :func:`reduce_block_moments` into exactly — to the bit — what one pass gives, because each
    block sums the same per-shard products in the same order either way.
    """
    from tqdm.auto import tqdm

    if rows_per_block is not None and rows_per_block < 1:
        raise LMDError(f"rows_per_block must be >= 1; got {rows_per_block}")
    aligned = aligned_shards(folders, shard_range)
    starts = aligned.sequence_starts
    lo, hi = shard_range or (0, aligned.n_shards)
    if rows_per_block is None:
        first, last, blocks_total = lo, hi - 1, aligned.n_shards
    else:
        first, last = starts[lo] // rows_per_block, (starts[hi] - 1) // rows_per_block
        blocks_total = -(-starts[-1] // rows_per_block)
    check_block_memory(last - first + 1, sum(aligned.dims))
    out = BlockMoments.zeros(aligned.names, aligned.dims, last - first + 1)
    buffer = np.empty((0, out.width))  # reused across shards (see accumulate_moments)
    for index, group in enumerate(
        tqdm(aligned.groups, total=hi - lo, desc="block moments", unit="shard", disable=not progress), start=lo
    ):
        # blocks are runs of sequences (a word row goes with its sequence): the row's sequence
        # ordinal = sequences in earlier shards + its sequence's rank in this shard
        rank = np.unique(group.seq_id, return_inverse=True)[1].reshape(-1)
        block_of_row = (np.full(len(rank), index) if rows_per_block is None
                        else (starts[index] + rank) // rows_per_block)
        if len(buffer) < len(rank):
            buffer = np.empty((len(rank), out.width))
        for b in np.unique(block_of_row):
            in_block = block_of_row == b
            for k, s in enumerate(SPLITS):
                chosen = np.flatnonzero(in_block & (group.split == s))
                rows_bs = group.gather(chosen, buffer[:len(chosen)])
                if len(rows_bs):
                    out.n[b - first, k] += len(rows_bs)
                    out.sums[b - first, k] += rows_bs.sum(axis=0)
                    _syrk_lower(out.cross[b - first, k], rows_bs)
    for cross in out.cross.reshape(-1, out.width, out.width):
        _symmetrise_from_lower(cross)
    out.info = dict(aligned.info)
    if shard_range is not None:
        out.info.update(block_offset=int(first), blocks_total=int(blocks_total), shard_range=[int(lo), int(hi)],
                        n_shards=int(aligned.n_shards))
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


def reduce_block_moments(parts: Iterable[BlockMoments]) -> BlockMoments:
    """Combine the partial block moments of :func:`accumulate_block_moments` jobs over disjoint
    shard ranges (given in shard order) into the block moments of one pass over all shards.
    The ranges must cover every shard exactly once (:class:`_PartCoverage`). ``parts`` may be a
    generator: the output and one part are held at a time."""
    coverage, out, first, kept = _PartCoverage(), None, None, 0
    for part in parts:
        if first is None:
            first = part
            total = first.info.get("blocks_total")
            if total is None:
                raise LMDError("these block moments are not a part of a scale-out (no blocks_total); "
                               "use them as they are")
        if part.names != first.names or part.dims != first.dims or part.info.get("blocks_total") != total:
            raise LMDError("cannot reduce partial moments of different model sets or block layouts; rerun every part")
        coverage.add(part)
        if out is None:
            check_block_memory(int(total), first.width)
            out = BlockMoments.zeros(first.names, first.dims, int(total))
        at = slice(part.info["block_offset"], part.info["block_offset"] + len(part))
        out.n[at] += part.n
        out.sums[at] += part.sums
        out.cross[at] += part.cross
        kept += part.info.get("words_kept", 0)
    if out is None:
        raise LMDError("no partial moments to reduce")
    coverage.finish()
    info = {k: v for k, v in first.info.items() if k not in _PART_KEYS}
    if "words" in info:
        info.update(words_kept=kept, words_dropped=info["words"] - kept)
    out.info = info
    return out


# Bootstrap replicates are processed in chunks whose (chunk, w, w) float64 scatter is at most this
# many bytes; two such arrays are alive at once (see bootstrap_r2_samples). The chunk size does not
# change any replicate's numbers.
_BOOTSTRAP_ARRAY_BYTES = 128e6


def bootstrap_weights(n_blocks: int, n_boot: int, seed: int = 0) -> np.ndarray:
    """(n_boot, n_blocks) int multiplicities: each row draws n_blocks blocks with replacement."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_blocks, np.full(n_blocks, 1.0 / n_blocks), size=n_boot)


def bootstrap_r2_samples(
    blocks: "BlockMoments | Sequence[Moments]",
    basis: Sequence[str],
    target: str,
    alpha: float,
    n_boot: int = 200,
    seed: int = 0,
    split: "str | Sequence[str]" = "test",
) -> "np.ndarray | dict[str, np.ndarray]":
    """(n_boot,) bootstrap replicates of the ``split`` R² of the ridge fit of ``target`` on ``basis``
    (or, for a list of splits, {split: replicates}, sharing each replicate's train refit).

    Replicate r resamples blocks with replacement (multiplicities w_r from
    :func:`bootstrap_weights`, the same for every split, since a block is a unit of sequences),
    refits on the train moments Σ_b w_rb M_b^train and scores on Σ_b w_rb M_b^split — exactly
    the fit and R² of :func:`fit_ridge` / :func:`r_squared` on the resampled sequences.
    A replicate with an empty split or a singular fit is an error (use larger blocks or α > 0);
    at α = 0 so is one with no more distinct train rows than basis columns.

    Only the blocks a fit reads are gathered and weighted: C_zz, C_zu and the diagonal of C_uu
    (tr S_uu), not the whole (p + q)² cross-product.

    Memory, for w = p + q the basis + target width, B blocks and R = 16e6 / w² replicates per
    chunk (so that one (R, w, w) float64 array would be ≤ 128 MB, ``_BOOTSTRAP_ARRAY_BYTES``):
    the gathered blocks, B · (p² + pq + q) · 8 bytes per split used (train included), plus per
    chunk the train and one held-out split's S_zz and S_zu (each pair < one (R, w, w) array) and
    up to four (R, p, q) products (each ≤ ¼ of one, as pq ≤ w²/4): < 3 × 128 MB beyond the
    gathered blocks (tests/test_lmd_depth.py holds the bound).
    """
    if _alpha_grid(alpha) is not None:
        raise LMDError("bootstrap_r2 takes one α; pass the α chosen on the full data (the fit row's alpha)")
    alpha = float(alpha)
    _check_basis(basis, [target])
    if not isinstance(blocks, BlockMoments):
        blocks = BlockMoments.from_moments(list(blocks))
    splits = [split] if isinstance(split, str) else list(split)
    for s in splits:
        _check_split(s)
    if n_boot < 1:
        raise LMDError(f"n_boot must be at least 1 (got {n_boot}); set lmd.bootstrap to 0 for no intervals")
    cols = np.concatenate([blocks.columns(basis), blocks.columns([target])])
    p, w = len(blocks.columns(basis)), len(cols)
    basis_dims = [blocks.dims[blocks.names.index(b)] for b in basis]
    zi, ui = np.arange(p), np.arange(p, w)
    n_blocks = len(blocks)
    # the full data's train moments: a constant basis model fails every replicate the same way
    n_all = blocks.n[:, 0].sum()
    if n_all > 0:
        sum_all = blocks.sums[:, 0][:, cols[:p]].sum(axis=0)
        square_all = blocks.cross[:, 0][:, cols[:p], cols[:p]].sum(axis=0)  # diagonal of Σ_b C_b
        _check_basis_variance(basis, basis_dims, square_all - sum_all**2 / n_all, square_all)
    weights = bootstrap_weights(n_blocks, n_boot, seed).astype(np.float64)

    zcols, ucols = cols[:p], cols[p:]

    def gather(cross_k, rows, columns):
        """(B, len(rows) · len(columns)) of cross_k (B, W, W), copied model block by model block."""
        return np.ascontiguousarray(_sub(cross_k, rows, columns, max_runs=np.inf)).reshape(n_blocks, -1)

    def sliced(s):
        # only what a fit and its score use: C_zz, C_zu and the diagonal of C_uu (for tr S_uu),
        # not the whole (p + q)² cross-product
        k = SPLITS.index(s)
        cross_k = blocks.cross[:, k]
        return (blocks.n[:, k].astype(np.float64), blocks.sums[:, k][:, cols], gather(cross_k, zcols, zcols),
                gather(cross_k, zcols, ucols), np.diagonal(cross_k, axis1=1, axis2=2)[:, ucols])

    stats = {s: sliced(s) for s in dict.fromkeys(["train", *splits])}

    def replicate(stats, wts):
        """(n, μ, S_zz, S_zu, tr S_uu) of each replicate: weighted sums of blocks, centred."""
        n_b, s_b, zz_b, zu_b, uu_b = stats
        n = wts @ n_b
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = (wts @ s_b) / n[:, None]
        n_mean = n[:, None] * mean
        s_zz = (wts @ zz_b).reshape(len(wts), p, p)
        s_zu = (wts @ zu_b).reshape(len(wts), p, w - p)
        for r in range(len(wts)):  # S = C − (n μ) μᵀ in place, one replicate at a time
            s_zz[r] -= np.multiply.outer(n_mean[r, zi], mean[r, zi])
            s_zu[r] -= np.multiply.outer(n_mean[r, zi], mean[r, ui])
        tr_uu = wts @ uu_b.sum(axis=1) - np.sum(n_mean[:, ui] * mean[:, ui], axis=1)
        return n, mean, s_zz, s_zu, tr_uu

    out = {s: np.empty(n_boot) for s in splits}
    chunk = max(1, int(_BOOTSTRAP_ARRAY_BYTES // (8 * w * w)))
    for lo in range(0, n_boot, chunk):
        wts = weights[lo:lo + chunk]
        train = replicate(stats["train"], wts)
        n_t, mu_t, s_zz, s_zu, _ = train
        # least squares needs more distinct train rows than basis columns: a replicate repeats
        # blocks, so it holds fewer distinct rows than its weighted count n_t
        distinct_t = (wts > 0) @ stats["train"][0]
        regularised = s_zz.copy()
        diagonal = np.arange(p)
        regularised[:, diagonal, diagonal] += ridge_penalty(np.diagonal(s_zz, axis1=1, axis2=2), basis_dims, alpha)
        try:
            weight_t = np.linalg.solve(regularised, s_zu)  # (R, p, q)
        except np.linalg.LinAlgError as exc:
            raise LMDError(f"bootstrap fit of {target!r} on {list(basis)}: a resampled basis covariance "
                           "is singular; set α > 0") from exc
        del regularised
        bias = mu_t[:, ui] - (mu_t[:, None, zi] @ weight_t)[:, 0]
        for s in splits:
            n_s, mu_s, zz_s, zu_s, s_uu = train if s == "train" else replicate(stats[s], wts)
            offset = mu_s[:, ui] - (mu_s[:, None, zi] @ weight_t)[:, 0] - bias
            sse = (s_uu - 2.0 * np.sum(weight_t * zu_s, axis=(1, 2))
                   + np.sum((zz_s @ weight_t) * weight_t, axis=(1, 2))
                   + n_s * np.sum(offset**2, axis=1))
            with np.errstate(divide="ignore", invalid="ignore"):
                r2 = 1.0 - sse / s_uu
            r2[(n_s == 0) | (s_uu <= 0) | ((alpha == 0) & (distinct_t <= p))] = np.nan
            out[s][lo:lo + chunk] = r2
            del zz_s, zu_s  # before the next split's are built
    for s, samples in out.items():
        bad = int((~np.isfinite(samples)).sum())
        if bad:
            raise LMDError(f"bootstrap of {target!r} on {list(basis)}: {bad} of {n_boot} replicates have an "
                           f"empty {s} or train split, or too few train rows; use fewer, larger blocks")
    return out[split] if isinstance(split, str) else out


def centred_interval(samples: np.ndarray, estimate: float, level: float) -> tuple[float, float]:
    """Bootstrap interval at ``level`` re-centred on the full-data ``estimate``:

        [R̂² − (m − q_lo),  R̂² + (q_hi − m)],   m the bootstrap median, q the (1∓level)/2 quantiles.

    Why not the plain percentile interval [q_lo, q_hi]: a replicate refits on resampled
    training blocks, where duplicated sequences act like ≈ 63% as many distinct rows, so it
    overfits more than the real fit and its held-out R² sits lower — by about one standard
    error when the basis is wide for the train split (measured in tests/test_lmd_depth.py:
    percentile coverage ≈ 65% at a nominal 90%). The held-out R̂² itself is nearly unbiased, and
    the bootstrap spread matches its sampling spread, so the spread is kept and the location
    taken from R̂² (coverage ≈ 90% there). Efron's bias-corrected interval would move the
    wrong way: it assumes the estimator is biased like the replicates are."""
    if not 0 < level < 1:
        raise LMDError(f"level must be in (0, 1); got {level}")
    lo, mid, hi = np.quantile(samples, [(1 - level) / 2, 0.5, (1 + level) / 2])
    return float(estimate - (mid - lo)), float(estimate + (hi - mid))


def bootstrap_r2(
    blocks: "BlockMoments | Sequence[Moments]",
    basis: Sequence[str],
    target: str,
    alpha: float,
    n_boot: int = 200,
    seed: int = 0,
    level: float = 0.9,
    split: str = "test",
) -> tuple[float, float]:
    """Block-bootstrap interval (lo, hi) at ``level`` for the ``split`` R² of the fit of
    ``target`` on ``basis``: the replicates of :func:`bootstrap_r2_samples` re-centred on the
    full-data R² (:func:`centred_interval`). Cost: n_boot batched p×p solves, no embedding
    re-read. It covers train-sampling and test-sampling variability of a fixed-α fit, not α
    selection."""
    if not 0 < level < 1:
        raise LMDError(f"level must be in (0, 1); got {level}")
    if not isinstance(blocks, BlockMoments):
        blocks = BlockMoments.from_moments(list(blocks))
    samples = bootstrap_r2_samples(blocks, basis, target, alpha, n_boot=n_boot, seed=seed, split=split)
    total = blocks.total()
    estimate = r_squared(total, fit_ridge(total, basis, target, alpha), split)
    return centred_interval(samples, estimate, level)


# ---------------------------------------------------------------------------------------
# Greedy forward basis selection
# ---------------------------------------------------------------------------------------


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


class BootstrapCache:
    """Bootstrap replicates already drawn, per fit, for one :class:`BlockMoments`, ``n_boot`` and
    ``seed``: the fit tables of one stage share fits (a greedy selection's first step is a
    pairwise fit, its last the leave-one-out fit), and a fit's replicates are its largest cost.

    A fit is keyed by its basis as a set (the order of the basis columns does not change the
    fit; replicates of two orders agree to rounding), its target and its α. Splits missing for
    a fit already drawn are drawn together, sharing their train refits."""

    def __init__(self, blocks: BlockMoments, n_boot: int, seed: int) -> None:
        self.blocks, self.n_boot, self.seed = blocks, int(n_boot), int(seed)
        self._samples: dict[tuple, dict[str, np.ndarray]] = {}

    def samples(self, basis: Sequence[str], target: str, alpha: float, splits: Sequence[str]) -> dict[str, np.ndarray]:
        """{split: (n_boot,) replicates} of :func:`bootstrap_r2_samples` for the fit."""
        have = self._samples.setdefault((frozenset(basis), target, float(alpha)), {})
        missing = [s for s in dict.fromkeys(splits) if s not in have]
        if missing:
            have.update(bootstrap_r2_samples(self.blocks, basis, target, alpha, n_boot=self.n_boot, seed=self.seed,
                                             split=missing))
        return {s: have[s] for s in splits}

    def __len__(self) -> int:
        """The number of fits drawn."""
        return len(self._samples)


def _cache_for(cache: "BootstrapCache | None", blocks: BlockMoments, n_boot: int, seed: int) -> BootstrapCache:
    """``cache``, checked to serve these blocks, n_boot and seed; a fresh one if None."""
    if cache is None:
        return BootstrapCache(blocks, n_boot, seed)
    if blocks is not cache.blocks or int(n_boot) != cache.n_boot or int(seed) != cache.seed:
        raise LMDError("a BootstrapCache serves one set of block moments, n_boot and seed; make one per set")
    return cache


def add_confidence_intervals(
    rows: list[dict], blocks: BlockMoments, n_boot: int, level: float, seed: int, basis_of=None,
    cache: BootstrapCache | None = None,
) -> list[dict]:
    """Give every fit row ``r2_lo``/``r2_hi``: its block-bootstrap interval at ``level``, re-centred
    on the row's ``r2`` (:func:`centred_interval`).

    A row's basis is ``basis_of(row)`` if given, else ``[row["basis"]]``, else (a leave-one-out
    row) every other model. The interval is for the row's own α (chosen on the full data when α
    came from a grid). Rows of one fit (same basis, target and α) share one bootstrap, and with
    a ``cache`` so do the fits of other tables drawn through it."""
    if not 0 < level < 1:
        raise LMDError(f"level must be in (0, 1); got {level}")
    cache = _cache_for(cache, blocks, n_boot, seed)

    def basis_for(row):
        if basis_of is not None:
            return list(basis_of(row))
        return [row["basis"]] if "basis" in row else [n for n in blocks.names if n != row["target"]]

    fits: dict[tuple, list[str]] = {}
    for row in rows:
        fits.setdefault((tuple(basis_for(row)), row["target"], row["alpha"]), []).append(row["split"])
    intervals = {}
    for (basis, target, alpha), splits in fits.items():
        samples = cache.samples(basis, target, alpha, splits)
        intervals.update({(basis, target, alpha, s): values for s, values in samples.items()})
    out = []
    for row in rows:
        samples = intervals[tuple(basis_for(row)), row["target"], row["alpha"], row["split"]]
        lo, hi = centred_interval(samples, row["r2"], level)
        out.append({**row, "r2_lo": lo, "r2_hi": hi})
    return out


def add_selection_intervals(
    selection: list[dict], blocks: BlockMoments, n_boot: int, level: float, seed: int,
    cache: BootstrapCache | None = None,
) -> list[dict]:
    """Give every :func:`greedy_selection` row ``val_r2_lo``/``val_r2_hi`` and
    ``test_r2_lo``/``test_r2_hi``: bootstrap intervals of the fit on the models selected up to
    its step (one bootstrap per row for both splits, centred as :func:`centred_interval`; with a
    ``cache``, shared with the same fit drawn for another table). The path itself is taken as
    fixed: the intervals do not cover the selection's own variability."""
    cache = _cache_for(cache, blocks, n_boot, seed)
    out = []
    for row in selection:
        basis = [r["added_model"] for r in selection if r["target"] == row["target"] and r["k"] <= row["k"]]
        samples = cache.samples(basis, row["target"], row["alpha"], ["val", "test"])
        extra = {}
        for split in ("val", "test"):
            lo, hi = centred_interval(samples[split], row[f"{split}_r2"], level)
            extra.update({f"{split}_r2_lo": lo, f"{split}_r2_hi": hi})
        out.append({**row, **extra})
    return out


def rows_per_block(sequences: str | Path, n_blocks: int) -> int:
    """Rows per bootstrap block so that the corpus splits into ``n_blocks`` blocks of consecutive
    sequences; the block count, not the corpus size, bounds the size of the block moments."""
    import pyarrow.parquet as pq

    rows = pq.ParquetFile(sequences).metadata.num_rows
    return max(1, -(-rows // max(1, int(n_blocks))))
