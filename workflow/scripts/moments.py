"""Accumulate the joint float64 moments of all models' embeddings, per block of sequences
(for the bootstrap) and in total (see lmdecomp.lmd)."""

import argparse
from pathlib import Path

from lmdecomp import lmd
from lmdecomp.params import load_params, model_names

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--embeddings", required=True, help="folder holding one embedding folder per model")
parser.add_argument("--sequences", required=True, help="sequences.parquet (its row count sizes the blocks)")
parser.add_argument("--out", required=True, help="output: total moments (.safetensors)")
parser.add_argument("--blocks", required=True, help="output: per-block moments (.safetensors)")
args = parser.parse_args()

params = load_params(args.params)
folders = {name: Path(args.embeddings) / name for name in model_names(params)}
with lmd.blas_threads(params["lmd"]["threads"]):
    blocks = lmd.accumulate_block_moments(
        folders, rows_per_block=lmd.rows_per_block(args.sequences, params["lmd"]["bootstrap_blocks"]), progress=True
    )
    blocks.total().save(args.out)
    blocks.save(args.blocks)
