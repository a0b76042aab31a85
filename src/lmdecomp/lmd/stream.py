"""The streaming pass: embedding shards of all models aligned row by row and folded into
:class:`~lmdecomp.lmd.moments.Moments` (one per corpus) or, per block of sequences, into
:class:`~lmdecomp.lmd.blocks.BlockMoments` (:mod:`lmdecomp.lmd.blocks`).
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping, TypeVar

import numpy as np

from lmdecomp.data import shards
from lmdecomp.lmd.errors import LMDError
from lmdecomp.lmd.moments import SPLITS, Moments, _symmetrise_from_lower, reduce_moments


T = TypeVar("T")
_END = object()
_GATHER_ROWS = 128  # 128 rows × 768 float32: 384 KiB, within a core's L2


def read_ahead(items: Iterator[T]) -> Iterator[T]:
    """``items`` in order, each next one produced by a worker thread while the caller works on
    the current one.

    Reading a shard group (file reads, sha256, Parquet decoding, the finiteness check) is
    single-threaded and releases the GIL (hashlib, pyarrow, numpy), while the caller's rank-k
    updates run on every BLAS thread: done one after the other, a core idles through every
    read. Exceptions reach the caller from the item that raised them; ``items`` is only ever
    advanced by one thread at a time, and one item at most is read ahead."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmd-read-ahead") as worker:
        pending = worker.submit(next, items, _END)
        while (item := pending.result()) is not _END:
            pending = worker.submit(next, items, _END)
            yield item


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

    def gather(self, index: "np.ndarray | slice", out: np.ndarray) -> np.ndarray:
        """Rows ``index`` of the float64 concatenation [x_1 | … | x_M] written into ``out``
        (len(index) × width), block by block, with no joint temporary (allocating and then
        gathering from one cost more than the copy). An index array is gathered _GATHER_ROWS
        rows at a time, so that the float32 rows numpy takes before converting them stay in
        cache instead of making one more trip through memory (2026-12-06, AMD EPYC: the train
        rows of bench_lmd's 372 shard files at N = 50,000, 0.64 → 0.36 s on one core)."""
        start = 0
        for block in self.blocks:
            stop = start + block.shape[1]
            if isinstance(index, slice):  # a view: converted as it is copied
                out[:, start:stop] = block[index]
            else:
                for lo in range(0, len(index), _GATHER_ROWS):
                    rows = index[lo:lo + _GATHER_ROWS]
                    out[lo:lo + len(rows), start:stop] = block[rows]
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

    return AlignedShards(names, dims, n_shards, read_ahead(groups()), info, [0, *np.cumsum(sequences).tolist()])


class _BackgroundUpdates:
    """The pass's rank-k updates (:meth:`Moments._add`) run one at a time, in order, on a worker
    thread, while the caller gathers the next rows into another buffer: gathering on the
    caller's thread between updates left both BLAS cores idle for it (about 3 s of a 60 s pass,
    N = 50,000). The same updates in the same order: the same bits.

    ``buffers[s]`` is the buffer the caller fills for split s. One buffer more than the splits
    (each flush_rows × width float64, allocated once: a fresh width-wide array costs its page
    faults again every time) lets the caller fill one while the worker reads another."""

    def __init__(self, moments: Moments, flush_rows: int) -> None:
        self.moments = moments
        self.buffers = {s: np.empty((flush_rows, moments.width)) for s in SPLITS}
        self.spare = np.empty((flush_rows, moments.width))
        self.pending: Future | None = None
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmd-rank-k")

    def flush(self, split: str, rows: int) -> None:
        """Hand the first ``rows`` rows of ``buffers[split]`` to the worker; the caller's buffer
        for the split is then the spare one, once the update before is done with it."""
        if not rows:
            return
        full = self.buffers[split]
        self._wait()
        self.pending = self.worker.submit(self.moments._add, split, full[:rows])
        self.buffers[split], self.spare = self.spare, full

    def _wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()  # an update's exception reaches the caller here

    def __enter__(self) -> "_BackgroundUpdates":
        return self

    def __exit__(self, *exc) -> None:
        try:
            if exc[0] is None:
                self._wait()
        finally:
            self.worker.shutdown(wait=True)


def _symmetrise_all(moments: Moments) -> None:
    """Each split's cross-product made symmetric from its lower triangle, the three on two
    threads (numpy's strided copies release the GIL): about 1 s of a pass on one core."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="lmd-symmetrise") as pool:
        for done in [pool.submit(_symmetrise_from_lower, moments.cross[s]) for s in SPLITS]:
            done.result()


def accumulate_moments(folders: Mapping[str, str | Path], progress: bool = False, flush_rows: int = 4096,
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
    # much in memory traffic as in arithmetic. 4,096 rather than 2,048 (2026-12-04, Intel Xeon
    # with AMX, 12 models × 768 at N = 50,000, three alternating pairs): the pass 60.0–61.1 s
    # → 54.9–56.0 s; 8,192 ran as 4,096 and would double the buffers again.
    updates = _BackgroundUpdates(moments, flush_rows)
    filled = dict.fromkeys(SPLITS, 0)
    with updates:
        for group in tqdm(aligned.groups, total=aligned.n_shards, desc="moments", unit="shard", disable=not progress):
            for s in SPLITS:
                index = np.flatnonzero(group.split == s)
                # Top the buffer up to exactly flush_rows before each update and carry the rest of
                # the shard's rows over: flushing a shard's ~0.8 × flush_rows train rows on their own
                # made a fifth more updates, each reading and writing the whole width² triangle.
                while len(index):
                    part, index = index[:flush_rows - filled[s]], index[flush_rows - filled[s]:]
                    group.gather(part, updates.buffers[s][filled[s]:filled[s] + len(part)])
                    filled[s] += len(part)
                    if filled[s] == flush_rows:
                        updates.flush(s, filled[s])
                        filled[s] = 0
        for s in SPLITS:
            updates.flush(s, filled[s])
    _symmetrise_all(moments)
    moments.info = dict(aligned.info)
    if shard_range is not None:
        moments.info.update(shard_range=[int(v) for v in shard_range], n_shards=int(aligned.n_shards))
    return moments
