"""Layer-wise leave-one-out LMD over every stored hidden state (embed.layers), matched by
relative depth, with bootstrap intervals (see lmdecomp.lmd.layers)."""

import argparse
from pathlib import Path

import lmdecomp  # noqa: F401  before pyarrow loads numpy: sets OPENBLAS_THREAD_TIMEOUT (see lmdecomp/__init__.py)

import pyarrow as pa
import pyarrow.parquet as pq

from lmdecomp.lmd import layers
from lmdecomp import lmd
from lmdecomp.atomic import atomic_path
from lmdecomp.params import load_stage_params, model_names

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--embeddings", required=True, help="folder holding one embedding folder per model")
parser.add_argument("--sequences", required=True, help="sequences.parquet (its row count sizes the blocks)")
parser.add_argument("--out", required=True,
                    help="output Parquet: model, layer, relative_depth, target, basis, split, r2, alpha, r2_lo, r2_hi")
args = parser.parse_args()

params = load_stage_params(args.params, "lmd_layers")
cfg = params["lmd"]
columns = layers.layer_columns({name: Path(args.embeddings) / name for name in model_names(params)})
with lmd.blas_threads(cfg["threads"]):
    rows = layers.layer_lmd(
        columns, cfg["alpha"], rows_per_block=lmd.rows_per_block(args.sequences, cfg["bootstrap_blocks"]),
        n_boot=cfg["bootstrap"], level=cfg["ci_level"], seed=cfg["seed"], progress=True,
    )
with atomic_path(args.out) as tmp:
    pq.write_table(pa.Table.from_pylist(rows), tmp)
