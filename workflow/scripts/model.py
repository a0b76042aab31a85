"""Prepare one model: pretrain or reassemble it if needed, and record it (see lmdecomp.models)."""

import argparse

import torch

from lmdecomp import corpus, models
from lmdecomp.params import load_params, model_spec

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--model", required=True, help="a name under models: in the config")
parser.add_argument("--sequences", required=True, help="sequences.parquet (pretraining reads its train/val text)")
parser.add_argument("--out", required=True, help="output folder results/models/{model}")
args = parser.parse_args()

params = load_params(args.params)
spec = model_spec(params, args.model)
train_texts = val_texts = None
if "pretrain" in spec:
    torch.set_num_threads(params["zoo"]["threads"])
    train_texts, val_texts = corpus.split_texts(args.sequences, ("train", "val"))
models.prepare_model(spec, args.out, train_texts, val_texts)
