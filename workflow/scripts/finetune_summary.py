"""Collect every fine-tuning run into one CSV table with bootstrap intervals, compare each deep
variant with the dense base by a paired bootstrap (the headline verdicts), and draw the figure."""

import argparse
import json
from pathlib import Path

import numpy as np
import polars as pl

from lmdecomp import plots
from lmdecomp.atomic import atomic_path
from lmdecomp.mpo import finetune, intervals
from lmdecomp.params import load_stage_params

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--finetune", required=True, help="folder holding {task}/{variant}/metrics.json and predictions.parquet")
parser.add_argument("--table", required=True, help="output CSV")
parser.add_argument("--headline", required=True, help="output CSV: the MPOBERT claim per task and deep variant")
parser.add_argument("--figure", required=True, help="output PNG")
args = parser.parse_args()

cfg = load_stage_params(args.params, "finetune_summary")["finetune"]
boot = cfg["bootstrap"]
FIRST = ("metric", "layers", "parameters", "trainable_parameters")  # columns before the test metric's, then:
LAST = ("val_metric", "chance_metric", "test_accuracy", "test_macro_f1")
# baselines frame the claims and make none: the probe (floor) and the deep dense model (ceiling)
BASELINES = [v["name"] for v in cfg["variants"] if v.get("trainable") == "probe" or v["model"] == "deep"]
CEILING = next((v["name"] for v in cfg["variants"] if v["model"] == "deep" and v.get("trainable", "all") == "all"), None)


def read_runs(task: str) -> tuple[list[dict], np.ndarray, finetune.TaskInfo]:
    """Every variant's metrics and (seeds, n) test predictions on ``task``, the gold labels
    (the same for all: one task table), and how the task is scored."""
    runs, gold, info = [], None, None
    for variant in (v["name"] for v in cfg["variants"]):
        folder = Path(args.finetune) / task / variant
        m = json.loads((folder / "metrics.json").read_text())
        scored = finetune.TaskInfo(kind=m["kind"], metric=m["metric"], n_classes=m.get("n_classes", 0), positive=m.get("positive_class", 0))
        _, pred, g = finetune.prediction_matrix(pl.read_parquet(folder / "predictions.parquet").to_dict(as_series=False))
        if gold is not None and (not np.array_equal(g, gold) or scored != info):
            raise ValueError(f"{folder}: not the test examples or metric of the other variants on task {task!r}; rerun its finetune jobs")
        gold, info = g, scored
        runs.append({"variant": variant, **{k: m.get(k) for k in FIRST + LAST}, "predictions": pred})
    return runs, gold, info


rows, claims = [], []
for task in (t["name"] for t in cfg["tasks"]):
    runs, gold, info = read_runs(task)
    stats, task_claims = intervals.compare_task(task, runs, gold, info.score, boot["replicates"], boot["ci_level"], boot["seed"],
                                                  resample_seeds=boot["resample_seeds"], ceiling=CEILING, baselines=BASELINES)
    claims += task_claims
    for r in runs:
        rows.append({"task": task, "variant": r["variant"], **{k: r[k] for k in FIRST}, **stats[r["variant"]],
                     **{k: r[k] for k in LAST}, "ci_level": boot["ci_level"], "test_examples": len(gold)})
table = pl.DataFrame(rows).with_columns(pl.col(pl.Float64).round(6)).sort("task", "variant")
headline = pl.DataFrame(claims, schema=intervals.CLAIM_COLUMNS)
with atomic_path(args.table) as tmp:
    table.write_csv(tmp)
with atomic_path(args.headline) as tmp:
    headline.write_csv(tmp)
plots.finetune_tradeoff(table, args.figure, headline)
