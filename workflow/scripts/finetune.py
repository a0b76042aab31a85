"""Fine-tune one variant on one task (see lmdecomp.mpo.finetune); writes metrics.json."""

import argparse
import json

import polars as pl
import torch

from lmdecomp.mpo import finetune, variants
from lmdecomp.atomic import write_text
from lmdecomp.params import load_stage_params

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--variant", required=True, help="a name under finetune.variants")
parser.add_argument("--task", required=True, help="results/tasks/{task}.parquet")
parser.add_argument("--model", required=True, help="the variant's model folder results/variants/{model}")
parser.add_argument("--out", required=True, help="output metrics.json")
args = parser.parse_args()

cfg = load_stage_params(args.params, "finetune")["finetune"]
torch.set_num_threads(cfg["threads"])
spec = next(v for v in cfg["variants"] if v["name"] == args.variant)
model_variant, trainable = spec["model"], spec.get("trainable", "all")
model, tokenizer = variants.load_variant(args.model)
table = pl.read_parquet(args.task)
n_classes = int(table["label_id"].max()) + 1
data = {s: (table.filter(pl.col("split") == s)["text"].to_list(), table.filter(pl.col("split") == s)["label_id"].to_list())
        for s in ("train", "val", "test")}
settings = finetune.FinetuneConfig(epochs=cfg["epochs"], patience=cfg["patience"], batch_size=cfg["batch_size"],
                                   learning_rate=cfg["learning_rate"], max_length=cfg["max_length"], seed=cfg["seed"],
                                   trainable=trainable, device=cfg.get("device", "auto"))
metrics = finetune.finetune(model.base_model, tokenizer, data, n_classes, settings)
metrics.update(variant=args.variant, model_variant=model_variant, trainable=trainable, layers=model.config.num_hidden_layers)
write_text(args.out, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
