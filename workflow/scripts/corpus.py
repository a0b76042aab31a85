"""Sample the corpus into results/corpus/sequences.parquet (see lmdecomp.data.corpus)."""

import argparse
import json
import sys

from lmdecomp.data import corpus
from lmdecomp.models import sources
from lmdecomp.params import load_stage_params

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--out", required=True, help="output Parquet file")
args = parser.parse_args()

cfg = load_stage_params(args.params, "corpus")["corpus"]
tokenizer = sources.resolve({"name": "reference_tokenizer", **cfg["reference_tokenizer"]}).load_tokenizer()
table, report = corpus.build_sequences(cfg, tokenizer, progress=True)
corpus.write_sequences(table, args.out)
print(json.dumps(report, indent=2), file=sys.stderr)
