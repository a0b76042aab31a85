"""Bad input stops early, through the real command lines, with a message that names the bad
thing and how to fix it, and leaves no half-written artifact behind."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import REPO, write_embeddings
from lmdecomp.data import shards
from lmdecomp.params import load_params


def script(name, *args):
    """Run workflow/scripts/<name>.py from the repository root, as both engines do."""
    return subprocess.run([sys.executable, f"workflow/scripts/{name}.py", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def params_with(tmp_path, **sections):
    merged = load_params([REPO / "params.yaml", REPO / "config/smoke.yaml"])
    for key, value in sections.items():
        merged[key] = value
    if "models" in sections:  # keep the keys that name models pointing at listed ones
        names = list(sections["models"])
        merged["mpo"]["models"] = [m for m in merged["mpo"]["models"] if m in names]
        merged["mpobert"]["base"] = names[0]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(merged, sort_keys=False))
    return path, merged


def two_models(tmp_path, rows=120, dims=(6, 4), seed=0, split=None):
    rng = np.random.default_rng(seed)
    ids = np.arange(rows, dtype=np.int64)
    split = split if split is not None else np.array(["train", "val", "test"] * (rows // 3), dtype=object)
    root = tmp_path / "embeddings"
    for name, dim in zip(("a", "b"), dims):
        write_embeddings(root / name, name, ids, split, rng.normal(size=(rows, dim)).astype(np.float32), 50)
    return root


def run_moments(tmp_path, root, params):
    seqs = tmp_path / "sequences.parquet"
    if not seqs.exists():
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.table({"seq_id": list(range(120))}), seqs)
    out = tmp_path / "lmd" / "moments.safetensors"
    proc = script("moments", "--params", params, "--embeddings", root, "--sequences", seqs,
                  "--out", out, "--blocks", tmp_path / "lmd" / "blocks.safetensors")
    return proc, out


@pytest.fixture()
def ab_params(tmp_path):
    path, _ = params_with(tmp_path, models={"a": {"path": "a"}, "b": {"path": "b"}})
    return path


def assert_failed(proc, *fragments):
    assert proc.returncode != 0, proc.stdout + proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, f"{fragment!r} not in:\n{proc.stderr[-2000:]}"


def test_unknown_key_and_wrong_type_in_params(tmp_path):
    out = tmp_path / "seq.parquet"
    bad, _ = params_with(tmp_path, lmd={"alpha": 0.1, "threads": 2, "bootstrap": 0, "bootstrap_blocks": 2,
                                        "ci_level": 0.9, "seed": 0, "aplha": 1})
    assert_failed(script("corpus", "--params", bad, "--out", out), "lmd", "'aplha' was unexpected")
    merged = load_params([REPO / "params.yaml"])
    merged["corpus"]["seq_len"] = "long"
    (tmp_path / "p2.yaml").write_text(yaml.safe_dump(merged))
    assert_failed(script("corpus", "--params", tmp_path / "p2.yaml", "--out", out), "corpus.seq_len", "'long'")
    assert not out.exists()


def test_unknown_model_source(tmp_path):
    bad, _ = params_with(tmp_path, models={"a": {"ftp": "x"}, "b": {"path": "p"}})
    out = tmp_path / "models" / "a"
    metrics = tmp_path / "a.json"
    assert_failed(script("model", "--params", bad, "--model", "a", "--sequences", "x", "--out", out, "--metrics", metrics),
                  "models.a", "'ftp' was unexpected")
    assert not out.exists() and not metrics.exists()


def test_model_folder_without_tokenizer(tmp_path, tiny_model_dir):
    folder = tmp_path / "no-tok"
    folder.mkdir()
    for f in ("config.json", "model.safetensors"):
        (folder / f).write_bytes((tiny_model_dir / f).read_bytes())
    bad, _ = params_with(tmp_path, models={"nt": {"path": str(folder)}, "b": {"path": "p"}})
    out = tmp_path / "models" / "nt"
    metrics = tmp_path / "nt.json"
    assert_failed(script("model", "--params", bad, "--model", "nt", "--sequences", "x", "--out", out, "--metrics", metrics),
                  "model 'nt'", "has no tokenizer", "tokenizer.save_pretrained")
    assert not out.exists() and not metrics.exists()


@pytest.mark.slow
def test_empty_corpus_and_no_train_rows(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("  \n")
    _, merged = params_with(tmp_path)
    corpus = {**merged["corpus"], "sources": [{"name": "e", "path": str(empty)}]}
    bad, _ = params_with(tmp_path, corpus=corpus)
    out = tmp_path / "seq.parquet"
    assert_failed(script("corpus", "--params", bad, "--out", out), "corpus is empty")
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"{i}.txt").write_text(f"Document number {i} has a few words in it, enough for a chunk. " * 3)
    corpus = {**merged["corpus"], "sources": [{"name": "d", "path": str(docs)}], "n_sequences": None,
              "min_tokens": 8, "splits": {"train": 0.0001, "val": 0.4999, "test": 0.5}}
    bad, _ = params_with(tmp_path, corpus=corpus)
    assert_failed(script("corpus", "--params", bad, "--out", out), "no sequences fell into the train split")
    assert not out.exists()


def test_two_corpus_sources_with_one_name(tmp_path):
    _, merged = params_with(tmp_path)
    source = merged["corpus"]["sources"][0]
    bad, _ = params_with(tmp_path, corpus={**merged["corpus"], "sources": [source, {**source, "glob": "tech/*.txt"}]})
    out = tmp_path / "seq.parquet"
    assert_failed(script("corpus", "--params", bad, "--out", out),
                  f"more than one source is named {source['name']!r}", "give every source its own name")
    assert not out.exists()


def test_non_utf8_bytes_are_counted_not_fatal(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "latin1.txt").write_bytes(("Caf\xe9 in Gen\xe8ve, " * 40).encode("latin-1"))
    (docs / "fine.txt").write_text("Plain text that decodes as UTF-8 without trouble. " * 10)
    _, merged = params_with(tmp_path)
    corpus = {**merged["corpus"], "sources": [{"name": "d", "path": str(docs)}], "n_sequences": None,
              "min_tokens": 4, "splits": {"train": 0.98, "val": 0.01, "test": 0.01}}
    ok, _ = params_with(tmp_path, corpus=corpus)
    out = tmp_path / "seq.parquet"
    proc = script("corpus", "--params", ok, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stderr[proc.stderr.index("{"):])["non_utf8_documents"] == 1
    assert out.exists()


@pytest.mark.parametrize("damage,message", [
    ("truncate", "is corrupt or truncated"),
    ("bitflip", "is corrupt or truncated"),
    ("old_schema", "schema_version 0"),
])
def test_damaged_shards(tmp_path, ab_params, damage, message):
    root = two_models(tmp_path)
    part = root / "b" / "part-00001.parquet"
    if damage == "truncate":
        part.write_bytes(part.read_bytes()[:-64])
    elif damage == "bitflip":
        data = bytearray(part.read_bytes())
        data[len(data) // 2] ^= 0x10
        part.write_bytes(bytes(data))
    else:
        manifest = json.loads((root / "b" / shards.MANIFEST).read_text())
        manifest["schema_version"] = 0
        (root / "b" / shards.MANIFEST).write_text(json.dumps(manifest))
    proc, out = run_moments(tmp_path, root, ab_params)
    assert_failed(proc, message, "rerun the embed step")
    assert not out.exists() and not (tmp_path / "lmd" / "blocks.safetensors").exists()


def test_nan_or_inf_in_a_shard(tmp_path, ab_params):
    rng = np.random.default_rng(1)
    ids = np.arange(120, dtype=np.int64)
    split = np.array(["train", "val", "test"] * 40, dtype=object)
    emb = rng.normal(size=(120, 4)).astype(np.float32)
    emb[77, 2] = np.inf
    write_embeddings(tmp_path / "embeddings" / "a", "a", ids, split, rng.normal(size=(120, 6)).astype(np.float32), 50)
    write_embeddings(tmp_path / "embeddings" / "b", "b", ids, split, emb, 50)
    proc, out = run_moments(tmp_path, tmp_path / "embeddings", ab_params)
    assert_failed(proc, "model 'b'", "NaN or Inf", "77")
    assert not out.exists()


def test_models_with_different_seq_ids(tmp_path, ab_params):
    rng = np.random.default_rng(2)
    split = np.array(["train", "val", "test"] * 40, dtype=object)
    write_embeddings(tmp_path / "embeddings" / "a", "a", np.arange(120), split, rng.normal(size=(120, 6)).astype(np.float32), 50)
    write_embeddings(tmp_path / "embeddings" / "b", "b", np.arange(120) + 1000, split, rng.normal(size=(120, 4)).astype(np.float32), 50)
    proc, out = run_moments(tmp_path, tmp_path / "embeddings", ab_params)
    assert_failed(proc, "different seq_id sets", "re-embed both")
    assert not out.exists()


def test_too_few_train_rows_for_the_basis_without_regularisation(tmp_path):
    split = np.array(["train"] * 5 + ["val", "test"] * 20 + ["val"] * 75, dtype=object)
    root = two_models(tmp_path, dims=(8, 4), split=split)
    _, merged = params_with(tmp_path)
    lmd_cfg = {**merged["lmd"], "alpha": 0.0, "bootstrap": 0}
    params, _ = params_with(tmp_path, models={"a": {"path": "a"}, "b": {"path": "b"}}, lmd=lmd_cfg)
    proc, moments = run_moments(tmp_path, root, params)
    assert proc.returncode == 0, proc.stderr
    outs = {k: tmp_path / "lmd" / f"{k}.parquet" for k in ("pairwise", "loo", "selection")}
    fit = script("lmd_fit", "--params", params, "--moments", moments, "--blocks", tmp_path / "lmd" / "blocks.safetensors",
                 "--pairwise", outs["pairwise"], "--loo", outs["loo"], "--selection", outs["selection"],
                 "--metrics", tmp_path / "lmd" / "metrics.json")
    assert_failed(fit, "5 train rows for a basis 8 wide", "lmd.alpha > 0")
    assert not any(p.exists() for p in outs.values())
