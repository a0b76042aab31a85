"""Why lightweight fine-tuning of MPOBERT (``trainable: auxiliary``) stays near chance.

Loads a finished variant (``results/variants/mpobert``, read only) and a task table
(``results/tasks/bbc.parquet``) and fine-tunes the variant's encoder under several *recipes*
within one step budget. A recipe maps parameter groups to learning-rate multipliers; a group
it does not name stays frozen. The groups (every distinct parameter in exactly one):
``head`` (the classifier), ``gates`` (MPOBERT's residual gates), ``adapters``, ``auxiliary``
(MPO cores other than the shared central ones), ``central`` (the shared central tensors),
``layernorm``, ``bias`` (the other biases), ``embeddings`` and ``other``.

The training loop is that of :func:`lmdecomp.mpo.finetune.finetune` (written out here so that
every step can be measured): mean pooling over real tokens, dropout 0.1, a linear head seeded
alike, AdamW (weight decay 0.01) with linear warmup over 10 % of the steps and linear decay,
gradient clipping at 1 over the trainable parameters, a seeded example order per epoch, the
validation accuracy after each epoch and the test accuracy of the best validation epoch.

Reported per recipe: the trainable parameters (names and counts per group), every group's
gradient norm before clipping at the first steps and the clip factor ``min(1, 1/‖g‖)``, the
learning rate per group, ``‖Δθ‖/‖θ₀‖`` per group, the gate values before and after, the train
loss of every step, and val/test accuracy. Beside them a linear probe: multinomial logistic
regression (full-batch L-BFGS, L2 strength picked on val) on the frozen encoder's mean-pooled
features, i.e. what the frozen model's features allow without any encoder training.

Usage (2 threads or fewer; about a minute per recipe for the default 8-layer, 64-wide MPOBERT)::

    python benchmarks/diagnose_aux.py --variant results/variants/mpobert \\
        --task results/tasks/bbc.parquet --out results/benchmarks/diagnose_aux.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import polars as pl
import torch
from torch import nn

from lmdecomp.mpo import mpobert, variants
from lmdecomp.mpo.decompose import _gauge_to_centre
from lmdecomp.mpo.layer import MPOLinear

TRAINED_BY_AUXILIARY = ("auxiliary", "adapters", "gates", "head")  # finetune(trainable="auxiliary")
ALL_GROUPS = ("head", "gates", "adapters", "auxiliary", "central", "layernorm", "bias", "embeddings", "other")


def _same(groups, scale=1.0):
    return {g: scale for g in groups}


RECIPES = {
    "all": _same(ALL_GROUPS),  # finetune(trainable="all")
    "all-lr3": _same(ALL_GROUPS, 3.0),
    "all-lr10": _same(ALL_GROUPS, 10.0),
    "aux": _same(TRAINED_BY_AUXILIARY),  # finetune(trainable="auxiliary") today
    "aux-lr3": _same(TRAINED_BY_AUXILIARY, 3.0),
    "aux-lr30": _same(TRAINED_BY_AUXILIARY, 30.0),
    "aux-lr10-gates1": {**_same(TRAINED_BY_AUXILIARY, 10.0), "gates": 1.0},
    "head": {"head": 1.0},
    "head-lr30": {"head": 30.0},
    "aux-lr10": _same(TRAINED_BY_AUXILIARY, 10.0),
    "aux-head-lr30": {**_same(TRAINED_BY_AUXILIARY), "head": 30.0},
    "aux-gates-lr100": {**_same(TRAINED_BY_AUXILIARY), "gates": 100.0},
    "aux-ln": _same(TRAINED_BY_AUXILIARY + ("layernorm", "bias")),
    "aux-ln-lr10": _same(TRAINED_BY_AUXILIARY + ("layernorm", "bias"), 10.0),
    "aux-ln-lr10-head30": {**_same(TRAINED_BY_AUXILIARY + ("layernorm", "bias"), 10.0), "head": 30.0},
    "aux-emb": _same(TRAINED_BY_AUXILIARY + ("embeddings",)),
    "aux-regauged": _same(TRAINED_BY_AUXILIARY),  # the aux recipe after _regauge (same function)
}


class Classifier(nn.Module):
    """``W · mean_t(h_t) + b`` over real tokens, dropout 0.1 on the pooled vector."""

    def __init__(self, encoder: nn.Module, n_classes: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(0.1)
        self.head = nn.Linear(encoder.config.hidden_size, n_classes)

    def pooled(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(h.dtype)
        return (h * m).sum(1) / m.sum(1).clamp_min(1.0)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.pooled(ids, mask)))


def parameter_groups(model: Classifier) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """Every distinct parameter of ``model`` in one group of :data:`ALL_GROUPS`, with its name."""
    enc = model.encoder
    claims = {
        "head": list(model.head.parameters()),
        "gates": mpobert.gate_parameters(enc),
        "adapters": mpobert.adapter_parameters(enc),
        "central": mpobert.central_parameters(enc),
        "auxiliary": mpobert.auxiliary_parameters(enc),
        "layernorm": [p for m in enc.modules() if isinstance(m, nn.LayerNorm) for p in m.parameters()],
        "embeddings": [p for m in enc.modules() if isinstance(m, nn.Embedding) for p in m.parameters()],
    }
    owner: dict[int, str] = {}
    for group, params in claims.items():
        for p in params:
            owner.setdefault(id(p), group)
    groups: dict[str, list[tuple[str, nn.Parameter]]] = {g: [] for g in ALL_GROUPS}
    for name, p in model.named_parameters():  # deduplicated: a shared tensor appears once
        group = owner.get(id(p), "bias" if name.endswith("bias") else "other")
        groups[group].append((name, p))
    return groups


def _isometry_defect(core: torch.Tensor, left: bool) -> float:
    """``‖MᵀM − I‖_F / √r`` of a core as a left (``(r_{k−1} i j, r_k)``) or right isometry."""
    m = core.detach().double().reshape(-1, core.shape[-1]) if left else core.detach().double().reshape(core.shape[0], -1).T
    gram = m.T @ m
    return float(torch.linalg.norm(gram - torch.eye(gram.shape[0], dtype=gram.dtype)) / math.sqrt(gram.shape[0]))


def core_report(encoder: nn.Module) -> dict:
    """Norms of the central vs auxiliary cores and how far the auxiliary ones are from isometries."""
    rows = []
    for m in encoder.modules():
        if isinstance(m, MPOLinear):
            c = len(m.cores) // 2
            w = float(m.weight().detach().norm())
            rows.append({"weight_norm": w, "central_norm": float(m.cores[c].detach().norm()),
                         "aux_norms": [float(x.detach().norm()) for k, x in enumerate(m.cores) if k != c],
                         "aux_isometry_defect": [_isometry_defect(x, k < c) for k, x in enumerate(m.cores) if k != c]})
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"layers": len(rows),
            "mean_weight_norm": mean([r["weight_norm"] for r in rows]),
            "mean_central_norm": mean([r["central_norm"] for r in rows]),
            "mean_aux_norm": mean([x for r in rows for x in r["aux_norms"]]),
            "mean_aux_isometry_defect": mean([x for r in rows for x in r["aux_isometry_defect"]]),
            "max_aux_isometry_defect": max(x for r in rows for x in r["aux_isometry_defect"])}


@torch.no_grad()
def regauge(encoder: nn.Module) -> float:
    """Per MPO layer, a gauge of the auxiliary cores alone (the shared central is untouched, so it
    cannot take their norm): cores ``0 … c−2`` left-orthonormal with the rest pushed into ``c−1``
    (a QR sweep on the mirrored chain), cores ``c+2 … n−1`` right-orthonormal pushed into ``c+1``.
    The layer's weight is unchanged: returns the largest ``‖W_after − W_before‖_F / ‖W_before‖_F``."""
    def mirror(cores):
        return [x.permute(3, 1, 2, 0) for x in reversed(cores)]

    worst = 0.0
    for m in encoder.modules():
        if not isinstance(m, MPOLinear):
            continue
        before = m.weight().detach().double()
        c = len(m.cores) // 2
        cores = [x.detach().double() for x in m.cores]
        left = mirror(_gauge_to_centre(mirror(cores[:c]), 0)) if c > 1 else cores[:c]
        right = _gauge_to_centre(cores[c + 1:], 0)
        for k, x in enumerate(left + [None] + right):
            if x is not None:
                m.cores[k].copy_(x.to(m.cores[k].dtype))
        worst = max(worst, float(torch.linalg.norm(m.weight().double() - before) / torch.linalg.norm(before)))
    return worst


def load_task(path: str, tokenizer, max_length: int, max_train: int | None) -> dict:
    table = pl.read_parquet(path)
    data = {}
    for split in ("train", "val", "test"):
        part = table.filter(pl.col("split") == split)
        if split == "train" and max_train:
            part = part.head(max_train)
        ids = tokenizer(part["text"].to_list(), truncation=True, max_length=max_length)["input_ids"]
        data[split] = (ids, part["label_id"].to_list())
    data["n_classes"] = int(table["label_id"].max()) + 1
    return data


def batch(encoded, idx, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(encoded[i]) for i in idx)
    ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    for row, i in enumerate(idx):
        ids[row, : len(encoded[i])] = torch.tensor(encoded[i])
        mask[row, : len(encoded[i])] = 1
    return ids, mask


@torch.no_grad()
def features(model: Classifier, encoded, pad_id: int) -> torch.Tensor:
    model.eval()
    return torch.cat([model.pooled(*batch(encoded, range(s, min(s + 64, len(encoded))), pad_id))
                      for s in range(0, len(encoded), 64)])


def accuracy(logits: torch.Tensor, gold) -> float:
    return float((logits.argmax(-1) == torch.tensor(gold)).double().mean())


def linear_probe(model: Classifier, data: dict, pad_id: int) -> dict:
    """Logistic regression on frozen pooled features (standardised on train), L-BFGS, L2 from a grid by val."""
    feats = {s: features(model, data[s][0], pad_id).double() for s in ("train", "val", "test")}
    mu, sd = feats["train"].mean(0), feats["train"].std(0).clamp_min(1e-8)
    feats = {s: (f - mu) / sd for s, f in feats.items()}
    y = torch.tensor(data["train"][1])
    best = None
    for l2 in (1e-4, 1e-3, 1e-2, 1e-1, 1.0):
        w = torch.zeros(feats["train"].shape[1], data["n_classes"], dtype=torch.float64, requires_grad=True)
        b = torch.zeros(data["n_classes"], dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([w, b], max_iter=500, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = nn.functional.cross_entropy(feats["train"] @ w + b, y) + l2 * w.square().sum()
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            row = {"l2": l2, **{f"{s}_accuracy": accuracy(feats[s] @ w + b, data[s][1]) for s in feats}}
        if best is None or row["val_accuracy"] > best["val_accuracy"]:
            best = row
    return best


def _lr_lambda(warmup: int, total: int):
    return lambda step: step / max(1, warmup) if step < warmup else max(0.0, (total - step) / max(1, total - warmup))


def _group_norms(groups, attr: str) -> dict[str, float]:
    out = {}
    for g, named in groups.items():
        tensors = [getattr(p, attr) if attr else p for _, p in named]
        tensors = [t for t in tensors if t is not None]
        if tensors:
            out[g] = math.sqrt(sum(float(t.detach().double().square().sum()) for t in tensors))
    return out


def _setup(model: Classifier, recipe: dict[str, float], lr: float, total: int):
    groups = parameter_groups(model)
    trained = {g: named for g, named in groups.items() if g in recipe and named}
    keep = {id(p) for named in trained.values() for _, p in named}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    optimizer = torch.optim.AdamW(
        [{"params": [p for _, p in named], "lr": lr * recipe[g], "name": g} for g, named in trained.items()],
        lr=lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_lambda(int(0.1 * total), total))
    params = [p for named in trained.values() for _, p in named]
    info = {g: {"count": sum(p.numel() for _, p in named), "tensors": len(named), "lr": lr * recipe[g],
                "names": [n for n, _ in named][:12] + ([f"... {len(named) - 12} more"] if len(named) > 12 else [])}
            for g, named in trained.items()}
    return trained, optimizer, scheduler, params, info


def _epoch(model, data, pad_id, trained, optimizer, scheduler, params, args, epoch, log) -> None:
    """One epoch of the finetune() loop, measuring each step into ``log``."""
    n_train = len(data["train"][0])
    gen = torch.Generator().manual_seed(1000 * args.seed + epoch)
    order = torch.randperm(n_train, generator=gen).tolist()
    model.train()
    for s in range(0, n_train, args.batch_size):
        step = len(log["loss"]) + 1
        torch.manual_seed(10_000 * args.seed + step)  # dropout
        idx = order[s: s + args.batch_size]
        ids, mask = batch(data["train"][0], idx, pad_id)
        loss = nn.functional.cross_entropy(model(ids, mask), torch.tensor([data["train"][1][i] for i in idx]))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        total = float(torch.nn.utils.clip_grad_norm_(params, 1.0))
        if step <= args.grad_steps or step % 10 == 0:
            log["grads"].append({"step": step, "total": total, "clip_factor": min(1.0, 1.0 / max(total, 1e-12)),
                                 "lr": {grp["name"]: grp["lr"] for grp in optimizer.param_groups},
                                 **{f"grad_{g}": v for g, v in _group_norms(trained, "grad").items()}})
        optimizer.step()
        scheduler.step()
        log["loss"].append(round(float(loss.detach()), 5))


def run_recipe(name: str, folder: str, data: dict, args) -> dict:
    model_lm, tokenizer = variants.load_variant(folder)
    encoder = model_lm.base_model
    regauge_change = regauge(encoder) if name == "aux-regauged" else None
    cores = core_report(encoder)
    torch.manual_seed(args.seed)
    model = Classifier(encoder, data["n_classes"])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    steps_per_epoch = math.ceil(len(data["train"][0]) / args.batch_size)
    trained, optimizer, scheduler, params, info = _setup(model, RECIPES[name], args.lr, steps_per_epoch * args.epochs)
    start = {g: [p.detach().clone() for _, p in named] for g, named in trained.items()}
    gates_before = [round(float(p.detach()), 5) for p in mpobert.gate_parameters(encoder)]
    log = {"loss": [], "grads": []}
    history, best = [], None
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        _epoch(model, data, pad_id, trained, optimizer, scheduler, params, args, epoch, log)
        with torch.no_grad():
            model.eval()
            val = accuracy(model.head(features(model, data["val"][0], pad_id)), data["val"][1])
            test = accuracy(model.head(features(model, data["test"][0], pad_id)), data["test"][1])
        history.append({"epoch": epoch, "val_accuracy": val, "test_accuracy": test})
        if best is None or val > best["val_accuracy"]:
            best = history[-1]
    moved = {g: math.sqrt(sum(float((p.detach() - p0).double().square().sum()) for (_, p), p0 in zip(named, start[g])))
             / max(1e-12, math.sqrt(sum(float(p0.double().square().sum()) for p0 in start[g]))) for g, named in trained.items()}
    return {"recipe": name, "lr_multipliers": RECIPES[name], "trainable": info, "cores": cores,
            "regauge_weight_change": regauge_change,
            "trainable_parameters": sum(v["count"] for v in info.values()),
            "gates_before": gates_before, "gates_after": [round(float(p.detach()), 5) for p in mpobert.gate_parameters(encoder)],
            "relative_change": moved, "loss": log["loss"], "grads": log["grads"], "history": history,
            "best_val_epoch": best, "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", default="results/variants/mpobert", help="a variant folder (read only)")
    parser.add_argument("--task", default="results/tasks/bbc.parquet")
    parser.add_argument("--out", default="results/benchmarks/diagnose_aux.json")
    parser.add_argument("--recipes", default=",".join(RECIPES), help=f"comma-separated, from {list(RECIPES)}")
    parser.add_argument("--epochs", type=int, default=4, help="params.yaml finetune.epochs")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3, help="params.yaml finetune.learning_rate")
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--max-train", type=int, default=None, help="first N train rows only")
    parser.add_argument("--grad-steps", type=int, default=10, help="log gradient norms at the first N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_lm, tokenizer = variants.load_variant(args.variant)
    data = load_task(args.task, tokenizer, args.max_length, args.max_train)
    torch.manual_seed(args.seed)
    frozen = Classifier(model_lm.base_model, data["n_classes"])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    record = {"variant": args.variant, "task": args.task, "settings": vars(args),
              "examples": {s: len(data[s][0]) for s in ("train", "val", "test")},
              "chance_accuracy": max(data["test"][1].count(c) for c in range(data["n_classes"])) / len(data["test"][1]),
              "cores": core_report(model_lm.base_model), "probe": linear_probe(frozen, data, pad_id), "recipes": []}
    print(f"probe: {record['probe']}", file=sys.stderr)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.recipes.split(","):
        row = run_recipe(name, args.variant, data, args)
        record["recipes"].append(row)
        print(f"{name:20s} trainable {row['trainable_parameters']:7d}  loss {row['loss'][0]:.3f} -> "
              f"{sum(row['loss'][-5:]) / 5:.3f}  best val {row['best_val_epoch']}  gates {row['gates_after']}  "
              f"{row['seconds']} s", file=sys.stderr)
        out.write_text(json.dumps(record, indent=1) + "\n")  # after each recipe: a partial run keeps what it has


if __name__ == "__main__":
    main()
