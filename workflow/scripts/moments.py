"""Accumulate the joint float64 moments of all models' embeddings (see lmdecomp.lmd)."""

import argparse
from pathlib import Path

from lmdecomp import lmd
from lmdecomp.params import load_params, model_names

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--embeddings", required=True, help="folder holding one embedding folder per model")
parser.add_argument("--out", required=True, help="output .safetensors file")
args = parser.parse_args()

params = load_params(args.params)
folders = {name: Path(args.embeddings) / name for name in model_names(params)}
with lmd.blas_threads(params["lmd"]["threads"]):
    lmd.accumulate_moments(folders, progress=True).save(args.out)
