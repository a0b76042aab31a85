"""Embedding extraction: sequences → pooled hidden states of one layer → Parquet shards.

Work is done shard by shard (``shard_rows`` sequences in ``seq_id`` order), so memory is
bounded by one shard whatever the corpus size. Inside a shard, sequences are sorted by
length and cut into batches under a token budget (``batch_tokens`` = rows × padded
length), which keeps padding – wasted work – small; results are put back in ``seq_id``
order before writing. Finished shards survive a killed job: a rerun with the same plan
reuses them and embeds only what is missing.

Pooling of the hidden states h_1..h_n of the n real tokens (special tokens included):

* ``mean``        (1/n) Σ_t h_t                       — the default
* ``padded_mean`` (1/L) Σ_t h_t with L = ``max_length``, the padded length; the paper's
  code averaged over a batch padded to a fixed length this way
* ``cls``         h_1
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from . import shards
from .atomic import write_text
from .models import ModelRef, weights_sha256

POOLINGS = ("mean", "padded_mean", "cls")
PLAN = ".plan.json"


class EmbedError(ValueError):
    """Bad embedding settings for a model."""


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str, max_length: int) -> torch.Tensor:
    """Pool (batch, tokens, dim) hidden states over the tokens where ``mask`` is 1."""
    if pooling == "cls":
        return hidden[:, 0]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * m).sum(dim=1)
    if pooling == "mean":
        return summed / m.sum(dim=1).clamp(min=1)
    if pooling == "padded_mean":
        return summed / max_length
    raise EmbedError(f"unknown pooling {pooling!r}; choose one of {POOLINGS}")


def token_budget_batches(lengths: np.ndarray, batch_tokens: int) -> Iterator[np.ndarray]:
    """Indices of length-sorted batches whose padded size rows × max_len ≤ ``batch_tokens``.

    Sorting by decreasing length makes the first row of each batch its longest, so the
    padded size is known when the batch is opened; a single over-long row still forms a batch.
    """
    order = np.argsort(-lengths, kind="stable")
    start = 0
    while start < len(order):
        longest = int(lengths[order[start]])
        rows = max(1, batch_tokens // max(longest, 1))
        yield order[start : start + rows]
        start += rows


def model_max_length(model, tokenizer, wanted: int) -> int:
    limits = [wanted]
    if 0 < getattr(tokenizer, "model_max_length", 0) < 100_000:
        limits.append(int(tokenizer.model_max_length))
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions:
        # RoBERTa-style models reserve padding_idx + 1 positions.
        offset = (getattr(model.config, "pad_token_id", 0) or 0) + 1 if model.config.model_type in ("roberta", "xlm-roberta", "longformer") else 0
        limits.append(int(positions) - offset)
    return min(limits)


def _iter_chunks(sequences: Path, rows: int) -> Iterator[pa.Table]:
    """Re-chunk the sequences table into tables of exactly ``rows`` rows (the last may be short)."""
    pending: list[pa.RecordBatch] = []
    have = 0
    for batch in pq.ParquetFile(sequences).iter_batches(batch_size=rows, columns=["seq_id", "split", "text"]):
        pending.append(batch)
        have += batch.num_rows
        while have >= rows:
            table = pa.Table.from_batches(pending)
            yield table.slice(0, rows)
            rest = table.slice(rows)
            pending, have = rest.to_batches(), rest.num_rows
    if have:
        yield pa.Table.from_batches(pending)


def _plan(ref: ModelRef, cfg: Mapping[str, Any], max_length: int, sequences: Path) -> dict[str, Any]:
    from .atomic import sha256_file

    return {
        "model": ref.name,
        "source": ref.source,
        "layer": cfg["layer"],
        "pooling": cfg["pooling"],
        "max_length": max_length,
        "shard_rows": cfg["shard_rows"],
        "dtype": cfg.get("dtype", "float32"),
        "sequences_sha256": sha256_file(sequences),
    }


def embed_model(
    ref: ModelRef,
    sequences: str | Path,
    out_dir: str | Path,
    cfg: Mapping[str, Any],
    progress: bool = True,
) -> dict[str, Any]:
    """Embed every sequence with one model and write shards plus the manifest; return the manifest."""
    sequences, out_dir = Path(sequences), Path(out_dir)
    pooling = cfg["pooling"]
    if pooling not in POOLINGS:
        raise EmbedError(f"embed.pooling is {pooling!r}; choose one of {POOLINGS}")
    threads = int(cfg.get("threads") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    device = pick_device(cfg.get("device", "auto"))
    dtype = cfg.get("dtype", "float32")

    tokenizer = ref.load_tokenizer()
    model = ref.load_model().to(device)
    n_states = model.config.num_hidden_layers + 1
    layer = int(cfg["layer"])
    if not -n_states <= layer < n_states:
        raise EmbedError(
            f"model {ref.name!r}: embed.layer={layer} but the model has {n_states} hidden states "
            f"(0 = embeddings … {n_states - 1} = last layer; negative counts from the end)"
        )
    max_length = model_max_length(model, tokenizer, int(cfg["max_length"]))
    plan = _plan(ref, cfg, max_length, sequences)

    out_dir.mkdir(parents=True, exist_ok=True)
    plan_path = out_dir / PLAN
    if not plan_path.is_file() or json.loads(plan_path.read_text()) != plan:
        # Shards left by a different plan are not resumable: start clean.
        for stale in out_dir.glob("part-*.parquet"):
            stale.unlink()
        (out_dir / shards.MANIFEST).unlink(missing_ok=True)
        write_text(plan_path, json.dumps(plan, indent=2, sort_keys=True))
    (out_dir / shards.MANIFEST).unlink(missing_ok=True)

    total_rows = pq.ParquetFile(sequences).metadata.num_rows
    bar = tqdm(total=total_rows, desc=f"embed {ref.name}", unit="seq", disable=not progress)
    entries, tokens, truncated, dim = [], 0, 0, None
    split_counts: dict[str, int] = {}
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()
    for index, chunk in enumerate(_iter_chunks(sequences, int(cfg["shard_rows"]))):
        seq_ids = chunk.column("seq_id").to_numpy()
        splits = chunk.column("split").to_pylist()
        texts = chunk.column("text").to_pylist()
        for s in splits:
            split_counts[s] = split_counts.get(s, 0) + 1
        full = tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
        truncated += sum(len(ids) > max_length for ids in full)
        encoded = tokenizer(texts, truncation=True, max_length=max_length)
        lengths = np.array([len(ids) for ids in encoded["input_ids"]])
        tokens += int(lengths.sum())
        name = shards.shard_name(index)
        path = out_dir / name
        if path.is_file() and _reusable(path, seq_ids):
            dim = shards.read_shard(path).embedding.shape[1]
            entries.append(shards.shard_entry(out_dir, name, len(seq_ids)))
            bar.update(len(seq_ids))
            continue
        pooled: np.ndarray | None = None
        with torch.inference_mode(), amp:
            for rows in token_budget_batches(lengths, int(cfg["batch_tokens"])):
                features = tokenizer.pad(
                    {k: [encoded[k][i] for i in rows] for k in encoded.keys()}, return_tensors="pt"
                )
                features = {k: v.to(device) for k, v in features.items()}
                out = model(**features, output_hidden_states=True)
                vectors = pool(out.hidden_states[layer].float(), features["attention_mask"], pooling, max_length)
                if pooled is None:
                    dim = vectors.shape[1]
                    pooled = np.empty((len(texts), dim), dtype=np.float32)
                pooled[rows] = vectors.cpu().numpy()
                bar.update(len(rows))
        shards.check_finite(ref.name, seq_ids, pooled)
        shards.write_shard(path, seq_ids, splits, pooled, int(cfg["batch_tokens"]) // max(int(lengths.max()), 1))
        entries.append(shards.shard_entry(out_dir, name, len(seq_ids)))
    bar.close()
    if not entries:
        raise EmbedError(f"{sequences} holds no sequences")

    manifest = {
        "schema_version": shards.SCHEMA_VERSION,
        "model": ref.name,
        "source": ref.source,
        "revision": ref.revision,
        "weights_sha256": weights_sha256(model),
        "layer": layer,
        "pooling": pooling,
        "max_length": max_length,
        "dtype": dtype,
        "dim": int(dim),
        "rows": int(sum(e["rows"] for e in entries)),
        "tokens": tokens,
        "truncated_sequences": int(truncated),
        "split_counts": dict(sorted(split_counts.items())),
        "shards": entries,
    }
    shards.write_manifest(out_dir, manifest)
    return manifest


def _reusable(path: Path, seq_ids: np.ndarray) -> bool:
    """A shard from an earlier run is reused if it reads back whole with the expected ids."""
    try:
        existing = pq.read_table(path, columns=["seq_id"]).column("seq_id").to_numpy()
    except (OSError, pa.ArrowException):
        return False
    return np.array_equal(existing, seq_ids)
