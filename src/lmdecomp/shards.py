"""Embedding shards: the one writer and the one reader of ``results/embeddings/{model}/``.

A model's folder holds ``part-NNNNN.parquet`` files with columns

    seq_id     int64
    split      string
    embedding  fixed_size_list<float32>[dim]

and ``manifest.json`` (model, source, revision, weights hash, layer, pooling, dim, rows,
tokens, ``schema_version``, and per shard its file name, rows and sha256). Shards are
written atomically and the manifest last, so a folder without a manifest is unfinished.
Readers verify every shard against the manifest's checksum before using it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .atomic import atomic_path, sha256_file, write_text

SCHEMA_VERSION = 1
MANIFEST = "manifest.json"


class ShardError(ValueError):
    """An embedding folder is missing, unfinished, corrupt or inconsistent."""


def shard_schema(dim: int) -> pa.Schema:
    return pa.schema(
        [
            ("seq_id", pa.int64()),
            ("split", pa.string()),
            ("embedding", pa.list_(pa.float32(), dim)),
        ]
    )


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


def write_shard(path: Path, seq_ids: np.ndarray, splits: list[str], embeddings: np.ndarray, row_group_rows: int) -> None:
    """Write one shard atomically; ``embeddings`` is (rows, dim) float32."""
    rows, dim = embeddings.shape
    flat = pa.array(np.ascontiguousarray(embeddings, dtype=np.float32).reshape(-1))
    table = pa.Table.from_arrays(
        [
            pa.array(seq_ids, type=pa.int64()),
            pa.array(splits, type=pa.string()),
            pa.FixedSizeListArray.from_arrays(flat, dim),
        ],
        schema=shard_schema(dim),
    )
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, row_group_size=max(1, row_group_rows), compression="zstd")


@dataclass(frozen=True)
class Shard:
    seq_id: np.ndarray  # (rows,) int64
    split: np.ndarray  # (rows,) object (str)
    embedding: np.ndarray  # (rows, dim) float32


def read_shard(path: Path) -> Shard:
    table = pq.read_table(path)
    column = table.column("embedding").combine_chunks()
    dim = column.type.list_size
    values = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    return Shard(
        seq_id=table.column("seq_id").to_numpy(),
        split=np.asarray(table.column("split").to_pylist(), dtype=object),
        embedding=values.reshape(-1, dim),
    )


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    write_text(folder / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def shard_entry(folder: Path, file: str, rows: int) -> dict[str, Any]:
    return {"file": file, "rows": int(rows), "sha256": sha256_file(folder / file)}


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


def iter_shards(folder: str | Path, verify: bool = True) -> Iterator[Shard]:
    """Yield a model's shards in order, checking each against the manifest first."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    for entry in manifest["shards"]:
        path = folder / entry["file"]
        if not path.is_file():
            raise ShardError(f"{path} is listed in the manifest but missing; rerun the embed step")
        if verify and sha256_file(path) != entry["sha256"]:
            raise ShardError(
                f"{path} is corrupt or truncated (sha256 differs from {MANIFEST}); "
                f"delete {folder} and rerun the embed step"
            )
        shard = read_shard(path)
        if len(shard.seq_id) != entry["rows"] or shard.embedding.shape[1] != manifest["dim"]:
            raise ShardError(f"{path} has {len(shard.seq_id)} rows × {shard.embedding.shape[1]}, "
                             f"manifest says {entry['rows']} × {manifest['dim']}")
        check_finite(manifest["model"], shard.seq_id, shard.embedding)
        yield shard
