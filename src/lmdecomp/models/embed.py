"""Embedding extraction: sequences → pooled hidden states of chosen layers → Parquet shards.

Work is done shard by shard (``shard_rows`` sequences in ``seq_id`` order), so memory is
bounded by one shard whatever the corpus size. Inside a shard, sequences are sorted by
length and cut into batches under a token budget (``batch_tokens`` = rows × padded
length), which keeps padding – wasted work – small; results are put back in ``seq_id``
order before writing. Finished shards survive a killed job: a rerun with the same plan
reuses them and embeds only what is missing.

A text longer than the model's ``max_length`` is cut into consecutive windows of at most
``max_length`` tokens, each with the model's special tokens (``overflow: windows``, the
default for mean pooling), and pooled over the tokens of all its windows, so every model
embeds the whole text whatever its tokenizer's length for it; ``overflow: truncate`` keeps the
first window only (the only choice for ``cls`` and ``padded_mean``). The manifest counts the
windowed and the truncated texts.

Pooling of the hidden states h_1..h_n of the n real tokens (special tokens included):

* ``mean``        (1/n) Σ_t h_t                       — the default
* ``padded_mean`` (1/L) Σ_t h_t with L = ``max_length``, the padded length; the paper's
  code averaged over a batch padded to a fixed length this way
* ``cls``         h_1

With ``granularity: word`` a row is a word instead of a sequence: the mean of the states of
the word's subword tokens, words cut by one fixed pre-tokenizer for every model (see
:mod:`lmdecomp.words`), so rows (seq_id, word_idx) line up across tokenizers. Words a model's
tokenizer truncated away are missing from its shards; the LMD stage keeps the words every
model has and reports how many it dropped.

``layer`` is the hidden state in the ``embedding`` column (0 = embeddings, −1 = last layer);
``layers`` (a list, or ``all``) stores further hidden states as ``hidden_K`` columns, for
layer-wise LMD. They come from the same forward pass, so they cost only the pooling.
"""

from __future__ import annotations

import hashlib
import json
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from lmdecomp.atomic import replace_dir, stale_temps_in, write_text
from lmdecomp.data import shards, words
from lmdecomp.models.attention import prefer_blocked_attention, use_blocked_attention
from lmdecomp.models.sources import ModelRef, weights_sha256

POOLINGS = ("mean", "padded_mean", "cls")
GRANULARITIES = ("sequence", "word")
OVERFLOWS = ("windows", "truncate")
DTYPES = ("float32", "bfloat16")
PLAN = ".plan.json"
FINISHED = ".finished.json"  # {shard file: sha256} of the shards written so far under PLAN


class EmbedError(ValueError):
    """Bad embedding settings for a model."""


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pool_parts(hidden: torch.Tensor, mask: torch.Tensor, pooling: str, max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(numerator, denominator) per row of (batch, tokens, dim) ``hidden``, over the tokens where
    ``mask`` is 1; a text's pooled vector is Σ numerators / Σ denominators over its windows."""
    ones = torch.ones(hidden.shape[0], dtype=hidden.dtype, device=hidden.device)
    if pooling == "cls":
        return hidden[:, 0], ones
    m = mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * m).sum(dim=1)
    if pooling == "mean":
        return summed, m.sum(dim=(1, 2))
    if pooling == "padded_mean":
        return summed / max_length, ones
    raise EmbedError(f"unknown pooling {pooling!r}; choose one of {POOLINGS}")


class SequencePooler:
    """One row per text: Σ numerator / Σ denominator of :func:`pool_parts` over its pieces."""

    def __init__(self, n_texts: int, stored: tuple[int, ...], pooling: str, max_length: int, device: torch.device):
        self.n_texts, self.stored, self.pooling, self.max_length, self.device = n_texts, stored, pooling, max_length, device
        self.numerators: dict[int, torch.Tensor] = {}
        self.denominators = torch.zeros(n_texts, device=device)

    def add(self, pieces: np.ndarray, texts: np.ndarray, hidden: tuple[torch.Tensor, ...], mask: torch.Tensor) -> None:
        """Pool one batch: row j is piece ``pieces[j]`` of text ``texts[j]``."""
        text_of_row = torch.as_tensor(texts, device=self.device)
        for k in self.stored:
            numerator, denominator = pool_parts(hidden[k].float(), mask, self.pooling, self.max_length)
            if k not in self.numerators:
                self.numerators[k] = torch.zeros(self.n_texts, numerator.shape[1], device=self.device)
            self.numerators[k].index_add_(0, text_of_row, numerator)
        self.denominators.index_add_(0, text_of_row, denominator)

    def finish(self) -> tuple[dict[int, np.ndarray], np.ndarray, None]:
        """({hidden-state index: (texts, dim)}, rows per text, no word indices)."""
        scale = self.denominators.clamp(min=1).unsqueeze(1)
        return ({k: (v / scale).cpu().numpy() for k, v in self.numerators.items()},
                np.ones(self.n_texts, dtype=np.int64), None)


class WordPooler:
    """One row per covered word of each text: the mean of the states of the word's tokens, over
    all the text's pieces (a word cut by a window boundary collects tokens from both windows)."""

    def __init__(self, spans: list[np.ndarray], offsets: list, cut: list[int | None], stored: tuple[int, ...],
                 device: torch.device):
        self.spans, self.offsets, self.cut, self.stored, self.device = spans, offsets, cut, stored, device
        self.sums: list[dict[int, torch.Tensor]] = [{} for _ in spans]
        self.counts = [np.zeros(len(s), np.int64) for s in spans]

    def add(self, pieces: np.ndarray, texts: np.ndarray, hidden: tuple[torch.Tensor, ...], mask: torch.Tensor) -> None:
        states = {k: hidden[k].float() for k in self.stored}
        for j, (piece, i) in enumerate(zip(pieces, texts)):
            word, token = words.token_word_pairs(self.spans[i], self.offsets[piece], self.cut[piece])
            word_t, token_t = torch.as_tensor(word, device=self.device), torch.as_tensor(token, device=self.device)
            for k in self.stored:
                if k not in self.sums[i]:
                    self.sums[i][k] = torch.zeros(len(self.spans[i]), states[k].shape[-1], device=self.device)
                self.sums[i][k].index_add_(0, word_t, states[k][j, token_t])
            self.counts[i] += np.bincount(word, minlength=len(self.spans[i]))

    def finish(self) -> tuple[dict[int, np.ndarray], np.ndarray, list[np.ndarray]]:
        """({hidden-state index: (words, dim)}, rows per text, covered word indices per text)."""
        word_ids = [np.flatnonzero(c) for c in self.counts]
        columns = {}
        for k in self.stored:
            parts = []
            for i, ids in enumerate(word_ids):  # every text has ≥ 1 piece, so sums[i] holds k
                counts = torch.as_tensor(self.counts[i][ids], device=self.device).unsqueeze(1)
                parts.append((self.sums[i][k][torch.as_tensor(ids, device=self.device)] / counts).cpu().numpy())
            columns[k] = np.concatenate(parts)
        return columns, np.array([len(w) for w in word_ids]), word_ids


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


def stored_layers(cfg: Mapping[str, Any], n_states: int, model: str) -> tuple[int, list[int]]:
    """(main layer, further layers) as hidden-state indices in [0, n_states): ``embed.layer``
    and the others of ``embed.layers`` (a list of indices, negative from the end, or ``all``)."""

    def index(layer: Any, key: str) -> int:
        if isinstance(layer, bool) or not isinstance(layer, int) or not -n_states <= layer < n_states:
            raise EmbedError(
                f"model {model!r}: {key}={layer!r} but the model has {n_states} hidden states "
                f"(0 = embeddings … {n_states - 1} = last layer; negative counts from the end)"
            )
        return layer % n_states

    main = index(cfg["layer"], "embed.layer")
    spec = cfg.get("layers")
    if spec is None:
        wanted: list[int] = []
    elif spec == "all":
        wanted = list(range(n_states))
    elif isinstance(spec, list):
        wanted = [index(k, "embed.layers") for k in spec]
    else:
        raise EmbedError(f"embed.layers is {spec!r}; give a list of hidden-state indices or 'all'")
    return main, sorted(set(wanted) - {main})


def truncated_rows(tokenizer, texts: list[str], encoded, max_length: int) -> list[bool]:
    """Which texts ``encoded`` (tokenised with truncation at ``max_length``) had to cut."""
    if encoded.encodings is not None:
        # a Rust tokenizer keeps what truncation removed: no second tokenisation needed
        return [bool(e.overflowing) for e in encoded.encodings]
    full = tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
    return [len(ids) > max_length for ids in full]


def cut_points(encoded) -> list[int | None]:
    """Per text of ``encoded`` (a fast tokenizer's, truncated at ``max_length``), the character
    where truncation cut it (:func:`lmdecomp.words.cut_point`), or None when it kept it whole."""
    return [words.cut_point(e.overflowing[0].offsets) if e.overflowing else None for e in encoded.encodings]


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


def _plan(ref: ModelRef, cfg: Mapping[str, Any], max_length: int, sequences: Path, attention: str,
          overflow: str, weights: str, device: torch.device) -> dict[str, Any]:
    """Everything a shard's bytes depend on: shards of another plan are not resumed. That
    includes the device and the thread count (the reduction order of the matmuls: 1 and 2
    threads differ by ~5e-7), so ``device: auto`` never mixes CPU and GPU shards."""
    from lmdecomp.atomic import sha256_file

    return {
        "model": ref.name,
        "source": ref.source,
        "weights_sha256": weights,
        "batch_tokens": cfg["batch_tokens"],  # sets the padding and the Parquet row groups
        "layer": cfg["layer"],
        "layers": cfg.get("layers"),
        "granularity": cfg.get("granularity", "sequence"),
        "pooling": cfg["pooling"],
        "max_length": max_length,
        "overflow": overflow,
        "shard_rows": cfg["shard_rows"],
        "dtype": cfg.get("dtype", "float32"),
        "attention": attention,
        "sequences_sha256": sha256_file(sequences),
        "device": str(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
    }


def embed_model(
    ref: ModelRef,
    sequences: str | Path,
    out_dir: str | Path,
    cfg: Mapping[str, Any],
    progress: bool = True,
    work_dir: str | Path | None = None,
    expected_weights: str | None = None,
) -> dict[str, Any]:
    """Embed every sequence with one model and write shards plus the manifest; return the manifest.

    Shards are written one by one (atomically) and a rerun of the same plan reuses the
    finished ones. With ``work_dir`` they are written there and the finished folder is
    renamed to ``out_dir`` at the end: the workflow engines delete a job's output folder
    before running it, so a killed job's shards survive only outside it.
    ``expected_weights``: the sha256 the model stage recorded; other weights are an error.
    """
    sequences, final_dir = Path(sequences), Path(out_dir)
    out_dir = Path(work_dir) if work_dir is not None else final_dir
    pooling = cfg["pooling"]
    if pooling not in POOLINGS:
        raise EmbedError(f"embed.pooling is {pooling!r}; choose one of {POOLINGS}")
    threads = int(cfg.get("threads") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    device = pick_device(cfg.get("device", "auto"))
    dtype = cfg.get("dtype", "float32")
    if dtype not in DTYPES:
        raise EmbedError(f"embed.dtype is {dtype!r}; choose one of {DTYPES} (float32 is the reproducible default)")

    granularity = cfg.get("granularity", "sequence")
    if granularity not in GRANULARITIES:
        raise EmbedError(f"embed.granularity is {granularity!r}; choose one of {GRANULARITIES}")
    if granularity == "word" and pooling != "mean":
        raise EmbedError(f"embed.granularity: word averages each word's tokens; embed.pooling must be "
                         f"mean (got {pooling!r})")

    overflow = cfg.get("overflow") or ("windows" if pooling == "mean" else "truncate")
    if overflow not in OVERFLOWS:
        raise EmbedError(f"embed.overflow is {overflow!r}; choose one of {OVERFLOWS}")
    if overflow == "windows" and pooling != "mean":
        raise EmbedError(f"embed.overflow: windows averages the tokens of every window and needs embed.pooling: "
                         f"mean (got {pooling!r}); set embed.overflow: truncate to keep the first window only")
    windows = overflow == "windows"

    tokenizer = ref.load_tokenizer()
    if windows and not tokenizer.is_fast:
        raise EmbedError(f"model {ref.name!r}: embed.overflow: windows needs a fast tokenizer (tokenizer.json); "
                         "save the model with one or set embed.overflow: truncate")
    if granularity == "word" and not tokenizer.is_fast:
        raise EmbedError(f"model {ref.name!r}: word granularity needs a fast tokenizer (character offsets); "
                         "save the model with a tokenizer.json")
    model = ref.load_model().to(device)
    if dtype == "bfloat16" and device.type == "cpu":
        if prefer_blocked_attention():  # faster than SDPA at small heads without AMX; see lmdecomp.attention
            use_blocked_attention(model)
    attention = str(model.config._attn_implementation)
    n_states = model.config.num_hidden_layers + 1
    layer, extra_layers = stored_layers(cfg, n_states, ref.name)
    max_length = model_max_length(model, tokenizer, int(cfg["max_length"]))
    weights = weights_sha256(model)
    if expected_weights is not None and weights != expected_weights:
        raise EmbedError(
            f"model {ref.name!r}: its weights (sha256 {weights[:12]}…) are not the ones the model stage recorded "
            f"({expected_weights[:12]}…); its source changed since (a new package version, edited files): "
            f"rerun the model stage (snakemake --forcerun model) or restore the source")
    plan = _plan(ref, cfg, max_length, sequences, attention, overflow, weights, device)

    out_dir.mkdir(parents=True, exist_ok=True)
    for temp in stale_temps_in(out_dir):  # a killed job's half-written files (SIGKILL skips cleanup)
        temp.unlink()
    plan_path, finished_path = out_dir / PLAN, out_dir / FINISHED
    if not plan_path.is_file() or json.loads(plan_path.read_text()) != plan:
        # Shards left by a different plan are not resumable: start clean.
        for stale in out_dir.glob("part-*.parquet"):
            stale.unlink()
        finished_path.unlink(missing_ok=True)
        write_text(plan_path, json.dumps(plan, indent=2, sort_keys=True))
    (out_dir / shards.MANIFEST).unlink(missing_ok=True)
    finished = json.loads(finished_path.read_text()) if finished_path.is_file() else {}

    total_rows = pq.ParquetFile(sequences).metadata.num_rows
    bar = tqdm(total=total_rows, desc=f"embed {ref.name}", unit="seq", disable=not progress)
    entries, tokens, truncated, windowed, n_words, words_cut, dim = [], 0, 0, 0, 0, 0, None
    split_counts: dict[str, int] = {}
    amp = torch.autocast(device.type, dtype=torch.bfloat16) if dtype == "bfloat16" else nullcontext()
    for index, chunk in enumerate(_iter_chunks(sequences, int(cfg["shard_rows"]))):
        seq_ids = chunk.column("seq_id").to_numpy()
        splits = chunk.column("split").to_pylist()
        texts = chunk.column("text").to_pylist()
        for s in splits:
            split_counts[s] = split_counts.get(s, 0) + 1
        # One row ("piece") per text, or per window of a text with overflow: windows (stride 0:
        # the windows tile the text without overlap, each with its own special tokens).
        encoded = tokenizer(texts, truncation=True, max_length=max_length,
                            return_offsets_mapping=granularity == "word", return_overflowing_tokens=windows)
        if windows:
            owner = np.asarray(encoded.pop("overflow_to_sample_mapping"), dtype=np.int64)
            cut_at = [None] * len(owner)
            windowed += int(np.sum(np.bincount(owner, minlength=len(texts)) > 1))
        else:
            owner = np.arange(len(texts))
            cut = truncated_rows(tokenizer, texts, encoded, max_length)
            truncated += sum(cut)
            cut_at = cut_points(encoded) if granularity == "word" else None
        lengths = np.array([len(ids) for ids in encoded["input_ids"]])
        tokens += int(lengths.sum())
        spans = [words.word_spans(t) for t in texts] if granularity == "word" else None
        if spans is not None:
            n_words += sum(len(s) for s in spans)
            if not windows:  # (windows cut no word off: a word split by a window boundary keeps both parts)
                words_cut += sum(int(words.words_cut_off(s, c).sum()) for s, c in zip(spans, cut_at))
        name = shards.shard_name(index)
        path = out_dir / name
        existing = _reusable(path, seq_ids, finished.get(name))
        if existing is not None:
            dim = existing.embedding.shape[1]
            entries.append(shards.shard_entry(out_dir, name, len(existing.seq_id), len(seq_ids)))
            bar.update(len(seq_ids))
            continue
        pooler = (SequencePooler(len(texts), (layer, *extra_layers), pooling, max_length, device)
                  if granularity == "sequence" else
                  WordPooler(spans, encoded["offset_mapping"], cut_at, (layer, *extra_layers), device))
        pieces_left = np.bincount(owner, minlength=len(texts))
        with torch.inference_mode(), amp:
            for rows in token_budget_batches(lengths, int(cfg["batch_tokens"])):
                features = tokenizer.pad(
                    {k: [encoded[k][i] for i in rows] for k in encoded.keys() if k != "offset_mapping"},
                    return_tensors="pt",
                )
                features = {k: v.to(device) for k, v in features.items()}
                hidden = model(**features, output_hidden_states=True).hidden_states
                pooler.add(rows, owner[rows], hidden, features["attention_mask"])
                np.subtract.at(pieces_left, owner[rows], 1)
                bar.update(int(np.sum(pieces_left[np.unique(owner[rows])] == 0)))
        columns, rows_per_seq, word_ids = pooler.finish()
        columns = {k: x.astype(np.float32) for k, x in columns.items()}
        dim = columns[layer].shape[1]
        row_seq = np.repeat(seq_ids, rows_per_seq)
        for k, x in columns.items():
            shards.check_finite(ref.name, row_seq, x)
        shards.write_shard(
            path, row_seq, list(np.repeat(np.asarray(splits, dtype=object), rows_per_seq)), columns[layer],
            int(cfg["batch_tokens"]) // max(int(lengths.max()), 1),
            word_idx=np.concatenate(word_ids) if granularity == "word" else None,
            hidden={k: columns[k] for k in extra_layers},
        )
        entries.append(shards.shard_entry(out_dir, name, len(row_seq), len(seq_ids)))
        finished[name] = entries[-1]["sha256"]
        write_text(finished_path, json.dumps(finished, indent=2, sort_keys=True))
    bar.close()
    if not entries:
        raise EmbedError(f"{sequences} holds no sequences")

    rows = int(sum(e["rows"] for e in entries))
    manifest = {
        "schema_version": shards.SCHEMA_VERSION,
        "model": ref.name,
        "source": ref.source,
        "revision": ref.revision,
        "weights_sha256": weights,
        "layer": layer,
        "layers": sorted([layer, *extra_layers]),
        "num_hidden_layers": n_states - 1,
        "granularity": granularity,
        "pooling": pooling,
        "max_length": max_length,
        "dtype": dtype,
        "attention": attention,
        "dim": int(dim),
        "rows": rows,
        "sequences": int(sum(e["sequences"] for e in entries)),
        "tokens": tokens,
        "overflow": overflow,
        "truncated_sequences": int(truncated),
        "windowed_sequences": int(windowed),
        "split_counts": dict(sorted(split_counts.items())),
        "shards": entries,
    }
    if granularity == "word":
        manifest["words"] = int(n_words)
        manifest["words_truncated"] = int(words_cut)  # cut into or off by truncation at max_length
        manifest["words_without_tokens"] = int(n_words - rows - words_cut)  # e.g. characters the normaliser deletes
    shards.write_manifest(out_dir, manifest)
    if out_dir != final_dir:
        replace_dir(out_dir, final_dir)
    return manifest


def _reusable(path: Path, seq_ids: np.ndarray, sha256: str | None) -> shards.Shard | None:
    """A shard from an earlier run of the same plan, if its bytes are the ones that run recorded
    (``sha256``, from :data:`FINISHED`: a damaged file can still parse, into wrong numbers) and it
    holds rows of exactly this chunk's sequences (every one of them, for sequence rows)."""
    if sha256 is None or not path.is_file():
        return None
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        return None
    try:
        existing = shards.read_shard(path, data=data)
    except (OSError, pa.ArrowException, shards.ShardError):
        return None
    ids = existing.seq_id
    if existing.word_idx is None:
        return existing if np.array_equal(ids, seq_ids) else None
    return existing if len(ids) and np.isin(ids, seq_ids).all() else None
