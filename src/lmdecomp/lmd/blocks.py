"""Moments per block of consecutive sequences, the raw material of the block bootstrap:
the moments of any weighted union of blocks are Σ_b w_b · (n_b, s_b, C_b)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from lmdecomp.atomic import atomic_path
from lmdecomp.lmd.blas import syrk_lower
from lmdecomp.lmd.errors import LMDError
from lmdecomp.lmd.memory import check_block_memory
from lmdecomp.lmd.moments import (
    _PART_KEYS,
    SPLITS,
    Moments,
    _columns,
    _PartCoverage,
    _symmetrise_from_lower,
)
from lmdecomp.lmd.stream import aligned_shards


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
                    syrk_lower(out.cross[b - first, k], rows_bs)
    for cross in out.cross.reshape(-1, out.width, out.width):
        _symmetrise_from_lower(cross)
    out.info = dict(aligned.info)
    if shard_range is not None:
        out.info.update(block_offset=int(first), blocks_total=int(blocks_total), shard_range=[int(lo), int(hi)],
                        n_shards=int(aligned.n_shards))
    return out


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


def rows_per_block(sequences: str | Path, n_blocks: int) -> int:
    """Rows per bootstrap block so that the corpus splits into ``n_blocks`` blocks of consecutive
    sequences; the block count, not the corpus size, bounds the size of the block moments."""
    import pyarrow.parquet as pq

    rows = pq.ParquetFile(sequences).metadata.num_rows
    return max(1, -(-rows // max(1, int(n_blocks))))
