"""Hugging Face datasets as corpus sources: a local folder in hub layout, the same folder by name
through a hub cache the test lays out, the corpus equal to its JSON Lines export, and the errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from hub_dataset_layout import HUB_ID, REVISION, lay_out_hub_cache, sentiment_rows
from hub_dataset_layout import hf_caches, reviews  # noqa: F401  (fixtures)
from lmdecomp.data import corpus, hub_datasets


@pytest.fixture(scope="module")
def tokenizer(minilm_folder):
    return AutoTokenizer.from_pretrained(minilm_folder)


def corpus_config(sources, **over):
    return {"sources": sources, "seq_len": 16, "min_tokens": 4, "n_sequences": 50, "seed": 7,
            "splits": {"train": 0.6, "val": 0.2, "test": 0.2}, **over}


def test_folder_metadata_and_batches_in_row_order(reviews):
    meta = hub_datasets.inspect({"dataset": str(reviews), "config": "sentiment"}, "t", splits=["train"],
                                text_columns=["sentence"], columns=["label"])
    assert meta.splits == ("train", "validation", "test")
    assert meta.features["label"].names == ["negative", "positive"]  # the README's ClassLabel
    pairs = hub_datasets.inspect({"dataset": str(reviews), "config": "pairs"}, "t")
    assert pairs.columns == ["sentence1", "sentence2", "label", "score"]  # from the Parquet schema
    assert hub_datasets.describe_feature(pairs.features["score"]) == "float"
    batches = list(hub_datasets.iter_columns(meta, "train", ["sentence", "label"], batch_size=16))
    assert [len(b["sentence"]) for b in batches] == [16, 16, 16, 12]  # 60 rows, across both shards
    rows = sentiment_rows("train")
    assert [t for b in batches for t in b["sentence"]] == rows["sentence"]
    assert [y for b in batches for y in b["label"]] == rows["label"]


@pytest.mark.parametrize("split", ["train", "validation"])
def test_dataset_corpus_equals_the_corpus_of_its_json_lines_export_byte_for_byte(reviews, tokenizer, tmp_path, split):
    """The split written out as JSON Lines, a row a line (null text included), and read as a file
    source of the same name, gives the same sequences.parquet, bytes and all."""
    texts = sentiment_rows(split)["sentence"]
    export = tmp_path / f"{split}.jsonl"
    export.write_text("".join(json.dumps({"sentence": t}) + "\n" for t in texts), encoding="utf-8")
    from_dataset = {"name": "reviews", "dataset": str(reviews), "config": "sentiment", "split": split,
                    "text_field": "sentence"}
    from_file = {"name": "reviews", "path": str(export), "text_field": "sentence"}
    n = 50 if split == "train" else 12
    written = []
    for spec in (from_dataset, from_file):
        table, report = corpus.build_sequences(corpus_config([spec], n_sequences=n), tokenizer, batch_documents=7)
        written.append(tmp_path / f"{spec.get('split', 'file')}-{len(written)}.parquet")
        corpus.write_sequences(table, written[-1])
    assert written[0].read_bytes() == written[1].read_bytes()
    table = pq.read_table(written[0])
    assert table.num_rows == n and set(table["split"].to_pylist()) == set(corpus.SPLITS)
    for row in table.to_pylist():  # each chunk is a span of its row, keyed by the row's line number
        line = int(row["doc_id"].removeprefix(f"{split}.jsonl:"))
        assert row["text"] == corpus.clean(texts[line - 1])[row["char_start"]:row["char_end"]]
    if split == "train":  # the null row, the blank row and the repeated row are no documents
        assert report["documents"] == 57 and report["empty_dropped"] == 1 and report["duplicates_dropped"] == 1


def test_hub_id_is_read_offline_from_a_hub_cache_laid_out_by_hand(reviews, tmp_path):
    """``org/name`` at a revision, through the same load_dataset call, from the snapshot of a hub
    cache (blobs, symlinks, refs/main) with HF_HUB_OFFLINE=1, in a fresh process as a job runs."""
    cache = lay_out_hub_cache(reviews, tmp_path / "hub")
    script = (
        "import json, sys; from lmdecomp.data import hub_datasets\n"
        "spec = json.loads(sys.argv[1])\n"
        "meta = hub_datasets.inspect(spec, 'corpus source', splits=['train'], text_columns=['sentence'])\n"
        "rows = [t for b in hub_datasets.iter_columns(meta, 'train', ['sentence']) for t in b['sentence']]\n"
        "print(json.dumps([str(meta.folder), list(meta.splits), meta.features['label'].names, rows]))\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "home"),
           "HF_DATASETS_CACHE": str(tmp_path / "datasets")}
    spec = {"dataset": HUB_ID, "config": "sentiment", "revision": REVISION}
    out = subprocess.run([sys.executable, "-c", script, json.dumps(spec)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    folder, splits, names, rows = json.loads(out.stdout.strip().splitlines()[-1])
    assert folder == str(cache / "datasets--lmdecomp-test--reviews" / "snapshots" / REVISION)
    assert (splits, names) == (["train", "validation", "test"], ["negative", "positive"])
    assert rows == sentiment_rows("train")["sentence"]
    # another revision is not in the cache: offline, a clear error naming the cache
    wrong = json.dumps({**spec, "revision": "f" * 40})
    failed = subprocess.run([sys.executable, "-c", script, wrong], env=env, capture_output=True, text=True)
    assert failed.returncode != 0
    assert f"dataset {HUB_ID!r} at revision {'f' * 40} is not in the Hugging Face cache ({cache})" in failed.stderr


def test_plan_time_inspection_touches_no_network(reviews):
    """download=False: an uncached hub id is None (the job checks it), the static rules still apply."""
    spec = {"name": "w", "dataset": "Salesforce/wikitext", "config": "wikitext-103-raw-v1", "revision": "b" * 40}
    assert corpus.check_dataset_source(spec, download=False) is None
    with pytest.raises(corpus.CorpusError, match="needs revision: <commit sha>"):
        corpus.check_dataset_source({"name": "w", "dataset": "Salesforce/wikitext"}, download=False)
    assert corpus.check_dataset_source({"name": "r", "dataset": str(reviews), "config": "sentiment",
                                        "text_field": "sentence"}, download=False).splits[0] == "train"


@pytest.mark.parametrize("spec,message", [
    ({"config": "nope"}, "(config 'nope'): BuilderConfig 'nope' not found. Available: ['sentiment', 'pairs']"),
    ({"config": None}, "declares the configs ['sentiment', 'pairs']; name one with config:"),
    ({"text_field": "sentenc"}, "has no column 'sentenc'; its columns: ['sentence', 'label']"),
    ({"text_field": "label"}, "column 'label' holds ClassLabel"),
    ({"split": "dev"}, "has no split 'dev'; its splits: ['train', 'validation', 'test']"),
    ({"revision": "a" * 40}, "revision: pins a hub dataset"),
    ({"dataset": "./no/such/folder"}, "is neither a folder nor a hub id"),
    ({"dataset": "org/name", "revision": "main"}, "revision 'main' of 'org/name' is not a full commit sha"),
    ({"dataset": "org/name", "revision": "b08601e"}, "revision 'b08601e' of 'org/name' is not a full commit sha"),
    ({"dataset": "org/name"}, "hub dataset 'org/name' needs revision: <commit sha>"),
    ({"dataset": "org/name", "revision": "c" * 40}, "dataset 'org/name' at revision cccc"),
])
def test_bad_dataset_sources_are_clear_errors(reviews, tokenizer, spec, message):
    base = {"name": "src", "dataset": str(reviews), "config": "sentiment", "text_field": "sentence"}
    bad = {k: v for k, v in {**base, **spec}.items() if v is not None}
    with pytest.raises(corpus.CorpusError) as err:
        corpus.build_sequences(corpus_config([bad]), tokenizer)
    assert message in str(err.value) and str(err.value).startswith("corpus source 'src'")
