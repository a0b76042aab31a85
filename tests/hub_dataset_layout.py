"""Small Hugging Face datasets laid out by the tests, as the hub and its cache lay them out.

``write_reviews`` writes a folder in hub layout: Parquet shards and a README.md whose YAML header
declares two configs, ``sentiment`` (a ClassLabel feature declared in ``dataset_info``; its test
labels hidden as -1, as GLUE's) and ``pairs`` (two sentences, an integer label and a float score,
its features left to the Parquet schema). ``write_topics`` writes a folder of one JSON Lines
file and no README (one split, string labels). ``lay_out_hub_cache`` files a folder into a hub
cache as huggingface_hub does: content-addressed blobs, a snapshot of symlinks named by the
commit, and ``refs/main``. The fixtures ``reviews`` and ``topics`` write them once per test
module, with the Hugging Face caches redirected into a temporary folder, offline (``hf_caches``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

HUB_ID = "lmdecomp-test/reviews"
REVISION = "89abcdef" * 5
SENTENCE = "The plot moves quickly and the actors in Zürich seem to enjoy every scene. "

README = """---
configs:
- config_name: sentiment
  data_files:
  - split: train
    path: sentiment/train-*
  - split: validation
    path: sentiment/validation-*
  - split: test
    path: sentiment/test-*
- config_name: pairs
  data_files:
  - split: train
    path: pairs/train-*
  - split: validation
    path: pairs/validation-*
  - split: test
    path: pairs/test-*
dataset_info:
- config_name: sentiment
  features:
  - name: sentence
    dtype: string
  - name: label
    dtype:
      class_label:
        names:
          '0': negative
          '1': positive
---
# reviews

A test dataset built by lmdecomp's tests.
"""


def sentiment_rows(split: str) -> dict[str, list]:
    """The ``sentiment`` config's rows: texts of a few sentences (one null, one blank, one repeated)."""
    n = {"train": 60, "validation": 12, "test": 10}[split]
    texts = [f"{split.title()} review {i}. " + SENTENCE * (1 + i % 3) for i in range(n)]
    labels = [i % 2 for i in range(n)] if split != "test" else [-1] * n
    if split == "train":
        texts[7], texts[12], texts[20] = None, "   ", texts[2]
    return {"sentence": texts, "label": labels}


def pairs_rows(split: str) -> dict[str, list]:
    n = {"train": 40, "validation": 10, "test": 10}[split]
    return {
        "sentence1": [f"{split} pair {i}: the first sentence" for i in range(n)],
        "sentence2": [f"and the second sentence of pair {i} in {split}" for i in range(n)],
        "label": [(3 * i) % 2 for i in range(n)],
        "score": [round(5.0 * ((7 * i) % 11) / 10.0, 3) for i in range(n)],
    }


def write_reviews(root: Path) -> Path:
    """The two-config folder; the sentiment train split in two Parquet shards."""
    from datasets import ClassLabel, Features, Value

    root.mkdir(parents=True, exist_ok=True)
    (root / "README.md").write_text(README, encoding="utf-8")
    # the shards carry datasets' own schema metadata, as push_to_hub writes them
    schema = Features({"sentence": Value("string"), "label": ClassLabel(names=["negative", "positive"])}).arrow_schema
    for split in ("train", "validation", "test"):
        table = pa.table(sentiment_rows(split), schema=schema)
        shards = [table.slice(0, 25), table.slice(25)] if split == "train" else [table]
        for k, shard in enumerate(shards):
            path = root / "sentiment" / f"{split}-{k:05d}-of-{len(shards):05d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(shard, path)
        path = root / "pairs" / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(pairs_rows(split)), path)
    return root


TOPICS = ["sport", "music", "science"]


def topics_rows() -> list[dict]:
    rows = [{"text": f"Item {i} is about {TOPICS[i % 3]} and nothing else.", "topic": TOPICS[i % 3]} for i in range(45)]
    rows[5] = dict(rows[4])  # an exact duplicate
    return rows


def write_topics(root: Path) -> Path:
    """One JSON Lines file and no README: one config, one split (train)."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(row) for row in topics_rows()]
    (root / "data" / "train.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def lay_out_hub_cache(folder: Path, cache: Path, repo_id: str = HUB_ID, revision: str = REVISION) -> Path:
    """``cache/datasets--org--name/{blobs,snapshots/<revision>,refs/main}`` holding ``folder``'s files."""
    repo = cache / ("datasets--" + repo_id.replace("/", "--"))
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = repo / "snapshots" / revision / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return cache


@pytest.fixture(scope="module")
def hf_caches(tmp_path_factory):
    """datasets' Arrow cache and the hub cache under a temporary folder, with the hub offline."""
    import datasets
    from huggingface_hub import constants

    root = tmp_path_factory.mktemp("hf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", root / "datasets")
        patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        patch.setattr(constants, "HF_HUB_CACHE", str(root / "hub"))
        yield root


@pytest.fixture(scope="module")
def reviews(tmp_path_factory, hf_caches):
    return write_reviews(tmp_path_factory.mktemp("reviews") / "reviews")


@pytest.fixture(scope="module")
def topics(tmp_path_factory, hf_caches):
    return write_topics(tmp_path_factory.mktemp("topics") / "topics")
