"""Prepare one model: pretrain or reassemble it if needed, and record it (see lmdecomp.models)."""

import argparse
import json

import torch

from lmdecomp.data import corpus
from lmdecomp.models import heap, sources
from lmdecomp.atomic import write_text
from lmdecomp.params import load_stage_params, model_spec

heap.huge_pages_for_large_tensors()  # before the first tensor: PyTorch reads the switch once (lmdecomp.models.heap)

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--model", required=True, help="a name under models: in the config")
parser.add_argument("--sequences", required=True, help="sequences.parquet (pretraining reads its train/val text)")
parser.add_argument("--out", required=True, help="output folder results/models/{model}")
parser.add_argument("--metrics", required=True, help="output JSON results/metrics/models/{model}.json (a DVC metric)")
args = parser.parse_args()

params = load_stage_params(args.params, "model", key=args.model)
spec = model_spec(params, args.model)
train_texts = val_texts = None
if "pretrain" in spec:
    torch.set_num_threads(params["zoo"]["threads"])
    train_texts, val_texts = corpus.split_texts(args.sequences, ("train", "val"))
record = sources.prepare_model(spec, args.out, train_texts, val_texts, params["zoo"].get("device", "auto"))
# Pretrained zoo models: val masked-LM loss and perplexity beside the unigram baseline of
# the same tokenizer on the same positions; every model: its size.
KEYS = ("val_loss", "val_perplexity", "unigram_perplexity", "final_train_loss", "steps")
metrics = {"parameters": record["parameters"], **{k: record["pretrain"][k] for k in KEYS if k in record.get("pretrain", {})}}
write_text(args.metrics, json.dumps(metrics, indent=2, sort_keys=True) + "\n")
