"""Read one labelled task into results/tasks/{task}.parquet (+ .json record; see lmdecomp.data.tasks)."""

import argparse
import json

import pyarrow.parquet as pq

from lmdecomp.data import tasks
from lmdecomp.atomic import atomic_path, write_text
from lmdecomp.params import load_stage_params

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--task", required=True, help="a name in finetune.tasks")
parser.add_argument("--out", required=True, help="output results/tasks/{task}.parquet")
parser.add_argument("--record", required=True, help="output results/tasks/{task}.json")
args = parser.parse_args()

cfg = load_stage_params(args.params, "task")["finetune"]
spec = next(t for t in cfg["tasks"] if t["name"] == args.task)
table, record = tasks.load_task(args.task, spec, cfg["seed"], cfg["splits"])
with atomic_path(args.out) as tmp:
    pq.write_table(table, tmp)
write_text(args.record, json.dumps(record, indent=2) + "\n")
