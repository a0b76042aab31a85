"""Draw the LMD figures from the result tables (see lmdecomp.plots)."""

import argparse

import polars as pl

from lmdecomp import plots
from lmdecomp.atomic import atomic_path

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--pairwise", required=True)
parser.add_argument("--loo", required=True)
parser.add_argument("--selection", required=True)
parser.add_argument("--similarity", required=True)
parser.add_argument("--layers", required=True, help="layer-wise leave-one-out table (lmd_layers)")
parser.add_argument("--out", required=True, help="folder for the PNG figures")
parser.add_argument("--loo-table", required=True, help="output CSV of the test-split leave-one-out R² (for dvc plots)")
args = parser.parse_args()

pairwise = pl.read_parquet(args.pairwise)
plots.pairwise_heatmap(pairwise, f"{args.out}/lmd_pairwise.png")
plots.loo_bars(pl.read_parquet(args.loo), f"{args.out}/lmd_loo.png")
plots.selection_curves(pl.read_parquet(args.selection), f"{args.out}/lmd_selection.png")
plots.lmd_vs_similarity(pairwise, pl.read_parquet(args.similarity), f"{args.out}/lmd_vs_cka.png")
plots.layer_curves(pl.read_parquet(args.layers), f"{args.out}/lmd_layers.png")
loo = pl.read_parquet(args.loo).filter(pl.col("split") == "test").sort("target")
columns = ["target", "r2"] + [c for c in ("r2_lo", "r2_hi", "alpha") if c in loo.columns]
with atomic_path(args.loo_table) as tmp:
    loo.select(columns).with_columns(pl.col(pl.Float64).round(6)).write_csv(tmp)
