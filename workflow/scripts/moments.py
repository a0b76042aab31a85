"""Accumulate the joint float64 moments of all models' embeddings, in total and, for the
bootstrap, per block of sequences (see lmdecomp.lmd).

With lmd.bootstrap: 0 there are no intervals, so no blocks are kept: the pass is the streaming
one (one width² matrix per split, whatever the number of blocks) and --blocks gets an empty
file (zero blocks). Block moments take 8 · blocks · 3 · width² bytes, which for wide models is
what runs out first (lmd.check_block_memory refuses it with the numbers, before allocating).

One pass by default. With lmd.shards_per_job set, the pass is split: `--part P` covers shards
[P·k, (P+1)·k) (k = shards_per_job) in its own job, and `--reduce` adds the parts, loading one
at a time, into the same files, bit for bit, that one pass writes (without blocks, one pass
then sums each group of k shards on its own and adds the groups in order, as the reduce does)."""

import argparse
from pathlib import Path

from lmdecomp import lmd
from lmdecomp.data import shards
from lmdecomp.params import load_stage_params, model_names

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--params", nargs="+", default=["params.yaml"], help="config files, merged in order")
parser.add_argument("--embeddings", required=True, help="folder holding one embedding folder per model")
parser.add_argument("--sequences", required=True, help="sequences.parquet (its row count sizes the blocks)")
parser.add_argument("--out", required=True, help="output: total moments (.safetensors), or the part's moments")
parser.add_argument("--blocks", help="output: per-block moments (.safetensors); not with --part")
parser.add_argument("--part", type=int, help="scale-out: compute part P of the pass only")
parser.add_argument("--reduce", nargs="+", help="scale-out: the parts' outputs, in part order, to combine")
args = parser.parse_args()

params = load_stage_params(args.params, "moments")
cfg = params["lmd"]
folders = {name: Path(args.embeddings) / name for name in model_names(params)}
with_blocks = cfg["bootstrap"] > 0
per_block = lmd.rows_per_block(args.sequences, cfg["bootstrap_blocks"])
n_shards = len(shards.read_manifest(next(iter(folders.values())))["shards"])


def accumulate(shard_range=None):
    if with_blocks:
        return lmd.accumulate_block_moments(folders, per_block, progress=True, shard_range=shard_range)
    group = cfg.get("shards_per_job") if shard_range is None else None
    return lmd.accumulate_moments(folders, progress=True, shard_range=shard_range, group_shards=group)


with lmd.blas_threads(cfg["threads"]):
    if args.part is not None:
        per_job = cfg.get("shards_per_job")
        if not per_job:
            parser.error("--part needs lmd.shards_per_job in the config")
        lo = args.part * per_job
        if lo >= n_shards:
            raise SystemExit(f"part {args.part} starts at shard {lo}, but the embeddings have {n_shards} shards; "
                             "the DAG plans ceil(corpus.n_sequences / embed.shard_rows) shards: rerun the embed step")
        accumulate((lo, min(lo + per_job, n_shards))).save(args.out)
    else:
        if args.blocks is None:
            parser.error("--blocks is required unless --part is given")
        if args.reduce:
            if -(-n_shards // cfg["shards_per_job"]) != len(args.reduce):
                raise SystemExit(f"{len(args.reduce)} parts for {n_shards} shards at lmd.shards_per_job="
                                 f"{cfg['shards_per_job']}; rerun the moments_part jobs")
            # generators: one part in memory at a time, whatever the number of parts
            if with_blocks:
                result = lmd.reduce_block_moments(lmd.BlockMoments.load(p) for p in args.reduce)
            else:
                result = lmd.reduce_moments(lmd.Moments.load(p) for p in args.reduce)
        else:
            result = accumulate()
        if with_blocks:
            result.total().save(args.out)
            result.save(args.blocks)
        else:
            result.save(args.out)
            lmd.BlockMoments.zeros(result.names, result.dims, 0).save(args.blocks)
