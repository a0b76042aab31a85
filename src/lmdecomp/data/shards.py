"""Embedding shards: the one writer and the one reader of ``results/embeddings/{model}/``.

A model's folder holds ``part-NNNNN.parquet`` files with columns

    seq_id     int64
    word_idx   int32                            (``granularity: word`` only)
    split      string
    embedding  fixed_size_list<float32>[dim]    the hidden state of ``embed.layer``
    hidden_K   fixed_size_list<float32>[dim]    hidden state K of ``embed.layers`` (K ≥ 0), if any

A row is a sequence, or with ``granularity: word`` a word (seq_id, word_idx) of a sequence;
rows are sorted by that key. Vectors are non-nullable and shards lz4-compressed
(:func:`vector_type`). ``manifest.json`` holds model, source, revision, weights hash, layer,
layers, granularity, pooling, dim, rows, tokens, ``schema_version``, and per shard its file
name, rows, sequences and sha256. Shards are written atomically and the manifest last, so a
folder without a manifest is unfinished. Readers verify every shard against the manifest's
checksum before using it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lmdecomp.atomic import atomic_path, sha256_file, write_text

SCHEMA_VERSION = 2
MANIFEST = "manifest.json"


class ShardError(ValueError):
    """An embedding folder is missing, unfinished, corrupt or inconsistent."""


def hidden_column(layer: int) -> str:
    """The column of hidden state ``layer`` (≥ 0) stored besides ``embedding``."""
    return f"hidden_{int(layer)}"


def layer_column(manifest: dict[str, Any], layer: int) -> str:
    """The column holding hidden state ``layer`` (≥ 0) of a model, per its manifest."""
    if layer == manifest["layer"]:
        return "embedding"
    if layer not in manifest.get("layers", []):
        raise ShardError(f"model {manifest['model']!r}: hidden state {layer} was not embedded; "
                         f"stored: {manifest.get('layers', [manifest['layer']])} (set embed.layers)")
    return hidden_column(layer)


def vector_type(dim: int) -> pa.FixedSizeListType:
    """fixed_size_list<float32>[dim] with neither the list nor its values nullable: Parquet then
    stores no definition level per value (a vector is never null, and NaN is refused).

    Written with lz4, not zstd: the LMD pass decodes every shard of every model beside two BLAS
    threads on two cores, so its decoding CPU is pass time. 62 synthetic shards of 2,048 × 768
    (AMD EPYC, 2026-12-06), CPU to decode: nullable zstd 0.76 s, non-nullable zstd 0.62 s,
    nullable lz4 0.50 s, non-nullable lz4 0.32 s; zstd stored them in 0.92 of lz4's bytes.
    Shards written nullable or with zstd (before 2026-12-06) read the same."""
    return pa.list_(pa.field("item", pa.float32(), nullable=False), dim)


def shard_schema(dim: int, words: bool = False, hidden_layers: Iterable[int] = ()) -> pa.Schema:
    vector = pa.field("embedding", vector_type(dim), nullable=False)
    fields = [("seq_id", pa.int64())]
    if words:
        fields.append(("word_idx", pa.int32()))
    fields += [("split", pa.string()), vector]
    fields += [vector.with_name(hidden_column(k)) for k in hidden_layers]
    return pa.schema(fields)


def shard_name(index: int) -> str:
    return f"part-{index:05d}.parquet"


def check_finite(model: str, seq_ids: np.ndarray, embeddings: np.ndarray) -> None:
    bad = ~np.isfinite(embeddings).all(axis=1)
    if bad.any():
        ids = seq_ids[bad][:5].tolist()
        raise ShardError(
            f"model {model!r}: {int(bad.sum())} embeddings contain NaN or Inf (seq_id {ids}...); "
            "check the model weights and embed.dtype"
        )


def _vectors(x: np.ndarray) -> pa.FixedSizeListArray:
    values = pa.array(np.ascontiguousarray(x, dtype=np.float32).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(values, type=vector_type(x.shape[1]))


def write_shard(
    path: Path,
    seq_ids: np.ndarray,
    splits: list[str],
    embeddings: np.ndarray,
    row_group_rows: int,
    word_idx: np.ndarray | None = None,
    hidden: Mapping[int, np.ndarray] | None = None,
) -> None:
    """Write one shard atomically; ``embeddings`` and every ``hidden[K]`` are (rows, dim) float32."""
    hidden = dict(sorted((hidden or {}).items()))
    arrays = [pa.array(seq_ids, type=pa.int64())]
    if word_idx is not None:
        arrays.append(pa.array(word_idx, type=pa.int32()))
    arrays += [pa.array(splits, type=pa.string()), _vectors(embeddings)]
    arrays += [_vectors(x) for x in hidden.values()]
    table = pa.Table.from_arrays(arrays, schema=shard_schema(embeddings.shape[1], word_idx is not None, hidden))
    with atomic_path(path) as tmp:
        # Dictionary encoding only where values repeat: on float vectors pyarrow builds a
        # dictionary page per row group before falling back to plain, and kept it in the file
        # (+60 % bytes, and every read hashes and parses them).
        pq.write_table(table, tmp, row_group_size=max(1, row_group_rows), compression="lz4",
                       use_dictionary=["split", "word_idx"])


@dataclass(frozen=True)
class Shard:
    seq_id: np.ndarray  # (rows,) int64
    split: np.ndarray  # (rows,) object (str)
    embedding: np.ndarray  # (rows, dim) float32
    word_idx: np.ndarray | None = None  # (rows,) int32 with granularity word
    columns: dict[str, np.ndarray] = field(default_factory=dict)  # every vector column read, by name


def _read_vectors(table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name).combine_chunks()
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return values.reshape(-1, column.type.list_size)


def read_shard(path: Path, columns: Sequence[str] = ("embedding",), data: bytes | None = None) -> Shard:
    """Read a shard's keys and the named vector columns (``embedding`` and/or ``hidden_K``);
    from ``data``, the file's bytes already in memory, when given (``path`` then only names it)."""
    def source():
        return path if data is None else pa.BufferReader(data)

    names = pq.read_schema(source()).names
    missing = [c for c in columns if c not in names]
    if missing:
        raise ShardError(f"{path} has no column {missing}; it holds {names}")
    keys = ["seq_id", "split"] + (["word_idx"] if "word_idx" in names else [])
    table = pq.read_table(source(), columns=list(dict.fromkeys([*keys, *columns])))
    vectors = {c: _read_vectors(table, c) for c in columns}
    return Shard(
        seq_id=table.column("seq_id").to_numpy(),
        split=np.asarray(table.column("split").to_pylist(), dtype=object),
        embedding=vectors[columns[0]] if columns else np.zeros((table.num_rows, 0), np.float32),
        word_idx=table.column("word_idx").to_numpy() if "word_idx" in names else None,
        columns=vectors,
    )


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    write_text(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def shard_entry(folder: Path, file: str, rows: int, sequences: int | None = None) -> dict[str, Any]:
    """A manifest's record of one shard: ``sequences`` it covers (= rows unless rows are words)."""
    return {"file": file, "rows": int(rows), "sequences": int(rows if sequences is None else sequences),
            "sha256": sha256_file(folder / file)}


def read_manifest(folder: str | Path) -> dict[str, Any]:
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ShardError(
            f"{folder} has no {MANIFEST}: the embed step did not finish; rerun it (snakemake {path})"
        )
    manifest = json.loads(path.read_text(encoding="utf-8"))
    version = manifest.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ShardError(
            f"{path}: schema_version {version} but this lmdecomp reads version {SCHEMA_VERSION}; "
            f"delete {folder} and rerun the embed step"
        )
    return manifest


def iter_shards(
    folder: str | Path, verify: bool = True, columns: Sequence[str] = ("embedding",), indices: range | None = None
) -> Iterator[Shard]:
    """Yield a model's shards in order (the named vector columns; the shards at ``indices``
    only, if given), checking each against the manifest first."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    entries = manifest["shards"]
    for entry in entries if indices is None else [entries[i] for i in indices]:
        path = folder / entry["file"]
        if not path.is_file():
            raise ShardError(f"{path} is listed in the manifest but missing; rerun the embed step")
        # One read: the bytes that are hashed are the bytes that are parsed (reading the file
        # again for Parquet cost as much as the check itself).
        data = path.read_bytes()
        if verify and hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise ShardError(
                f"{path} is corrupt or truncated (sha256 differs from {MANIFEST}); "
                f"delete {folder} and rerun the embed step"
            )
        shard = read_shard(path, columns, data)
        for name, x in shard.columns.items():
            if x.shape != (entry["rows"], manifest["dim"]):
                raise ShardError(f"{path}: column {name} is {x.shape[0]} × {x.shape[1]}, "
                                 f"manifest says {entry['rows']} × {manifest['dim']}")
            check_finite(manifest["model"], shard.seq_id, x)
        yield shard
