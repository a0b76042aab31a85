"""Failures in the middle of the DAG: a SIGKILL during embedding, then a rerun that resumes to the
smoke run's bytes; a bad model under `--keep-going`, which leaves nothing half-written while the
independent jobs finish. Both run `snakemake lmd_results` in a temporary copy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import yaml

from lmdecomp.models import embed
from test_workflow import all_result_files, copy_repo, env, run

pytestmark = pytest.mark.integration


# what `snakemake lmd_results` writes: the smoke run's files under these paths
LMD_HALF = ("results/corpus/", "results/models/", "results/embeddings/", "results/lmd/", "results/metrics/models/",
            "results/figures/lmd_", "results/tables/lmd_")


def test_sigkill_during_embedding_then_rerun_gives_the_same_artifacts(snakemake_run, repo_root, tmp_path):
    work = copy_repo(repo_root, tmp_path)
    # the LMD half (corpus, models, embeddings, LMD): the MPO half reads no embedding
    cmd = ["snakemake", "lmd_results", "--cores", "2", "--configfile", "config/smoke.yaml"]
    proc = subprocess.Popen(cmd, cwd=work, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 600
    embeddings = work / "results/embeddings"
    while time.monotonic() < deadline and proc.poll() is None:
        # a job has journalled a finished shard (a shard file not yet in the journal is not
        # finished: a kill between its rename and the journal's update leaves it to be rewritten)
        if any(embeddings.glob(f".*.partial/{embed.FINISHED}")):
            break
        time.sleep(0.2)
    assert proc.poll() is None, "snakemake finished before embedding started; nothing was interrupted"
    os.killpg(proc.pid, signal.SIGKILL)  # snakemake and every job it started
    proc.wait()
    assert not (work / "results/lmd/metrics.json").exists()
    # Shards finished before the kill: those in the journals of the jobs' work folders (.{model}.partial).
    finished = {(folder.name[1:-len(".partial")], name): (folder / name).stat().st_ino
                for folder in embeddings.glob(".*.partial") if (folder / embed.FINISHED).is_file()
                for name in json.loads((folder / embed.FINISHED).read_text())}
    assert finished, "no finished shard in a work folder at the kill"

    run(["snakemake", "--unlock", *cmd[1:]], work)
    run([*cmd, "--rerun-incomplete"], work)
    killed = all_result_files(work)
    clean = {rel: data for rel, data in all_result_files(snakemake_run).items() if rel.startswith(LMD_HALF)}
    assert sorted(killed) == sorted(clean)
    assert [rel for rel in clean if clean[rel] != killed[rel]] == []
    # The rerun resumed: the same files (not rewritten copies) became the output's shards.
    for (model, shard), inode in finished.items():
        assert (embeddings / model / shard).stat().st_ino == inode, (model, shard)
    assert not list(embeddings.glob(".*.partial"))


def test_a_bad_model_leaves_nothing_half_written_and_keep_going_finishes_the_rest(repo_root, tmp_path):
    work = copy_repo(repo_root, tmp_path)
    broken = work / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    (broken / "vocab.txt").write_text("[PAD]\n")  # a tokenizer file, but no weights
    smoke = yaml.safe_load((work / "config/smoke.yaml").read_text())
    smoke["models"]["broken"] = {"path": str(broken)}
    (work / "bad.yaml").write_text(yaml.safe_dump(smoke, sort_keys=False))
    # the LMD half is enough: the broken model stops its embed and the moments; the MPO half does not read it
    proc = run(["snakemake", "lmd_results", "--cores", "2", "--configfile", "bad.yaml", "--keep-going"], work,
               check=False)
    assert proc.returncode != 0
    assert "model 'broken'" in (work / "results/logs/model/broken.log").read_text()
    assert not (work / "results/models/broken").exists()
    assert not (work / "results/embeddings/broken").exists()
    for name in ("minilm", "cassette", "zoo-tiny"):  # the independent jobs still finished
        assert (work / "results/embeddings" / name / "manifest.json").is_file(), name
    assert not (work / "results/lmd/moments.safetensors").exists()
