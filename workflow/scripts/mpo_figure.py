"""Draw the MPO trade-off figure from results/mpo/{model}/ (see lmdecomp.plots)."""

import argparse
from pathlib import Path

import polars as pl

from lmdecomp import plots
from lmdecomp.params import load_stage_params

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--mpo", required=True, help="folder holding one results folder per decomposed model")
parser.add_argument("--out", required=True, help="output PNG")
args = parser.parse_args()

names = load_stage_params(args.params, "mpo_figure")["mpo"]["models"]
tables = {n: {t: pl.read_parquet(Path(args.mpo) / n / f"{t}.parquet") for t in ("ladder", "loss")} for n in names}
plots.mpo_tradeoff(tables, args.out)
