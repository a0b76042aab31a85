"""Build one model variant from the MPOBERT base and pretrain it (see lmdecomp.mpo.variants)."""

import argparse
from pathlib import Path

import torch

from lmdecomp.data import corpus
from lmdecomp.models import heap, sources
from lmdecomp.mpo import variants
from lmdecomp.atomic import atomic_dir
from lmdecomp.params import load_stage_params, model_spec

heap.huge_pages_for_large_tensors()  # before the first tensor: PyTorch reads the switch once (lmdecomp.models.heap)

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--variant", required=True, choices=variants.MODEL_VARIANTS)
parser.add_argument("--sequences", required=True, help="sequences.parquet (train/val text)")
parser.add_argument("--out", required=True, help="output folder results/variants/{variant}")
args = parser.parse_args()

params = load_stage_params(args.params, "variant")
cfg = params["mpobert"]
torch.set_num_threads(cfg["threads"])
ref = sources.resolve(model_spec(params, cfg["base"]))
torch.manual_seed(0)
from transformers import AutoModelForMaskedLM  # noqa: E402

base = AutoModelForMaskedLM.from_pretrained(ref.location, revision=ref.revision).eval()
tokenizer = ref.load_tokenizer()
train_texts, val_texts = corpus.split_texts(args.sequences, ("train", "val"))
work = Path(args.out).with_name(Path(args.out).name + ".work")
with atomic_dir(args.out) as tmp:
    variants.make_variant(args.variant, base, tokenizer, train_texts, val_texts, cfg, tmp, work)
if work.exists():
    import shutil

    shutil.rmtree(work)
