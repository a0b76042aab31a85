"""config/smoke.yaml through DVC: `dvc repro --force` rewrites the session's Snakemake run
(``snakemake_run``, tests/conftest.py) byte for byte, stages track their own params, and an
experiment reruns the stage it changes. Its own module so that pytest-xdist can run it beside
the other DAG tests (DVC runs stages one at a time: one core)."""

from __future__ import annotations

import csv
import io
import json
import shutil

import pyarrow.parquet as pq
import pytest
import yaml

from lmdecomp.params import load_params
from test_workflow import all_result_files, copy_repo, run

pytestmark = pytest.mark.integration


def test_dvc_agrees_with_snakemake_byte_for_byte(snakemake_run, repo_root, tmp_path):
    """Snakemake's outputs (params.yaml + --configfile), then `dvc commit`: `dvc status` is clean;
    `dvc repro --force` from params.yaml merged by hand rewrites every artifact with the same
    bytes; a further `dvc repro` does nothing."""
    work = copy_repo(repo_root, tmp_path)
    merged = load_params([repo_root / "params.yaml", repo_root / "config/smoke.yaml"])
    (work / "params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
    # the module's Snakemake run is the reference: copied, not rerun (a smoke DAG is ~100 s)
    shutil.copytree(snakemake_run / "results", work / "results", copy_function=shutil.copy2)
    by_snakemake = all_result_files(work)

    run(["dvc", "commit", "--force"], work)
    assert "up to date" in run(["dvc", "status"], work).stdout

    run(["dvc", "repro", "--force"], work)
    by_dvc = all_result_files(work)
    assert sorted(by_dvc) == sorted(by_snakemake)
    assert [rel for rel in by_snakemake if by_snakemake[rel] != by_dvc[rel]] == []

    again = run(["dvc", "repro"], work)
    assert "Running stage" not in again.stdout
    assert "up to date" in again.stdout

    metrics = json.loads(run(["dvc", "metrics", "show", "--json"], work).stdout)
    shown = json.dumps(metrics)
    assert "loo_test_r2_mean" in shown and "results/finetune/bbc/mpobert/metrics.json" in shown
    plots = json.loads(run(["dvc", "plots", "show", "--json", "--split"], work).stdout)["data"]
    loo_rows = list(csv.DictReader(io.StringIO((work / "results/tables/lmd_loo.csv").read_text())))
    for title in ("Leave-one-out LMD, test R² per target", "Fine-tuning, test metric against parameters",
                  "results/figures/lmd_loo.png", "results/figures/finetune_tradeoff.png"):
        assert title in plots, sorted(plots)
    loo_data = json.dumps(plots["Leave-one-out LMD, test R² per target"])
    assert all(row["target"] in loo_data for row in loo_rows)

    # stages are named by model, and each tracks its own model's spec: editing one model
    # leaves the others' stages up to date (as Snakemake does)
    stages = run(["dvc", "stage", "list", "--name-only"], work).stdout.split()
    assert {"model@minilm", "model@zoo-tiny", "embed@cassette"} <= set(stages)
    edited = yaml.safe_load((work / "params.yaml").read_text())
    edited["models"]["zoo-tiny"]["pretrain"]["seed"] = 1
    (work / "params.yaml").write_text(yaml.safe_dump(edited, sort_keys=False))
    changed = run(["dvc", "status"], work).stdout
    assert "model@zoo-tiny:" in changed and "embed@zoo-tiny:" in changed
    assert "model@minilm:" not in changed and "embed@cassette:" not in changed
    (work / "params.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))

    # an experiment with one parameter changed reruns the stage that reads it (the corpus stage
    # only: the whole DAG again would take another smoke run; dvc repro above ran all of it)
    run(["git", "add", "-A"], work)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "smoke"], work)
    run(["dvc", "exp", "run", "-S", "corpus.seq_len=64", "corpus"], work, timeout=900)
    seqs = pq.read_table(work / "results/corpus/sequences.parquet")
    assert max(seqs.column("n_tokens").to_pylist()) == 64
    assert yaml.safe_load((work / "params.yaml").read_text())["corpus"]["seq_len"] == 64
    assert run(["dvc", "exp", "list", "--name-only"], work).stdout.split()  # the experiment is recorded
    shown = run(["dvc", "metrics", "show", "--json"], work)
    assert "loo_test_r2_mean" in shown.stdout
