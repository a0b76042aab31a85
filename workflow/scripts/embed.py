"""Embed the sequences with one model into Parquet shards (see lmdecomp.models.embed)."""

import argparse
import json
from pathlib import Path

from lmdecomp.models import embed, sources
from lmdecomp.params import load_stage_params, model_spec

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--model", required=True, help="a name under models: in the config")
parser.add_argument("--sequences", required=True, help="sequences.parquet from the corpus step")
parser.add_argument("--record", help="model.json of the model stage: its weights must be the ones embedded")
parser.add_argument("--out", required=True, help="output folder for shards and manifest.json")
args = parser.parse_args()

params = load_stage_params(args.params, "embed", key=args.model)
ref = sources.resolve(model_spec(params, args.model))
# Shards are written to a sibling work folder and the finished folder renamed to --out: the
# engines delete --out before a job runs, so only there do a killed job's shards survive.
work = Path(args.out).with_name(f".{Path(args.out).name}.partial")
expected = json.loads(Path(args.record).read_text())["weights_sha256"] if args.record else None
embed.embed_model(ref, args.sequences, args.out, params["embed"], work_dir=work, expected_weights=expected)
