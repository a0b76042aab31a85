"""Pairwise, leave-one-out and greedy-selection LMD fits from the moments, with bootstrap
confidence intervals from the block moments (see lmdecomp.lmd)."""

import argparse
import json

import lmdecomp  # noqa: F401  before pyarrow loads numpy: sets OPENBLAS_THREAD_TIMEOUT (see lmdecomp/__init__.py)

import pyarrow as pa
import pyarrow.parquet as pq

from lmdecomp import lmd
from lmdecomp.atomic import atomic_path, write_text
from lmdecomp.params import load_stage_params

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--moments", required=True)
parser.add_argument("--blocks", required=True)
parser.add_argument("--pairwise", required=True, help="output Parquet: basis, target, split, r2, alpha, r2_lo, r2_hi")
parser.add_argument("--loo", required=True, help="output Parquet: target, split, r2, alpha, r2_lo, r2_hi")
parser.add_argument("--selection", required=True,
                    help="output Parquet: target, k, added_model, alpha, val_r2, test_r2 (+ _lo/_hi intervals)")
parser.add_argument("--metrics", required=True, help="output JSON (DVC metrics)")
args = parser.parse_args()

cfg = load_stage_params(args.params, "lmd_fit")["lmd"]
moments = lmd.Moments.load(args.moments)
blocks = lmd.BlockMoments.load(args.blocks) if cfg["bootstrap"] > 0 else None
if blocks is not None and len(blocks) == 0:
    raise SystemExit(f"{args.blocks} holds no blocks (the moments stage ran with lmd.bootstrap: 0), "
                     f"but lmd.bootstrap is {cfg['bootstrap']}: rerun the moments stage")
with lmd.blas_threads(cfg["threads"]):
    pairwise = lmd.fit_pairwise(moments, cfg["alpha"])
    loo = lmd.fit_leave_one_out(moments, cfg["alpha"])
    selection = [row for target in moments.names for row in lmd.greedy_selection(moments, target, cfg["alpha"])]
    if cfg["bootstrap"] > 0:
        # one cache for the three tables: a selection's first and last steps are the pairwise
        # and leave-one-out fits, and a path's steps share their factorisations
        ci = dict(n_boot=cfg["bootstrap"], level=cfg["ci_level"], seed=cfg["seed"],
                  cache=lmd.BootstrapCache(blocks, cfg["bootstrap"], cfg["seed"]))
        pairwise = lmd.add_confidence_intervals(pairwise, blocks, **ci)
        selection = lmd.add_selection_intervals(selection, blocks, **ci)
        loo = lmd.add_confidence_intervals(loo, blocks, **ci)
for rows, path in ((pairwise, args.pairwise), (loo, args.loo), (selection, args.selection)):
    with atomic_path(path) as tmp:
        pq.write_table(pa.Table.from_pylist(rows), tmp)
metrics = {**lmd.summary_metrics(pairwise, loo), "rows": moments.info}  # rows: sequences, or words kept/dropped
write_text(args.metrics, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
