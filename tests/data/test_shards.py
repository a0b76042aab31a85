"""Shard write/read round trip and the checks that catch damaged shards."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lmdecomp.data import shards


def make_folder(folder, rows=50, dim=8, per_shard=20, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.arange(rows, dtype=np.int64) * 3
    splits = [("train", "val", "test")[i % 3] for i in range(rows)]
    emb = rng.normal(size=(rows, dim)).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, start in enumerate(range(0, rows, per_shard)):
        file = shards.shard_name(i)
        sl = slice(start, start + per_shard)
        shards.write_shard(folder / file, ids[sl], splits[sl], emb[sl], row_group_rows=7)
        entries.append(shards.shard_entry(folder, file, len(ids[sl])))
    shards.write_manifest(folder, {"schema_version": shards.SCHEMA_VERSION, "model": "m", "dim": dim,
                                   "rows": rows, "shards": entries})
    return ids, splits, emb


def test_round_trip(tmp_path):
    ids, splits, emb = make_folder(tmp_path)
    parts = list(shards.iter_shards(tmp_path))
    assert [len(p.seq_id) for p in parts] == [20, 20, 10]
    np.testing.assert_array_equal(np.concatenate([p.seq_id for p in parts]), ids)
    assert [s for p in parts for s in p.split] == splits
    np.testing.assert_array_equal(np.concatenate([p.embedding for p in parts]), emb)
    schema = pq.read_schema(tmp_path / "part-00000.parquet")
    column = schema.field("embedding").type
    assert pa.types.is_fixed_size_list(column) and column.list_size == 8
    assert column.value_type == pa.float32()
    assert pq.ParquetFile(tmp_path / "part-00000.parquet").metadata.num_row_groups == 3


def test_vectors_are_stored_without_a_dictionary_and_splits_with_one(tmp_path):
    """Float vectors never repeat, so a dictionary page is pure overhead (pyarrow writes one per
    row group before falling back to plain); the three split labels do repeat."""
    make_folder(tmp_path)
    metadata = pq.ParquetFile(tmp_path / "part-00000.parquet").metadata
    for g in range(metadata.num_row_groups):
        chunks = {metadata.row_group(g).column(c).path_in_schema: metadata.row_group(g).column(c)
                  for c in range(metadata.num_columns)}
        assert not chunks["embedding.list.element"].has_dictionary_page
        assert "RLE_DICTIONARY" not in chunks["embedding.list.element"].encodings
        assert chunks["split"].has_dictionary_page


def test_vectors_are_non_nullable_lz4_and_polars_reads_them(tmp_path):
    """No definition level per float (the vectors are never null) and lz4, the cheaper codec to
    decode; another Parquet reader gets the same numbers back."""
    import polars as pl

    _, _, emb = make_folder(tmp_path)
    path = tmp_path / "part-00000.parquet"
    field = pq.read_schema(path).field("embedding")
    assert not field.nullable and not field.type.value_field.nullable
    column = pq.ParquetFile(path).metadata.row_group(0).column(2)
    assert column.path_in_schema == "embedding.list.element"
    assert column.compression == "LZ4" and column.statistics.null_count == 0
    np.testing.assert_array_equal(np.stack(pl.read_parquet(path)["embedding"].to_list()).astype(np.float32), emb[:20])


def test_shards_written_nullable_with_zstd_still_read(tmp_path):
    """Shards from before 2026-12-06 (nullable vectors, zstd) are the same schema version: the
    reader takes both."""
    ids, splits, emb = make_folder(tmp_path, rows=20)
    path = tmp_path / "part-00000.parquet"
    vector = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 8)
    pq.write_table(pa.table({"seq_id": ids, "split": splits, "embedding": vector}), path, compression="zstd")
    assert pq.read_schema(path).field("embedding").nullable
    entry = shards.shard_entry(tmp_path, path.name, len(ids))
    shards.write_manifest(tmp_path, {"schema_version": shards.SCHEMA_VERSION, "model": "m", "dim": 8,
                                     "rows": 20, "shards": [entry]})
    (part,) = shards.iter_shards(tmp_path)
    np.testing.assert_array_equal(part.embedding, emb)
    np.testing.assert_array_equal(part.seq_id, ids)


def test_truncated_shard_is_caught_by_checksum(tmp_path):
    make_folder(tmp_path)
    path = tmp_path / "part-00001.parquet"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(shards.ShardError, match="part-00001.parquet is corrupt or truncated"):
        list(shards.iter_shards(tmp_path))


def test_bit_flip_is_caught(tmp_path):
    make_folder(tmp_path)
    path = tmp_path / "part-00000.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(shards.ShardError, match="corrupt or truncated"):
        list(shards.iter_shards(tmp_path))


def test_missing_manifest_means_unfinished(tmp_path):
    make_folder(tmp_path)
    (tmp_path / shards.MANIFEST).unlink()
    with pytest.raises(shards.ShardError, match="did not finish"):
        list(shards.iter_shards(tmp_path))


def test_old_schema_version_is_refused(tmp_path):
    make_folder(tmp_path)
    manifest = json.loads((tmp_path / shards.MANIFEST).read_text())
    manifest["schema_version"] = 0
    (tmp_path / shards.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(shards.ShardError, match="schema_version 0"):
        list(shards.iter_shards(tmp_path))


def test_non_finite_embeddings_are_refused():
    emb = np.ones((3, 2), dtype=np.float32)
    emb[1, 0] = np.nan
    with pytest.raises(shards.ShardError, match=r"NaN or Inf \(seq_id \[11\]"):
        shards.check_finite("m", np.array([10, 11, 12]), emb)
