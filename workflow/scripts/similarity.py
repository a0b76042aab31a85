"""CKA (biased and unbiased HSIC) and mutual k-NN alignment on the same shards as LMD
(see lmdecomp.lmd.similarity)."""

import argparse
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from lmdecomp import lmd
from lmdecomp.lmd import similarity
from lmdecomp.atomic import atomic_path
from lmdecomp.params import load_stage_params, model_names

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--embeddings", required=True, help="folder holding one embedding folder per model")
parser.add_argument("--moments", required=True)
parser.add_argument("--out", required=True, help="output Parquet: a, b, split, rows, cka, cka_unbiased, mutual_knn, knn_k")
args = parser.parse_args()

params = load_stage_params(args.params, "similarity")
cfg = params["similarity"]
folders = {name: Path(args.embeddings) / name for name in model_names(params)}
with lmd.blas_threads(params["lmd"]["threads"]):
    rows = similarity.similarity_table(lmd.Moments.load(args.moments), folders, cfg["split"], cfg["max_rows"], cfg["knn_k"])
with atomic_path(args.out) as tmp:
    pq.write_table(pa.Table.from_pylist(rows), tmp)
