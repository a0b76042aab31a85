"""lmdecomp.lmd.stream: moments accumulated over the shards of several models (every flush size,
groups of shards, parts reduced) and misaligned shards refused, against float64 numpy on the
rows in memory."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import write_embeddings
from lmd_helpers import four_shards_of_three_models, planted
from lmdecomp import lmd


def assert_moments_equal_numpy(streamed, x, split):
    """Counts, sums and cross-products per split against float64 numpy on the rows in memory."""
    x = x.astype(np.float64)
    for s in lmd.SPLITS:
        rows = x[split == s]
        assert streamed.n[s] == len(rows)
        np.testing.assert_allclose(streamed.sums[s], rows.sum(0), rtol=1e-12)
        np.testing.assert_allclose(streamed.cross[s], rows.T @ rows, rtol=1e-12)


def test_streaming_moments_over_shards_equal_one_in_memory_pass(tmp_path):
    rng = np.random.default_rng(3)
    n = 250
    blocks = [b.astype(np.float32) for b in planted(rng, n, [4, 6, 3])]
    split = rng.choice(np.array(lmd.SPLITS, dtype=object), size=n)
    ids = np.arange(n, dtype=np.int64)
    names = ["m0", "m1", "m2"]
    for name, block in zip(names, blocks):
        write_embeddings(tmp_path / name, name, ids, split, block, rows_per_shard=64)
    streamed = lmd.accumulate_moments({name: tmp_path / name for name in names})
    assert_moments_equal_numpy(streamed, np.concatenate(blocks, axis=1), split)
    streamed.save(tmp_path / "m.safetensors")
    loaded = lmd.Moments.load(tmp_path / "m.safetensors")
    assert loaded.names == names and loaded.dims == [4, 6, 3]
    np.testing.assert_array_equal(loaded.cross["val"], streamed.cross["val"])


@pytest.mark.parametrize("flush_rows", [1, 5, 50, 2048])
def test_streaming_moments_for_every_flush_size(tmp_path, flush_rows, monkeypatch):
    """Rows are gathered per split into a buffer of ``flush_rows`` and added when it is full; a
    shard holding more rows of a split than that is added in chunks of ``flush_rows``. Small sizes
    chunk most shards; the result must equal float64 numpy for every size. Every update but a
    split's last holds exactly ``flush_rows`` rows (rows carry over from shard to shard)."""
    rng = np.random.default_rng(8)
    n = 230
    blocks = [b.astype(np.float32) for b in planted(rng, n, [5, 3])]
    split = rng.choice(np.array(lmd.SPLITS, dtype=object), size=n, p=[0.5, 0.25, 0.25])
    split[64:128] = "train"  # shard 1 is all train: 64 rows of one split, several chunks of the smaller sizes
    for name, block in zip(["a", "b"], blocks):
        write_embeddings(tmp_path / name, name, np.arange(n), split, block, rows_per_shard=64)
    updates = {s: [] for s in lmd.SPLITS}
    add = lmd.Moments._add

    def recording_add(self, s, x):
        updates[s].append(len(x))
        add(self, s, x)

    monkeypatch.setattr(lmd.Moments, "_add", recording_add)
    streamed = lmd.accumulate_moments({name: tmp_path / name for name in ["a", "b"]}, flush_rows=flush_rows)
    assert_moments_equal_numpy(streamed, np.concatenate(blocks, axis=1), split)
    for s in lmd.SPLITS:
        count = int(np.sum(split == s))
        assert updates[s] == [flush_rows] * (count // flush_rows) + ([count % flush_rows] if count % flush_rows else [])
    for s in lmd.SPLITS:
        np.testing.assert_array_equal(streamed.cross[s], streamed.cross[s].T)


@pytest.mark.parametrize("per_job", [1, 3])
def test_moments_without_blocks_computed_in_parts_reduce_to_the_one_pass_bits(tmp_path, per_job):
    """lmd.bootstrap: 0 with lmd.shards_per_job: streaming moments of groups of shards, reduced
    (from a generator, one part at a time), equal to the bit the one pass that sums the same
    groups (group_shards), and an explicit float64 computation; the ungrouped pass flushes at
    other rows, so it agrees to rounding only. The reduce checks that the parts tile the shards."""
    blocks, split, folders = four_shards_of_three_models(tmp_path, seed=8)
    one_pass = lmd.accumulate_moments(folders, flush_rows=16, group_shards=per_job)
    ungrouped = lmd.accumulate_moments(folders, flush_rows=16)
    parts = [lmd.accumulate_moments(folders, flush_rows=16, shard_range=(lo, min(lo + per_job, 4)))
             for lo in range(0, 4, per_job)]
    assert [p.info["shard_range"] for p in parts] == [[lo, min(lo + per_job, 4)] for lo in range(0, 4, per_job)]
    assert {p.info["n_shards"] for p in parts} == {4}
    reduced = lmd.reduce_moments(part for part in parts)
    assert "shard_range" not in reduced.info and reduced.info == one_pass.info == ungrouped.info
    reduced.save(tmp_path / "r.safetensors")
    one_pass.save(tmp_path / "o.safetensors")
    assert (tmp_path / "r.safetensors").read_bytes() == (tmp_path / "o.safetensors").read_bytes()
    x = np.concatenate(blocks, axis=1).astype(np.float64)
    for s in lmd.SPLITS:
        rows = x[split == s]
        assert reduced.n[s] == ungrouped.n[s] == len(rows)
        np.testing.assert_allclose(reduced.sums[s], ungrouped.sums[s], rtol=1e-13, atol=1e-12)
        np.testing.assert_allclose(reduced.cross[s], ungrouped.cross[s], rtol=1e-13, atol=1e-11)
        np.testing.assert_allclose(reduced.cross[s], rows.T @ rows, rtol=1e-12, atol=1e-10)
    if per_job == 1:
        with pytest.raises(lmd.LMDError, match=r"part 1 \(shards 0..0\) overlaps"):
            lmd.reduce_moments([parts[0], *parts[:3]])
        with pytest.raises(lmd.LMDError, match=r"shards 3..3 are in no part"):
            lmd.reduce_moments(parts[:3])


def test_models_with_different_seq_ids_are_refused(tmp_path):
    rng = np.random.default_rng(4)
    split = np.array(["train"] * 40, dtype=object)
    write_embeddings(tmp_path / "a", "a", np.arange(40), split, rng.normal(size=(40, 3)).astype(np.float32), 20)
    write_embeddings(tmp_path / "b", "b", np.arange(40) + 1, split, rng.normal(size=(40, 3)).astype(np.float32), 20)
    with pytest.raises(lmd.LMDError, match="different seq_id sets"):
        lmd.accumulate_moments({"a": tmp_path / "a", "b": tmp_path / "b"})


def test_different_shard_layouts_name_the_first_differing_shard(tmp_path):
    rng = np.random.default_rng(6)
    split = np.array(["train"] * 60, dtype=object)
    x = rng.normal(size=(60, 3)).astype(np.float32)
    write_embeddings(tmp_path / "a", "a", np.arange(60), split, x, 30)  # shards of 30, 30
    write_embeddings(tmp_path / "b", "b", np.arange(60), split, x, 40)  # 40, 20: same count
    write_embeddings(tmp_path / "c", "c", np.arange(60), split, x, 20)  # 3 shards
    with pytest.raises(lmd.LMDError, match="shard 0 holds 30 rows for 'a' but 40 for 'b'"):
        lmd.accumulate_moments({"a": tmp_path / "a", "b": tmp_path / "b"})
    with pytest.raises(lmd.LMDError, match=r"\(2 vs 3 shards\)"):
        lmd.accumulate_moments({"a": tmp_path / "a", "c": tmp_path / "c"})


def test_read_ahead_produces_the_next_item_while_the_caller_holds_this_one():
    """Item k+1 is read while the caller still works on item k (the caller waits for the
    producer's signal; read one after the other, that wait would time out), in order, and
    the producer's exception reaches the caller with its own type."""
    import threading

    produced = [threading.Event() for _ in range(4)]

    def items():
        for k in range(3):
            produced[k].set()
            yield k
        raise lmd.LMDError("shard 3 is corrupt")

    got, ahead = [], []
    reader = lmd.stream.read_ahead(items())
    with pytest.raises(lmd.LMDError, match="shard 3 is corrupt"):
        for k in reader:
            got.append(k)
            if k < 2:
                ahead.append(produced[k + 1].wait(timeout=10))
    assert got == [0, 1, 2] and ahead == [True, True]


def test_read_ahead_reads_at_most_one_item_ahead_and_stops_with_the_caller():
    pulled = []

    def items():
        for k in range(100):
            pulled.append(k)
            yield k

    reader = lmd.stream.read_ahead(items())
    assert [next(reader), next(reader)] == [0, 1]
    reader.close()  # the caller stops early: the worker finishes its one read ahead and exits
    assert pulled == [0, 1, 2]


def test_background_updates_overlap_the_next_gather_and_raise_in_the_caller(monkeypatch):
    """A flush returns while its rank-k update still runs, with a different buffer for the
    caller to fill (the rows being added are never overwritten); the updates run in flush order;
    an update's exception reaches the caller."""
    import threading

    moments = lmd.Moments(["a"], [3])
    started, release, added = threading.Event(), threading.Event(), []

    def slow_add(self, s, x):
        started.set()
        assert release.wait(timeout=10)
        added.append((s, x.copy()))
        if s == "test":
            raise lmd.LMDError("update failed")

    monkeypatch.setattr(lmd.Moments, "_add", slow_add)
    updates = lmd.stream._BackgroundUpdates(moments, flush_rows=2)
    with pytest.raises(lmd.LMDError, match="update failed"):
        with updates:
            first = updates.buffers["train"]
            first[:] = 1.0
            updates.flush("train", 2)
            assert started.wait(timeout=10) and not added  # flush returned, the update is running
            assert updates.buffers["train"] is not first
            updates.buffers["train"][:] = 2.0  # the caller fills the next rows meanwhile
            release.set()
            updates.flush("train", 1)
            updates.buffers["test"][:] = 3.0
            updates.flush("test", 2)
    assert [(s, x.tolist()) for s, x in added] == [("train", [[1.0] * 3] * 2), ("train", [[2.0] * 3]),
                                                   ("test", [[3.0] * 3] * 2)]
