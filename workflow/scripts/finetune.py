"""Fine-tune one variant on one task with every seed in finetune.seeds (see lmdecomp.mpo.finetune);
writes metrics.json and the test predictions of each seed (predictions.parquet)."""

import argparse
import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lmdecomp.models import heap
from lmdecomp.mpo import finetune, probe, variants
from lmdecomp.atomic import atomic_path, write_text
from lmdecomp.params import load_stage_params

heap.huge_pages_for_large_tensors()  # before the first tensor: PyTorch reads the switch once (lmdecomp.models.heap)

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--variant", required=True, help="a name under finetune.variants")
parser.add_argument("--task", required=True, help="results/tasks/{task}.parquet")
parser.add_argument("--record", required=True, help="results/tasks/{task}.json: the task's kind, metric and labels")
parser.add_argument("--model", required=True, help="the variant's model folder results/variants/{model}")
parser.add_argument("--out", required=True, help="output metrics.json")
parser.add_argument("--predictions", required=True, help="output predictions.parquet: seed, index, prediction, gold")
args = parser.parse_args()

cfg = load_stage_params(args.params, "finetune")["finetune"]
torch.set_num_threads(cfg["threads"])
spec = next(v for v in cfg["variants"] if v["name"] == args.variant)
model_variant, trainable = spec["model"], spec.get("trainable", "all")
record = json.loads(Path(args.record).read_text())
task_name = record.get("task", Path(args.task).stem)
task = finetune.task_info(record, next((t for t in cfg["tasks"] if t["name"] == task_name), None))
data = finetune.task_examples(pl.read_parquet(args.task), task)
seeds = finetune.seed_list(cfg["seeds"])
if trainable == "probe":
    # a convex fit on frozen features: no seed enters it, so one fit serves every seed
    model, tokenizer = variants.load_variant(args.model)
    fit = probe.linear_probe(model.base_model, tokenizer, data, task, cfg["max_length"], cfg.get("device", "auto"))
    runs = {seed: fit for seed in seeds}
else:
    runs = {}
    for seed in seeds:
        model, tokenizer = variants.load_variant(args.model)  # fresh weights: fine-tuning trains them in place
        settings = finetune.FinetuneConfig(epochs=cfg["epochs"], patience=cfg["patience"], batch_size=cfg["batch_size"],
                                           learning_rate=spec.get("learning_rate", cfg["learning_rate"]),
                                           max_length=cfg["max_length"], seed=seed, trainable=trainable,
                                           device=cfg.get("device", "auto"), gate_learning_rate=spec.get("gate_learning_rate"))
        runs[seed] = finetune.finetune(model.base_model, tokenizer, data, task, settings)
metrics, predictions = finetune.combine_seeds(runs, data["test"].label)
metrics.update(task=task_name, variant=args.variant, model_variant=model_variant, trainable=trainable,
               layers=model.config.num_hidden_layers,
               learning_rate=None if trainable == "probe" else spec.get("learning_rate", cfg["learning_rate"]))
if trainable == "probe":
    metrics["probe_l2"] = fit["probe_l2"]
value_type = pa.int64() if task.kind == "classification" else pa.float64()
table = pa.table({"seed": pa.array(predictions["seed"], pa.int64()), "index": pa.array(predictions["index"], pa.int64()),
                  "prediction": pa.array(predictions["prediction"], value_type), "gold": pa.array(predictions["gold"], value_type)})
with atomic_path(args.predictions) as tmp:
    pq.write_table(table, tmp)
write_text(args.out, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
