"""lmdecomp.lmd.blocks and lmdecomp.lmd.memory: block moments per shard or fixed block, computed in
parts and reduced, and the memory check before the pass, against float64 numpy per block and
the bits of one pass."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import write_embeddings
from lmd_helpers import four_shards_of_three_models
from lmdecomp import lmd
from lmdecomp.lmd import memory as lmd_memory  # patched where check_block_memory looks it up

SPLIT_NAMES = np.array(lmd.SPLITS, dtype=object)


@pytest.mark.parametrize("per_job", [1, 2, 3])
def test_moments_computed_in_parts_reduce_to_the_one_pass_bits(tmp_path, per_job):
    """The scale-out (lmd.shards_per_job): partial block moments over groups of shards, reduced,
    equal one pass bit for bit — with blocks of 37 sequences that straddle shards of 64."""
    blocks, split, folders = four_shards_of_three_models(tmp_path, seed=4)
    one_pass = lmd.accumulate_block_moments(folders, rows_per_block=37)
    parts = [lmd.accumulate_block_moments(folders, rows_per_block=37, shard_range=(lo, min(lo + per_job, 4)))
             for lo in range(0, 4, per_job)]
    assert sum(len(p) for p in parts) >= len(one_pass) == 7
    reduced = lmd.reduce_block_moments(part for part in parts)  # as the reduce job loads them: one at a time
    for field in ("n", "sums", "cross"):
        np.testing.assert_array_equal(getattr(reduced, field), getattr(one_pass, field))
    # and against an explicit float64 computation of each block
    x = np.concatenate(blocks, axis=1).astype(np.float64)
    for b in range(7):
        rows = x[37 * b:37 * (b + 1)][split[37 * b:37 * (b + 1)] == "train"]
        np.testing.assert_allclose(reduced.cross[b, 0], rows.T @ rows, rtol=1e-12, atol=1e-12)
    reduced.save(tmp_path / "r.safetensors")
    one_pass.save(tmp_path / "o.safetensors")
    assert (tmp_path / "r.safetensors").read_bytes() == (tmp_path / "o.safetensors").read_bytes()
    with pytest.raises(lmd.LMDError, match="not a part of a scale-out"):
        lmd.reduce_block_moments([one_pass])


def test_block_moments_that_cannot_fit_in_memory_are_refused_before_the_pass(tmp_path, monkeypatch):
    """8 · blocks · 3 · width² bytes: the paper's 12 × 768-wide models with 40 blocks need 76 GiB;
    the error gives the numbers and the two ways out instead of an out-of-memory kill."""
    gib = 2**30
    with pytest.raises(lmd.LMDError, match=r"need 75\.9 GiB \(40 blocks × 3 splits × 9216² float64.*16\.0 GiB.*"
                                           r"lmd.bootstrap_blocks.*lmd.bootstrap: 0"):
        lmd.check_block_memory(40, 9216, available=16 * gib)
    lmd.check_block_memory(2, 9216, available=16 * gib)  # 3.8 GiB fits
    rng = np.random.default_rng(9)
    split = np.array(["train"] * 30, dtype=object)
    for name in ("a", "b"):
        write_embeddings(tmp_path / name, name, np.arange(30), split, rng.normal(size=(30, 5)).astype(np.float32), 10)
    folders = {name: tmp_path / name for name in ("a", "b")}
    needed = 8 * 3 * 3 * 10**2  # 3 blocks of 10 sequences, width 10
    monkeypatch.setattr(lmd_memory, "available_memory_bytes", lambda: needed)
    with pytest.raises(lmd.LMDError, match="block moments need"):
        lmd.accumulate_block_moments(folders, rows_per_block=10)
    monkeypatch.setattr(lmd_memory, "available_memory_bytes", lambda: 2 * needed)
    assert len(lmd.accumulate_block_moments(folders, rows_per_block=10)) == 3


def test_parts_that_do_not_tile_the_shards_are_refused(tmp_path):
    """Parts of one shard each: a part passed twice, missing, or out of order would add blocks
    twice or leave them empty, silently; the reduce checks the recorded shard ranges instead."""
    rng = np.random.default_rng(5)
    n = 160
    split = rng.choice(np.array(lmd.SPLITS, dtype=object), size=n)
    for name in ("a", "b"):
        write_embeddings(tmp_path / name, name, np.arange(n), split, rng.normal(size=(n, 3)).astype(np.float32), 40)
    folders = {name: tmp_path / name for name in ("a", "b")}
    p0, p1, p2, p3 = (lmd.accumulate_block_moments(folders, rows_per_block=30, shard_range=(k, k + 1))
                      for k in range(4))
    assert p2.info["shard_range"] == [2, 3] and p2.info["n_shards"] == 4
    reduced = lmd.reduce_block_moments([p0, p1, p2, p3])
    assert "shard_range" not in reduced.info and "block_offset" not in reduced.info
    np.testing.assert_array_equal(reduced.n.sum(axis=0), [(split == s).sum() for s in lmd.SPLITS])
    for parts, message in (([p0, p0, p2, p3], r"part 1 \(shards 0..0\) overlaps the parts before it"),
                           ([p0, p1, p3], r"shards 2..2 are in no part"),
                           ([p0, p1, p2], r"shards 3..3 are in no part"),
                           ([p1, p0, p2, p3], r"shards 0..0 are in no part"),
                           ([p0, p1, p2, p3, p3], r"part 4 \(shards 3..3\) overlaps")):
        with pytest.raises(lmd.LMDError, match=message):
            lmd.reduce_block_moments(parts)
    old = lmd.BlockMoments(p1.names, p1.dims, p1.n, p1.sums, p1.cross,
                           {k: v for k, v in p1.info.items() if k != "shard_range"})
    with pytest.raises(lmd.LMDError, match="do not record their shard range"):
        lmd.reduce_block_moments([p0, old, p2, p3])


def test_block_moments_stream_per_shard_and_per_fixed_block(tmp_path):
    rng = np.random.default_rng(12)
    n = 230
    blocks = [rng.normal(size=(n, w)).astype(np.float32) + 1 for w in (3, 5)]
    split = rng.choice(SPLIT_NAMES, size=n)
    names = ["m0", "m1"]
    for name, block in zip(names, blocks):
        write_embeddings(tmp_path / name, name, np.arange(n), split, block, rows_per_shard=64)
    folders = {name: tmp_path / name for name in names}
    x = np.concatenate(blocks, axis=1).astype(np.float64)
    for rows_per_block, edges in ((None, range(0, n, 64)), (50, range(0, n, 50))):
        bm = lmd.accumulate_block_moments(folders, rows_per_block=rows_per_block)
        assert len(bm) == len(edges)
        for b, start in enumerate(edges):  # blocks of 50 rows straddle the 64-row shards
            rows, sp = x[start:start + (rows_per_block or 64)], split[start:start + (rows_per_block or 64)]
            for k, s in enumerate(lmd.SPLITS):
                assert bm.n[b, k] == (sp == s).sum()
                np.testing.assert_allclose(bm.sums[b, k], rows[sp == s].sum(0), rtol=1e-12, atol=1e-12)
                np.testing.assert_allclose(bm.cross[b, k], rows[sp == s].T @ rows[sp == s], rtol=1e-12, atol=1e-12)
        pooled, total = lmd.accumulate_moments(folders), bm.total()
        for s in lmd.SPLITS:
            assert total.n[s] == pooled.n[s]
            np.testing.assert_allclose(total.cross[s], pooled.cross[s], rtol=1e-12)
    bm.save(tmp_path / "blocks.safetensors")
    loaded = lmd.BlockMoments.load(tmp_path / "blocks.safetensors")
    assert loaded.names == names and loaded.dims == [3, 5]
    np.testing.assert_array_equal(loaded.cross, bm.cross)
    np.testing.assert_array_equal(loaded[2].cross["val"], bm.cross[2, 1])
