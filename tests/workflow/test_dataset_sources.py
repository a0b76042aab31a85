"""Snakemake on Hugging Face dataset sources: a corpus and a task from local dataset folders in
hub layout, equal to the library's own tables; a bad dataset source stops the plan before any
job; a job whose dataset is out of reach offline writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from hub_dataset_layout import write_reviews
from lmdecomp.data import corpus, tasks
from lmdecomp.models import sources
from lmdecomp.params import load_params
from test_workflow import copy_repo, run

pytestmark = pytest.mark.integration


def overlay(reviews, **task):
    return {
        "corpus": {"sources": [{"name": "reviews", "dataset": str(reviews), "config": "sentiment", "split": "train",
                                "text_field": "sentence"}],
                   "seq_len": 16, "min_tokens": 4, "n_sequences": 40},
        "finetune": {"tasks": [{"name": "reviews", "dataset": str(reviews), "config": "sentiment",
                                "text_column": "sentence", "metric": "mcc", **task}]},
    }


@pytest.fixture()
def work(repo_root, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    return copy_repo(repo_root, tmp_path / "work"), write_reviews(tmp_path / "reviews")


def test_corpus_and_task_from_dataset_folders_run_under_snakemake(work, tmp_path, monkeypatch):
    work, reviews = work
    (work / "datasets.yaml").write_text(yaml.safe_dump(overlay(reviews), sort_keys=False))
    targets = ["results/corpus/sequences.parquet", "results/tasks/reviews.parquet", "results/tasks/reviews.json"]
    run(["snakemake", *targets, "--cores", "2", "--configfile", "datasets.yaml"], work)
    # the same tables, built here by the library from the same params
    monkeypatch.chdir(work)
    params = load_params(["params.yaml", "datasets.yaml"])
    tokenizer = sources.resolve({"name": "t", **params["corpus"]["reference_tokenizer"]}).load_tokenizer()
    expected, _ = corpus.build_sequences(params["corpus"], tokenizer)
    corpus.write_sequences(expected, tmp_path / "expected.parquet")
    assert (work / targets[0]).read_bytes() == (tmp_path / "expected.parquet").read_bytes()
    assert set(expected["doc_id"].to_pylist()) <= {f"train.jsonl:{n}" for n in range(1, 61)}
    table, record = tasks.load_task("reviews", params["finetune"]["tasks"][0], params["finetune"]["seed"],
                                    params["finetune"]["splits"])
    assert pq.read_table(work / targets[1]).equals(table)
    assert yaml.safe_load((work / targets[2]).read_text()) == record
    assert record["splits_from"] == "dataset" and record["metric"] == "mcc"


def test_a_bad_dataset_source_stops_the_plan_before_any_job(work):
    work, reviews = work
    bad = overlay(reviews, text_column="sentenc")
    bad["corpus"]["sources"][0]["split"] = "dev"
    (work / "bad.yaml").write_text(yaml.safe_dump(bad, sort_keys=False))
    proc = run(["snakemake", "-n", "--cores", "1", "--configfile", "bad.yaml"], work, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "corpus source 'reviews': dataset" in out and "has no split 'dev'; its splits: ['train', 'validation', 'test']" in out
    assert "task 'reviews': dataset" in out and "has no column 'sentenc'; its columns: ['sentence', 'label']" in out
    assert not (work / "results").exists() or not any((work / "results").rglob("*.parquet"))


def test_a_task_job_whose_hub_dataset_is_not_cached_writes_nothing(work):
    """Offline, an uncached hub revision passes the plan (it cannot be checked there) and fails its job."""
    work, reviews = work
    hub = overlay(reviews, dataset="lmdecomp-test/absent", revision="d" * 40)
    (work / "hub.yaml").write_text(yaml.safe_dump(hub, sort_keys=False))
    out, record = work / "results/tasks/reviews.parquet", work / "results/tasks/reviews.json"
    proc = subprocess.run([sys.executable, "workflow/scripts/task.py", "--params", "params.yaml", "hub.yaml",
                           "--task", "reviews", "--out", str(out), "--record", str(record)],
                          cwd=work, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode != 0
    assert "task 'reviews': dataset 'lmdecomp-test/absent' at revision dddd" in proc.stderr
    assert "is not in the Hugging Face cache" in proc.stderr
    assert not out.exists() and not record.exists()
