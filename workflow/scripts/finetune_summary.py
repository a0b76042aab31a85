"""Collect every fine-tuning run into one CSV table and draw the trade-off figure."""

import argparse
import json
from pathlib import Path

import polars as pl

from lmdecomp.mpo import finetune
from lmdecomp import plots
from lmdecomp.atomic import atomic_path
from lmdecomp.params import load_stage_params

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--finetune", required=True, help="folder holding {task}/{variant}/metrics.json")
parser.add_argument("--table", required=True, help="output CSV")
parser.add_argument("--headline", required=True, help="output CSV: the MPOBERT claim per task and deep variant")
parser.add_argument("--figure", required=True, help="output PNG")
args = parser.parse_args()

cfg = load_stage_params(args.params, "finetune_summary")["finetune"]
KEYS = ("layers", "parameters", "trainable_parameters", "test_accuracy", "test_macro_f1", "val_accuracy", "chance_accuracy")
rows = []
for task in (t["name"] for t in cfg["tasks"]):
    for variant in (v["name"] for v in cfg["variants"]):
        m = json.loads((Path(args.finetune) / task / variant / "metrics.json").read_text())
        rows.append({"task": task, "variant": variant, **{k: round(m[k], 6) for k in KEYS}})
table = pl.DataFrame(rows).sort("task", "variant")
claims = pl.DataFrame(finetune.headline(table.to_dicts()))
with atomic_path(args.table) as tmp:
    table.write_csv(tmp)
with atomic_path(args.headline) as tmp:
    claims.write_csv(tmp)
plots.finetune_tradeoff(table, args.figure, claims)
