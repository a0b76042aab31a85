"""Draw the LMD figures from the result tables (see lmdecomp.plots)."""

import argparse

import polars as pl

from lmdecomp import plots

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--pairwise", required=True)
parser.add_argument("--loo", required=True)
parser.add_argument("--pairwise-png", required=True)
parser.add_argument("--loo-png", required=True)
args = parser.parse_args()

plots.pairwise_heatmap(pl.read_parquet(args.pairwise), args.pairwise_png)
plots.loo_bars(pl.read_parquet(args.loo), args.loo_png)
