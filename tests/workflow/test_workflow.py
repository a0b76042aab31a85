"""The DAG end to end: config/smoke.yaml through Snakemake, in a temporary copy.

These run the real engine on the real packaged models and corpus. The smoke run most of
them read (``snakemake_run``, tests/conftest.py) is made once per session and shared
with test_dvc.py, test_failures.py and test_slurm.py; the helpers here are theirs too.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from lmdecomp import lmd
from lmdecomp.data import shards
from lmdecomp.params import load_params

pytestmark = pytest.mark.integration

COPY = ["Snakefile", "params.yaml", "dvc.yaml", "workflow", "config", "src", ".dvc/config", ".dvcignore", ".gitignore"]
ARTIFACTS = [
    "results/corpus/sequences.parquet",
    "results/lmd/moments.safetensors",
    "results/lmd/block_moments.safetensors",
    "results/lmd/pairwise.parquet",
    "results/lmd/loo.parquet",
    "results/lmd/selection.parquet",
    "results/lmd/similarity.parquet",
    "results/lmd/metrics.json",
    "results/lmd/layers.parquet",
    "results/figures/lmd_layers.png",
    "results/figures/lmd_pairwise.png",
    "results/figures/lmd_loo.png",
    "results/figures/lmd_selection.png",
    "results/figures/lmd_vs_cka.png",
    "results/mpo/cassette/spectrum.parquet",
    "results/mpo/cassette/ladder.parquet",
    "results/mpo/cassette/loss.parquet",
    "results/figures/mpo_tradeoff.png",
    "results/variants/dense/model/config.json",
    "results/variants/mpobert/model/mpobert.json",
    "results/variants/mpobert/model/model.safetensors",
    "results/variants/mpobert/metrics.json",
    "results/tasks/bbc.parquet",
    "results/tasks/tweets.json",
    "results/finetune/bbc/mpobert-aux/metrics.json",
    "results/finetune/tweets/dense/metrics.json",
    "results/finetune/tweets/dense/predictions.parquet",
    "results/tables/finetune.csv",
    "results/tables/finetune_headline.csv",
    "results/tables/lmd_loo.csv",
    "results/figures/finetune_tradeoff.png",
]


def env():
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"], "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def run(cmd, cwd, check=True, timeout=600, extra_env=None):
    proc = subprocess.run(cmd, cwd=cwd, env={**env(), **(extra_env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def copy_repo(repo_root: Path, dest: Path) -> Path:
    for name in COPY:
        src = repo_root / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dest / name)
    run(["git", "init", "-q"], dest)
    return dest


def all_result_files(root: Path) -> dict[str, bytes]:
    files = {}
    for path in sorted((root / "results").rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_file() and "/logs/" not in rel and path.name not in (".gitignore", ".snakemake_timestamp"):
            files[rel] = path.read_bytes()
    return files


def test_snakemake_smoke_writes_every_artifact(snakemake_run, repo_root):
    work = snakemake_run
    params = load_params([repo_root / "params.yaml", repo_root / "config/smoke.yaml"],
                         repo_root / "workflow/schemas/params.schema.yaml")
    for rel in ARTIFACTS:
        assert (work / rel).is_file(), rel

    seqs = pq.read_table(work / "results/corpus/sequences.parquet")
    assert seqs.num_rows == params["corpus"]["n_sequences"]
    assert seqs.column("seq_id").to_pylist() == list(range(seqs.num_rows))
    assert set(seqs.column("split").to_pylist()) == {"train", "val", "test"}
    assert max(seqs.column("n_tokens").to_pylist()) == params["corpus"]["seq_len"]

    dims = {"minilm": 384, "cassette": 128, "zoo-tiny": 32}
    for name, dim in dims.items():
        record = json.loads((work / "results/models" / name / "model.json").read_text())
        assert record["hidden_size"] == dim and len(record["weights_sha256"]) == 64
        folder = work / "results/embeddings" / name
        manifest = shards.read_manifest(folder)
        for key in ("model", "source", "weights_sha256", "layer", "pooling", "dim", "rows", "tokens", "shards"):
            assert key in manifest, key
        assert manifest["dim"] == dim and manifest["rows"] == seqs.num_rows
        parts = list(shards.iter_shards(folder))  # verifies every checksum
        ids = np.concatenate([p.seq_id for p in parts])
        assert ids.tolist() == seqs.column("seq_id").to_pylist()
        assert len(parts) == -(-seqs.num_rows // params["embed"]["shard_rows"])

    pairwise = pl.read_parquet(work / "results/lmd/pairwise.parquet")
    loo = pl.read_parquet(work / "results/lmd/loo.parquet")
    assert pairwise.columns == ["basis", "target", "split", "r2", "alpha", "r2_lo", "r2_hi"]
    assert loo.columns == ["target", "split", "r2", "alpha", "r2_lo", "r2_hi"]
    assert pairwise.height == 3 * 2 * 3 and loo.height == 3 * 3
    assert set(pairwise["alpha"]) <= set(params["lmd"]["alpha"])  # chosen on val from the grid
    assert ((loo["r2_lo"] <= loo["r2"]) & (loo["r2"] <= loo["r2_hi"]) & (loo["r2_lo"] < loo["r2_hi"])).all()
    selection = pl.read_parquet(work / "results/lmd/selection.parquet")
    assert selection.height == 3 * 2 and set(selection["k"]) == {1, 2}
    assert ((selection["test_r2_lo"] <= selection["test_r2"]) & (selection["test_r2"] <= selection["test_r2_hi"])).all()
    similarity = pl.read_parquet(work / "results/lmd/similarity.parquet")
    assert similarity.height == 3 and ((similarity["cka"] > 0) & (similarity["cka"] <= 1)).all()

    zoo = json.loads((work / "results/models/zoo-tiny/model.json").read_text())
    assert zoo["pretrain"]["val_loss"] < zoo["pretrain"]["initial_val_loss"]
    ladder = pl.read_parquet(work / "results/mpo/cassette/ladder.parquet")
    assert (ladder["rel_error"] <= ladder["budget"] + 1e-9).all()  # never over budget
    assert ladder.filter(pl.col("budget") == 0)["rel_error"].max() < 1e-6
    loss = pl.read_parquet(work / "results/mpo/cassette/loss.parquet")
    assert loss.filter(pl.col("budget") == 0)["params"][0] == loss["dense_params"][0]
    train = loo.filter(pl.col("split") == "train")["r2"]
    assert ((train > 0) & (train < 1)).all()
    metrics = json.loads((work / "results/lmd/metrics.json").read_text())
    test_r2 = dict(loo.filter(pl.col("split") == "test").select("target", "r2").iter_rows())
    assert metrics["loo_test_r2"] == pytest.approx(test_r2)
    assert metrics["loo_test_r2_mean"] == pytest.approx(np.mean(list(test_r2.values())))
    assert metrics["rows"] == {"granularity": "sequence"}

    # Layer-wise: every hidden state of every model (embed.layers: all); at relative depth 1 the
    # basis is every other model's last layer, so the fit is the main leave-one-out fit,
    # computed here from a separate pass over the shards.
    layered = pl.read_parquet(work / "results/lmd/layers.parquet")
    depth = {"minilm": 6, "cassette": 2, "zoo-tiny": 1}
    assert layered.height == 3 * sum(d + 1 for d in depth.values())
    for model, n_layers in depth.items():
        rows = layered.filter((pl.col("model") == model) & (pl.col("split") == "test")).sort("layer")
        assert rows["layer"].to_list() == list(range(n_layers + 1))
        assert rows["relative_depth"].to_list() == pytest.approx([k / n_layers for k in range(n_layers + 1)])
        assert rows["r2"][-1] == pytest.approx(test_r2[model], abs=1e-8)
    assert ((layered["r2_lo"] <= layered["r2"]) & (layered["r2"] <= layered["r2_hi"])).all()
    for png in ("lmd_pairwise.png", "lmd_loo.png", "lmd_selection.png", "lmd_vs_cka.png", "lmd_layers.png",
                "mpo_tradeoff.png", "finetune_tradeoff.png"):
        assert (work / "results/figures" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    finetuned = pl.read_csv(work / "results/tables/finetune.csv")
    assert sorted(zip(finetuned["task"], finetuned["variant"])) == sorted(
        (t["name"], v["name"]) for t in params["finetune"]["tasks"] for v in params["finetune"]["variants"])
    seeds = params["finetune"]["seeds"]
    assert (finetuned["seeds"] == seeds).all() and (finetuned["metric"] == "accuracy").all()
    assert ((finetuned["test_metric_lo"] <= finetuned["test_metric_hi"]) & (finetuned["seed_min"] <= finetuned["test_metric"])
            & (finetuned["test_metric"] <= finetuned["seed_max"])).all()
    predictions = pl.read_parquet(work / "results/finetune/tweets/dense/predictions.parquet")
    tweets_test = json.loads((work / "results/tasks/tweets.json").read_text())["per_split"]["test"]
    assert predictions.columns == ["seed", "index", "prediction", "gold"] and predictions.height == seeds * tweets_test
    dense = finetuned.filter((pl.col("task") == "tweets") & (pl.col("variant") == "dense"))
    per_seed = predictions.group_by("seed").agg((pl.col("prediction") == pl.col("gold")).mean())["prediction"]
    assert dense["test_metric"][0] == pytest.approx(per_seed.mean(), abs=1e-6)  # the table's mean is the seeds' accuracy
    claims = pl.read_csv(work / "results/tables/finetune_headline.csv")
    assert claims.height == 2 * 2 and set(claims["verdict"]) <= {"holds", "fails", "inconclusive"}  # 2 tasks x 2 deep variants
    assert (claims["points_lo"] <= claims["points_hi"]).all()
    assert not (~claims["fewer_parameters"] & (claims["verdict"] != "fails")).any()  # more parameters: the claim fails
    variant = json.loads((work / "results/variants/mpobert/metrics.json").read_text())
    assert variant["layers"] == params["mpobert"]["layers"]
    assert variant["val_loss"]["grown"] == pytest.approx(variant["val_loss"]["healed"], rel=1e-5)
    run_metrics = json.loads((work / "results/finetune/bbc/mpobert-aux/metrics.json").read_text())
    assert run_metrics["trainable_parameters"] < run_metrics["parameters"]
    assert run_metrics["parameters_by_role"]["shared_central"] > 0
    tweets = json.loads((work / "results/tasks/tweets.json").read_text())
    assert tweets["garbled_rows_skipped"] > 0 and tweets["examples"] == 300


def test_decompose_on_the_smoke_shards_equals_the_pipelines_tables(snakemake_run, repo_root):
    """lmdecomp.decompose on the arrays read from the smoke run's shards gives the R², α and
    bootstrap intervals of results/lmd/pairwise.parquet and loo.parquet (to 1e-10)."""
    import lmdecomp

    params = load_params([repo_root / "params.yaml", repo_root / "config/smoke.yaml"])
    arrays, split, seq_ids = {}, None, None
    for name in params["models"]:
        parts = list(shards.iter_shards(snakemake_run / "results/embeddings" / name))
        ids = np.concatenate([p.seq_id for p in parts])
        assert seq_ids is None or np.array_equal(ids, seq_ids)  # rows aligned across models
        seq_ids, split = ids, np.concatenate([p.split for p in parts])
        arrays[name] = np.concatenate([p.embedding for p in parts])
    cfg = params["lmd"]
    got = lmdecomp.decompose(arrays, split, alpha=cfg["alpha"], bootstrap=cfg["bootstrap"],
                             n_blocks=cfg["bootstrap_blocks"], level=cfg["ci_level"], seed=cfg["seed"])
    for table, keys in (("pairwise", ["basis", "target", "split"]), ("loo", ["target", "split"])):
        want = pl.read_parquet(snakemake_run / f"results/lmd/{table}.parquet").sort(keys)
        mine = getattr(got, table).sort(keys)
        assert mine.columns == want.columns and mine.select(keys).equals(want.select(keys)), table
        assert mine["alpha"].to_list() == want["alpha"].to_list(), table
        for column in ("r2", "r2_lo", "r2_hi"):
            assert np.abs(mine[column].to_numpy() - want[column].to_numpy()).max() < 1e-10, (table, column)


def test_shards_per_job_splits_the_moments_pass_and_reduces_to_the_same_bytes(snakemake_run, repo_root, tmp_path):
    """lmd.shards_per_job: one moments_part job per shard (4 here), then the reduce; the moments
    files are byte-identical to the one-pass run's."""
    work = copy_repo(repo_root, tmp_path / "parts")
    shutil.copytree(snakemake_run / "results", work / "results", copy_function=shutil.copy2)
    for rel in ("results/lmd", "results/figures", "results/tables"):
        shutil.rmtree(work / rel, ignore_errors=True)
    (work / "parts.yaml").write_text("lmd:\n  shards_per_job: 1\n")
    configs = ["--configfile", "config/smoke.yaml", "parts.yaml"]
    targets = ["results/lmd/moments.safetensors", "results/lmd/block_moments.safetensors"]
    planned = run(["snakemake", *targets, "-n", "--cores", "2", *configs], work).stdout
    assert planned.count("rule moments_part:") == 4 and "rule embed:" not in planned
    run(["snakemake", *targets, "--cores", "2", *configs], work)
    for rel in targets:
        assert (work / rel).read_bytes() == (snakemake_run / rel).read_bytes(), rel
    assert not list((work / "results/lmd/parts").glob("*.safetensors"))  # temp() parts are removed


@pytest.mark.parametrize("per_job", [None, 1])
def test_lmd_without_bootstrap_keeps_no_block_moments(snakemake_run, repo_root, tmp_path, per_job):
    """lmd.bootstrap: 0 (config/paper.yaml's setting for wide models): the moments stage takes the
    streaming pass and keeps no block moments (the blocks file holds zero blocks), as one job or
    in parts (byte-identical to the one-pass command DVC runs); the fits equal the bootstrapped
    smoke run's estimates, without intervals."""
    work = copy_repo(repo_root, tmp_path / "nobootstrap")
    shutil.copytree(snakemake_run / "results", work / "results", copy_function=shutil.copy2)
    for rel in ("results/lmd", "results/figures", "results/tables"):
        shutil.rmtree(work / rel, ignore_errors=True)
    (work / "nob.yaml").write_text("lmd:\n  bootstrap: 0\n" + (f"  shards_per_job: {per_job}\n" if per_job else ""))
    configs = ["--configfile", "config/smoke.yaml", "nob.yaml"]
    targets = ["results/lmd/loo.parquet", "results/lmd/pairwise.parquet"]
    planned = run(["snakemake", *targets, "-n", "--cores", "2", *configs], work).stdout
    assert planned.count("rule moments_part:") == (4 if per_job else 0) and "rule embed:" not in planned
    run(["snakemake", *targets, "--cores", "2", *configs], work)
    assert len(lmd.BlockMoments.load(work / "results/lmd/block_moments.safetensors")) == 0
    if per_job:  # dvc repro runs the one-pass command on the same params: the same bytes
        run([sys.executable, "workflow/scripts/moments.py", "--params", "params.yaml", "config/smoke.yaml",
             "nob.yaml", "--embeddings", "results/embeddings", "--sequences", "results/corpus/sequences.parquet",
             "--out", "one.safetensors", "--blocks", "one_blocks.safetensors"], work)
        assert (work / "one.safetensors").read_bytes() == (work / "results/lmd/moments.safetensors").read_bytes()
    ours, ref = (lmd.Moments.load(w / "results/lmd/moments.safetensors") for w in (work, snakemake_run))
    for s in lmd.SPLITS:
        assert ours.n[s] == ref.n[s] > 0
        np.testing.assert_allclose(ours.cross[s], ref.cross[s], rtol=1e-12, atol=1e-9)
    for table in ("loo", "pairwise"):
        got, want = (pq.read_table(w / f"results/lmd/{table}.parquet").to_pylist() for w in (work, snakemake_run))
        assert "r2_lo" not in got[0] and "r2_lo" in want[0]
        assert [(r.get("basis"), r["target"], r["split"], r["alpha"]) for r in got] == \
               [(r.get("basis"), r["target"], r["split"], r["alpha"]) for r in want]
        np.testing.assert_allclose([r["r2"] for r in got], [r["r2"] for r in want], rtol=0, atol=1e-9)


def test_word_granularity_runs_lmd_on_words_shared_by_every_tokenizer(repo_root, tmp_path):
    """config/words.yaml on the smoke config: word rows for three tokenizers' models, every word
    kept through windows, the LMD fits on the aligned words and their count in the metrics."""
    work = copy_repo(repo_root, tmp_path)
    configs = ["--configfile", "config/smoke.yaml", "config/words.yaml"]
    run(["snakemake", "results/lmd/metrics.json", "results/lmd/similarity.parquet", "--cores", "2", *configs], work)
    seqs = pq.read_table(work / "results/corpus/sequences.parquet")
    manifests = {m: shards.read_manifest(work / "results/embeddings" / m) for m in ("minilm", "cassette", "zoo-tiny")}
    keys = {}
    for name, manifest in manifests.items():
        assert manifest["granularity"] == "word" and manifest["sequences"] == seqs.num_rows
        parts = list(shards.iter_shards(work / "results/embeddings" / name))
        keys[name] = {(s, w) for p in parts for s, w in zip(p.seq_id.tolist(), p.word_idx.tolist())}
        assert manifest["rows"] == len(keys[name]) == (manifest["words"] - manifest["words_truncated"]
                                                       - manifest["words_without_tokens"])
    n_words = manifests["minilm"]["words"]
    assert len({m["words"] for m in manifests.values()}) == 1 and n_words > seqs.num_rows
    # zoo-tiny reads 32 tokens at a time, the others 64; with overflow: windows (the default)
    # every model still embeds every word
    assert manifests["zoo-tiny"]["windowed_sequences"] > manifests["minilm"]["windowed_sequences"]
    assert all(m["words_truncated"] == 0 and m["overflow"] == "windows" for m in manifests.values())
    common = set.intersection(*keys.values())
    assert len(common) == n_words
    metrics = json.loads((work / "results/lmd/metrics.json").read_text())
    assert metrics["rows"] == {"granularity": "word", "words": n_words, "words_kept": len(common),
                               "words_dropped": n_words - len(common)}
    moments = lmd.Moments.load(work / "results/lmd/moments.safetensors")
    assert sum(moments.n.values()) == len(common)
    loo = pl.read_parquet(work / "results/lmd/loo.parquet").filter(pl.col("split") == "test")
    assert loo.height == 3 and (loo["r2"] > 0).all()
    assert pl.read_parquet(work / "results/lmd/similarity.parquet").height == 3


@pytest.mark.parametrize("overlay", ["config/paper.yaml", "config/full.yaml"])
def test_other_configs_plan_the_whole_dag_from_a_clean_checkout(repo_root, tmp_path, overlay):
    """`snakemake -n` plans every stage for every model of the overlay (nothing downloaded)."""
    work = copy_repo(repo_root, tmp_path)
    out = run(["snakemake", "-n", "--cores", "1", "--configfile", overlay], work).stdout
    params = load_params([repo_root / "params.yaml", repo_root / overlay])
    for model in params["models"]:
        assert f"results/embeddings/{model}" in out, model
    # the overlay's models replace params.yaml's: none of the default zoo is planned
    planned = set(re.findall(r"results/embeddings/([\w-]+)", out))
    assert planned == set(params["models"]), planned ^ set(params["models"])
    for task in params["finetune"]["tasks"]:
        for variant in params["finetune"]["variants"]:
            assert f"results/finetune/{task['name']}/{variant['name']}/metrics.json" in out
    assert "results/figures/mpo_tradeoff.png" in out


def test_config_on_the_command_line_is_refused(repo_root, tmp_path):
    """--config values would not reach the job scripts (they read the config files)."""
    work = copy_repo(repo_root, tmp_path)
    proc = run(["snakemake", "-n", "--cores", "1", "--config", "lmd={'alpha': 0.5}"], work, check=False)
    assert proc.returncode != 0
    assert "--config overrides are not passed to the job scripts" in proc.stdout + proc.stderr


def test_broken_params_stop_snakemake_before_any_job(repo_root, tmp_path):
    work = copy_repo(repo_root, tmp_path)
    (work / "bad.yaml").write_text("embed:\n  pooling: median\n")
    proc = run(["snakemake", "-n", "--cores", "1", "--configfile", "bad.yaml"], work, check=False)
    assert proc.returncode != 0
    assert "pooling" in proc.stdout + proc.stderr and "median" in proc.stdout + proc.stderr
    # A rule across keys (the schema allows each value alone) is checked before any job too.
    (work / "bad.yaml").write_text("embed:\n  pooling: cls\n")
    proc = run(["snakemake", "-n", "--cores", "1", "--configfile", "bad.yaml"], work, check=False)
    assert proc.returncode != 0 and "set embed.overflow: truncate" in proc.stdout + proc.stderr
    assert not (work / "results").exists() or not any((work / "results").rglob("*.parquet"))


def test_report_collects_every_figure(snakemake_run, tmp_path):
    report = tmp_path / "report.html"  # outside the shared run, which other tests compare file by file
    run(["snakemake", "--configfile", "config/smoke.yaml", "--report", str(report)], snakemake_run)
    html = report.read_text(errors="replace")
    for name in ("lmd_pairwise.png", "lmd_loo.png", "lmd_selection.png", "lmd_vs_cka.png", "lmd_layers.png",
                 "mpo_tradeoff.png", "finetune_tradeoff.png", "finetune.csv", "pairwise.parquet", "loo.parquet", "metrics.json"):
        assert name in html, name
    assert "asymmetric" in html  # a caption made it in


def test_a_library_change_reruns_the_jobs_that_import_it_and_nothing_else(snakemake_run, repo_root, tmp_path):
    """Snakemake takes each job's code from dvc.yaml's deps, so editing a module reruns its
    stages (as `dvc repro` does) instead of leaving stale results."""
    work = copy_repo(repo_root, tmp_path / "edit")
    shutil.copytree(snakemake_run / "results", work / "results", copy_function=shutil.copy2)
    configs = ["--configfile", "config/smoke.yaml"]
    assert "Nothing to be done" in run(["snakemake", "-n", "--cores", "1", *configs], work).stdout
    later = time.time() + 60
    os.utime(work / "src/lmdecomp/models/attention.py", (later, later))  # embed imports it
    planned = run(["snakemake", "-n", "--cores", "1", *configs], work).stdout
    rules = set(re.findall(r"^rule (\w+):", planned, flags=re.M))
    assert {"embed", "moments", "lmd_fit", "lmd_layers", "lmd_figures"} <= rules
    assert not rules & {"corpus", "model", "mpo", "variant", "task", "finetune"}
