"""Draw the LMD figures from the result tables (see lmdecomp.plots)."""

import argparse

import polars as pl

from lmdecomp import plots

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--pairwise", required=True)
parser.add_argument("--loo", required=True)
parser.add_argument("--selection", required=True)
parser.add_argument("--similarity", required=True)
parser.add_argument("--out", required=True, help="folder for the PNG figures")
args = parser.parse_args()

pairwise = pl.read_parquet(args.pairwise)
plots.pairwise_heatmap(pairwise, f"{args.out}/lmd_pairwise.png")
plots.loo_bars(pl.read_parquet(args.loo), f"{args.out}/lmd_loo.png")
plots.selection_curves(pl.read_parquet(args.selection), f"{args.out}/lmd_selection.png")
plots.lmd_vs_similarity(pairwise, pl.read_parquet(args.similarity), f"{args.out}/lmd_vs_cka.png")
