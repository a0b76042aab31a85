"""MPO trade-off of one model: spectra, truncation ladder, val masked-LM loss (see lmdecomp.mpo.compression)."""

import argparse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import AutoModelForMaskedLM

from lmdecomp.mpo import compression
from lmdecomp.data import corpus
from lmdecomp.models import sources
from lmdecomp.atomic import atomic_dir
from lmdecomp.params import load_stage_params, model_spec

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--model", required=True, help="a name under models: with a masked-LM head")
parser.add_argument("--sequences", required=True, help="sequences.parquet (val texts for the loss)")
parser.add_argument("--out", required=True, help="output folder results/mpo/{model}")
args = parser.parse_args()

params = load_stage_params(args.params, "mpo", item=args.model)
cfg = params["mpo"]
if params["embed"].get("threads"):  # 0 or absent: torch's default, as for the embed stage
    torch.set_num_threads(params["embed"]["threads"])
ref = sources.resolve(model_spec(params, args.model))
torch.manual_seed(0)
model = AutoModelForMaskedLM.from_pretrained(ref.location, revision=ref.revision).eval()
tokenizer = ref.load_tokenizer()
(val_texts,) = corpus.split_texts(args.sequences, ("val",))
spectrum, ladder = compression.spectrum_and_ladder(model, cfg["budgets"], cfg["n_cores"])
loss = compression.loss_curve(model, tokenizer, val_texts, cfg["loss_budgets"], cfg["n_cores"], cfg)
with atomic_dir(args.out) as tmp:
    for name, rows in (("spectrum", spectrum), ("ladder", ladder), ("loss", loss)):
        pq.write_table(pa.Table.from_pylist(rows), Path(tmp) / f"{name}.parquet")
