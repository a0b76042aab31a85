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
first window only (the only choice for ``cls``, ``last`` and ``padded_mean``). The manifest
counts the windowed and the truncated texts.

Pooling of the hidden states of a text's tokens into a vector – ``mean`` (the default),
``padded_mean``, ``cls`` or ``last`` – is :mod:`lmdecomp.models.pooling`, with its formulas.
``mean`` averages every real token of the text, the tokenizer's own special tokens included:
BERT's [CLS] and [SEP], and for a decoder LLM Gemma's ``<bos>`` (SmolLM2's tokenizer adds none).
``last`` is the state of the last real token, the usual sentence vector of a decoder LLM (under
causal attention the one token that has seen the whole text; the end token if the tokenizer
appends one); like ``cls`` it is one token of one window, so it needs ``overflow: truncate``.

Batches are padded on the right, whatever side the tokenizer pads on (Gemma's pads on the left):
transformers' decoders number the positions of a row from its first column (the cache
position), not from the attention mask, so left padding shifts a text's positions. Rotary
positions (Llama, Gemma-3) only see position differences, so that changes their states by
rounding only (~1e-7), but learned absolute positions (GPT-2) change them outright, and ``cls``
would take a padding column. With right padding and causal attention, padding never reaches a
real token. The encoders' tokenizers pad on the right already: nothing changes for them.

With ``granularity: word`` a row is a word instead of a sequence: the mean of the states of
the word's subword tokens, words cut by one fixed pre-tokenizer for every model (see
:mod:`lmdecomp.data.words`), so rows (seq_id, word_idx) line up across tokenizers. Words a model's
tokenizer truncated away are missing from its shards; the LMD stage keeps the words every
model has and reports how many it dropped.

``layer`` is the hidden state in the ``embedding`` column (0 = embeddings, −1 = last layer);
``layers`` (a list, or ``all``) stores further hidden states as ``hidden_K`` columns, for
layer-wise LMD. They come from the same forward pass, so they cost only the pooling.

On the CPU the C heap gets a fixed policy (:mod:`lmdecomp.models.heap`): activations are reused
from the heap within a shard and its free pages go back to the kernel after every shard, so the
peak memory is bounded by a shard, not by the number of shards; the blocks too large for the
heap get transparent huge pages (a page fault per 2 MiB, not per 4 KiB), where this process has
not allocated a tensor yet.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm

from lmdecomp.atomic import replace_dir, stale_temps_in, write_text
from lmdecomp.data import shards, words
from lmdecomp.models.attention import cpu_has_native_bf16, prefer_blocked_attention, use_blocked_attention
from lmdecomp.models.heap import fixed_heap_policy, huge_pages_for_large_tensors, release_free
from lmdecomp.models.pooling import POOLINGS, SequencePooler, WordPooler
from lmdecomp.models.sources import ModelRef, weights_sha256

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


@dataclass(frozen=True)
class _Settings:
    """The checked ``embed`` settings that shape a run."""

    pooling: str
    device: torch.device
    dtype: str
    granularity: str
    overflow: str

    @property
    def windows(self) -> bool:
        return self.overflow == "windows"


@dataclass(frozen=True)
class _Loaded:
    """A model on its device with its tokenizer, and what the plan and the manifest record of it."""

    tokenizer: Any
    model: torch.nn.Module
    attention: str
    n_states: int  # hidden states: the embeddings, then one per layer
    layer: int
    extra_layers: list[int]
    max_length: int
    weights: str

    @property
    def stored(self) -> tuple[int, ...]:
        """The hidden states pooled: the main layer first."""
        return (self.layer, *self.extra_layers)


@dataclass(frozen=True)
class _Pieces:
    """One chunk's texts tokenised: a row ("piece") per text, or per window of a text."""

    encoded: Any  # the tokenizer's BatchEncoding, a row per piece
    owner: np.ndarray  # the text of each piece
    cut_at: list[int | None] | None  # per piece, the character where truncation cut its text (word rows)
    lengths: np.ndarray  # tokens per piece
    spans: list[np.ndarray] | None  # per text, its word spans (word rows)
    truncated: int  # texts truncation cut (overflow: truncate)
    windowed: int  # texts cut into more than one window (overflow: windows)


@dataclass
class _Tally:
    """What the manifest counts over all the shards, reused ones included."""

    tokens: int = 0
    truncated: int = 0
    windowed: int = 0
    n_words: int = 0
    words_cut: int = 0
    split_counts: dict[str, int] = field(default_factory=dict)

    def add(self, splits: list[str], pieces: _Pieces, windows: bool) -> None:
        for s in splits:
            self.split_counts[s] = self.split_counts.get(s, 0) + 1
        self.windowed += pieces.windowed
        self.truncated += pieces.truncated
        self.tokens += int(pieces.lengths.sum())
        if pieces.spans is not None:
            self.n_words += sum(len(s) for s in pieces.spans)
            if not windows:  # (windows cut no word off: a word split by a window boundary keeps both parts)
                self.words_cut += sum(int(words.words_cut_off(s, c).sum()) for s, c in zip(pieces.spans, pieces.cut_at))


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
    where truncation cut it (:func:`lmdecomp.data.words.cut_point`), or None when it kept it whole."""
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
    # every check before the first write: bad settings leave no folder behind
    settings = _settings(cfg)
    if settings.device.type == "cpu":
        # before the model's tensors (see lmdecomp.models.heap)
        fixed_heap_policy()
        huge_pages_for_large_tensors()
    lm = _load(ref, cfg, settings, expected_weights)
    plan = _plan(ref, cfg, lm.max_length, sequences, lm.attention, settings.overflow, lm.weights, settings.device)
    finished = _start_or_resume(out_dir, plan)
    with deterministic_on(settings.device):
        entries, tally, dim = _embed_shards(ref, sequences, out_dir, cfg, settings, lm, finished, progress)
    manifest = _manifest(ref, settings, lm, entries, tally, dim)
    shards.write_manifest(out_dir, manifest)
    if out_dir != final_dir:
        replace_dir(out_dir, final_dir)
    return manifest


@contextmanager
def deterministic_on(device: torch.device) -> Iterator[None]:
    """On CUDA, deterministic kernels for the extraction (the poolers' ``index_add_`` and cuBLAS
    reductions are not, by default); the CPU kernels used here already are. Restored after."""
    if device.type != "cuda":
        yield
        return
    # cuBLAS reads this when its handle is made, at the first matmul: here, before any
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    prev, prev_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)


def _settings(cfg: Mapping[str, Any]) -> _Settings:
    """Check the ``embed`` settings that need no model (and apply ``threads``)."""
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

    # only a mean over tokens can combine windows, so it is the one pooling that defaults to them
    overflow = cfg.get("overflow") or ("windows" if pooling == "mean" else "truncate")
    if overflow not in OVERFLOWS:
        raise EmbedError(f"embed.overflow is {overflow!r}; choose one of {OVERFLOWS}")
    if overflow == "windows" and pooling != "mean":
        raise EmbedError(f"embed.overflow: windows averages the tokens of every window and needs embed.pooling: "
                         f"mean (got {pooling!r}): cls, last and padded_mean are values of one window, and a window "
                         f"restarts a decoder's context, so the last window's last token has not seen the text "
                         f"before it; set embed.overflow: truncate to keep the first window only")
    return _Settings(pooling, device, dtype, granularity, overflow)


def _load(ref: ModelRef, cfg: Mapping[str, Any], settings: _Settings, expected_weights: str | None) -> _Loaded:
    """Load the tokenizer and the model onto the device, and check what needs them: the tokenizer
    kind, the layers, and the weights against ``expected_weights``."""
    tokenizer = ref.load_tokenizer()
    # transformers' decoders compute position ids from the cache position, not the attention mask:
    # a left-padded row (Gemma's tokenizer pads left) gets shifted positions, which changes the
    # states of learned absolute positions (GPT-2; rotary ones, Llama and Gemma-3, by rounding
    # only), and column 0 (cls) is padding. Right padding with causal attention never touches a
    # real token; encoders pad right already, so their results are unchanged.
    tokenizer.padding_side = "right"
    # windows and character offsets both come from a Rust ("fast") tokenizer's encodings
    if settings.windows and not tokenizer.is_fast:
        raise EmbedError(f"model {ref.name!r}: embed.overflow: windows needs a fast tokenizer (tokenizer.json); "
                         "save the model with one or set embed.overflow: truncate")
    if settings.granularity == "word" and not tokenizer.is_fast:
        raise EmbedError(f"model {ref.name!r}: word granularity needs a fast tokenizer (character offsets); "
                         "save the model with a tokenizer.json")
    model = ref.load_model().to(settings.device)
    if settings.dtype == "bfloat16" and settings.device.type == "cpu":
        if not cpu_has_native_bf16():
            warnings.warn(f"model {ref.name!r}: embed.dtype bfloat16 on a CPU without avx512_bf16 or AMX is "
                          "emulated (usually slower than float32); set embed.dtype: float32 (config/float32.yaml)",
                          stacklevel=2)
        if prefer_blocked_attention():  # faster than SDPA at small heads without AMX; see lmdecomp.models.attention
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
    return _Loaded(tokenizer, model, attention, n_states, layer, extra_layers, max_length, weights)


def _start_or_resume(out_dir: Path, plan: dict[str, Any]) -> dict[str, str]:
    """Ready ``out_dir`` for ``plan``; return the {shard file: sha256} of :data:`FINISHED`: the
    shards an earlier run of the same plan finished there, which may be reused."""
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
    (out_dir / shards.MANIFEST).unlink(missing_ok=True)  # written last: until then the folder is unfinished
    return json.loads(finished_path.read_text()) if finished_path.is_file() else {}


def _embed_shards(ref: ModelRef, sequences: Path, out_dir: Path, cfg: Mapping[str, Any], settings: _Settings,
                  lm: _Loaded, finished: dict[str, str], progress: bool) -> tuple[list[dict[str, Any]], _Tally, int]:
    """Embed the sequences shard by shard into ``out_dir``, reusing the ``finished`` shards and
    recording each new one there; return the shards' manifest entries, the counts and the dim."""
    total_rows = pq.ParquetFile(sequences).metadata.num_rows
    bar = tqdm(total=total_rows, desc=f"embed {ref.name}", unit="seq", disable=not progress)
    entries, tally, dim = [], _Tally(), None
    batch_tokens = int(cfg["batch_tokens"])
    amp = torch.autocast(settings.device.type, dtype=torch.bfloat16) if settings.dtype == "bfloat16" else nullcontext()
    for index, chunk in enumerate(_iter_chunks(sequences, int(cfg["shard_rows"]))):
        seq_ids = chunk.column("seq_id").to_numpy()
        splits = chunk.column("split").to_pylist()
        texts = chunk.column("text").to_pylist()
        # tokenised even when the shard is reused: the manifest counts its tokens and words
        pieces = _tokenize(lm, settings, texts)
        tally.add(splits, pieces, settings.windows)
        name = shards.shard_name(index)
        path = out_dir / name
        existing = _reusable(path, seq_ids, finished.get(name))
        if existing is not None:
            dim = existing.embedding.shape[1]
            entries.append(shards.shard_entry(out_dir, name, len(existing.seq_id), len(seq_ids)))
            bar.update(len(seq_ids))
            continue
        pooled = _embed_pieces(lm, settings, pieces, len(texts), batch_tokens, amp, bar)
        dim = pooled[0][lm.layer].shape[1]
        # a Parquet row group of about one batch of the chunk's longest pieces
        rows = _write_pooled(path, ref.name, settings, lm, seq_ids, splits, pooled,
                             batch_tokens // max(int(pieces.lengths.max()), 1))
        if settings.device.type == "cpu":
            release_free()  # the shard's activations and columns are free now (lmdecomp.models.heap)
        entries.append(shards.shard_entry(out_dir, name, rows, len(seq_ids)))
        # journalled after each shard, so a killed job resumes from the shards it finished
        finished[name] = entries[-1]["sha256"]
        write_text(out_dir / FINISHED, json.dumps(finished, indent=2, sort_keys=True))
    bar.close()
    if not entries:
        raise EmbedError(f"{sequences} holds no sequences")
    return entries, tally, dim


def _tokenize(lm: _Loaded, settings: _Settings, texts: list[str]) -> _Pieces:
    """Tokenise one chunk's texts into pieces of at most ``max_length`` tokens."""
    word_rows = settings.granularity == "word"
    # One row ("piece") per text, or per window of a text with overflow: windows (stride 0:
    # the windows tile the text without overlap, each with its own special tokens).
    encoded = lm.tokenizer(texts, truncation=True, max_length=lm.max_length,
                           return_offsets_mapping=word_rows, return_overflowing_tokens=settings.windows)
    truncated = windowed = 0
    if settings.windows:
        owner = np.asarray(encoded.pop("overflow_to_sample_mapping"), dtype=np.int64)
        cut_at = [None] * len(owner)
        windowed = int(np.sum(np.bincount(owner, minlength=len(texts)) > 1))
    else:
        owner = np.arange(len(texts))
        cut = truncated_rows(lm.tokenizer, texts, encoded, lm.max_length)
        truncated = sum(cut)
        cut_at = cut_points(encoded) if word_rows else None
    lengths = np.array([len(ids) for ids in encoded["input_ids"]])
    spans = [words.word_spans(t) for t in texts] if word_rows else None
    return _Pieces(encoded, owner, cut_at, lengths, spans, truncated, windowed)


def _embed_pieces(lm: _Loaded, settings: _Settings, pieces: _Pieces, n_texts: int, batch_tokens: int,
                  amp: AbstractContextManager, bar: tqdm) -> tuple[dict[int, np.ndarray], np.ndarray, list[np.ndarray] | None]:
    """Run the model on one chunk's pieces in token-budget batches and pool the stored hidden
    states: ({hidden-state index: float32 (rows, dim)}, rows per text, word indices per text or None)."""
    encoded, owner = pieces.encoded, pieces.owner
    pooler = (SequencePooler(n_texts, lm.stored, settings.pooling, lm.max_length, settings.device)
              if settings.granularity == "sequence" else
              WordPooler(pieces.spans, encoded["offset_mapping"], pieces.cut_at, lm.stored, settings.device))
    pieces_left = np.bincount(owner, minlength=n_texts)
    with torch.inference_mode(), amp:
        for rows in token_budget_batches(pieces.lengths, batch_tokens):
            features = lm.tokenizer.pad(
                {k: [encoded[k][i] for i in rows] for k in encoded.keys() if k != "offset_mapping"},
                return_tensors="pt",
            )
            features = {k: v.to(settings.device) for k, v in features.items()}
            hidden = lm.model(**features, output_hidden_states=True).hidden_states
            pooler.add(rows, owner[rows], hidden, features["attention_mask"])
            del hidden, features
            # the bar counts texts: a text is done with the batch that holds its last piece
            np.subtract.at(pieces_left, owner[rows], 1)
            bar.update(int(np.sum(pieces_left[np.unique(owner[rows])] == 0)))
    columns, rows_per_seq, word_ids = pooler.finish()
    return {k: x.astype(np.float32) for k, x in columns.items()}, rows_per_seq, word_ids


def _write_pooled(path: Path, model: str, settings: _Settings, lm: _Loaded, seq_ids: np.ndarray, splits: list[str],
                  pooled: tuple[dict[int, np.ndarray], np.ndarray, list[np.ndarray] | None], row_group_rows: int) -> int:
    """Write one chunk's pooled rows (from :func:`_embed_pieces`) as the shard ``path``, refusing
    non-finite vectors; return its number of rows."""
    columns, rows_per_seq, word_ids = pooled
    row_seq = np.repeat(seq_ids, rows_per_seq)
    for k, x in columns.items():
        shards.check_finite(model, row_seq, x)
    shards.write_shard(
        path, row_seq, list(np.repeat(np.asarray(splits, dtype=object), rows_per_seq)), columns[lm.layer],
        row_group_rows,
        word_idx=np.concatenate(word_ids) if settings.granularity == "word" else None,
        hidden={k: columns[k] for k in lm.extra_layers},
    )
    return len(row_seq)


def _manifest(ref: ModelRef, settings: _Settings, lm: _Loaded, entries: list[dict[str, Any]], tally: _Tally,
              dim: int) -> dict[str, Any]:
    """The manifest of a finished embedding, in its documented key order."""
    rows = int(sum(e["rows"] for e in entries))
    manifest = {
        "schema_version": shards.SCHEMA_VERSION,
        "model": ref.name,
        "source": ref.source,
        "revision": ref.revision,
        "weights_sha256": lm.weights,
        "layer": lm.layer,
        "layers": sorted([lm.layer, *lm.extra_layers]),
        "num_hidden_layers": lm.n_states - 1,
        "granularity": settings.granularity,
        "pooling": settings.pooling,
        "max_length": lm.max_length,
        "dtype": settings.dtype,
        "attention": lm.attention,
        "dim": int(dim),
        "rows": rows,
        "sequences": int(sum(e["sequences"] for e in entries)),
        "tokens": tally.tokens,
        "overflow": settings.overflow,
        "truncated_sequences": int(tally.truncated),
        "windowed_sequences": int(tally.windowed),
        "split_counts": dict(sorted(tally.split_counts.items())),
        "shards": entries,
    }
    if settings.granularity == "word":
        manifest["words"] = int(tally.n_words)
        manifest["words_truncated"] = int(tally.words_cut)  # cut into or off by truncation at max_length
        manifest["words_without_tokens"] = int(tally.n_words - rows - tally.words_cut)  # e.g. characters the normaliser deletes
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
