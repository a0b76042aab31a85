"""Fine-tuning a (possibly MPO / MPOBERT) encoder on a labelled task.

The classifier is the encoder of a masked-LM model (its ``base_model``; the LM head is
dropped) followed by mean pooling over real tokens and a linear layer::

    logits = W · (Σ_t m_t h_t / Σ_t m_t) + b

Training: AdamW with linear warmup (10%) and linear decay over ``epochs`` epochs,
gradient clipping at 1, seeded example order and dropout per step (as in
:func:`lmdecomp.models.train.train_mlm`), validation accuracy after every epoch, early stopping
after ``patience`` epochs without improvement, and the best epoch's weights restored
before the test split is scored. ``trainable="auxiliary"`` freezes everything except the
auxiliary MPO cores, adapters, residual gates and the classifier (central tensors frozen);
it needs an MPOBERT encoder with shared central tensors (``sharing="central"``) and
raises ``ValueError`` otherwise.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from lmdecomp.models.masking import _gen, derive_seed
from lmdecomp.models.train import _resolve_device
from lmdecomp.mpo import mpobert

__all__ = ["FinetuneConfig", "SequenceClassifier", "macro_f1", "finetune", "headline"]


@dataclass(frozen=True)
class FinetuneConfig:
    epochs: int = 6
    patience: int = 2
    batch_size: int = 32
    learning_rate: float = 1e-3
    max_length: int = 128
    seed: int = 0
    trainable: str = "all"  # "all" or "auxiliary"
    device: str = "auto"  # "auto": CUDA when available


class SequenceClassifier(nn.Module):
    def __init__(self, encoder: nn.Module, hidden: int, n_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp_min(1.0)
        return self.head(self.dropout(pooled))


def macro_f1(pred: Sequence[int], gold: Sequence[int], n_classes: int) -> float:
    """Mean over all ``n_classes`` of ``F1_c = 2 TP_c / (2 TP_c + FP_c + FN_c)``
    (0 for a class never predicted and never present)."""
    scores = []
    for c in range(n_classes):
        tp = sum(1 for p, g in zip(pred, gold) if p == c and g == c)
        fp = sum(1 for p, g in zip(pred, gold) if p == c and g != c)
        fn = sum(1 for p, g in zip(pred, gold) if p != c and g == c)
        scores.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return sum(scores) / n_classes


def _encode(tokenizer, texts: Sequence[str], max_length: int) -> list[list[int]]:
    return tokenizer(list(texts), truncation=True, max_length=max_length, return_attention_mask=False)["input_ids"]


def _batch(encoded: list[list[int]], idx: Sequence[int], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(encoded[i]) for i in idx)
    ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    for row, i in enumerate(idx):
        ids[row, : len(encoded[i])] = torch.tensor(encoded[i])
        mask[row, : len(encoded[i])] = 1
    return ids, mask


@torch.no_grad()
def _predict(model: SequenceClassifier, encoded: list[list[int]], pad_id: int, batch_size: int) -> list[int]:
    model.eval()
    device = model.head.weight.device
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i]))  # little padding
    pred = [0] * len(encoded)
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        ids, mask = _batch(encoded, idx, pad_id)
        for i, p in zip(idx, model(ids.to(device), mask.to(device)).argmax(-1).tolist()):
            pred[i] = p
    return pred


def _trainable(model: SequenceClassifier, mode: str) -> list[nn.Parameter]:
    if mode == "all":
        keep = list(model.parameters())
    elif mode == "auxiliary":
        enc = model.encoder
        # Without shared central tensors every MPO core counts as auxiliary (a plain MPO
        # model), so "auxiliary" would silently train all of them.
        if not mpobert.central_parameters(enc):
            raise ValueError("trainable='auxiliary' freezes the shared central tensors, so it needs an MPOBERT "
                             "encoder built with sharing='central'; this encoder has none")
        keep = mpobert.auxiliary_parameters(enc) + mpobert.adapter_parameters(enc) + mpobert.gate_parameters(enc) + list(model.head.parameters())
    else:
        raise ValueError(f"trainable must be 'all' or 'auxiliary', got {mode!r}")
    ids = {id(p) for p in keep}
    for p in model.parameters():
        p.requires_grad_(id(p) in ids)
    return [p for p in mpobert._unique(model.parameters()) if p.requires_grad]


def finetune(encoder: nn.Module, tokenizer, data: dict[str, tuple[list[str], list[int]]], n_classes: int,
             cfg: FinetuneConfig, progress: bool = True) -> dict[str, Any]:
    """Train a :class:`SequenceClassifier` on ``data["train"]``, early-stop on ``data["val"]``,
    score ``data["test"]``. Returns the metrics (see module docstring)."""
    from tqdm.auto import tqdm
    from transformers import get_linear_schedule_with_warmup

    torch.manual_seed(derive_seed(cfg.seed, "head"))
    model = SequenceClassifier(encoder, encoder.config.hidden_size, n_classes)
    device = _resolve_device(cfg.device)
    model.to(device)
    params = _trainable(model, cfg.trainable)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    enc = {split: _encode(tokenizer, texts, cfg.max_length) for split, (texts, _) in data.items()}
    gold = {split: labels for split, (_, labels) in data.items()}
    n_train = len(enc["train"])
    steps_per_epoch = math.ceil(n_train / cfg.batch_size)
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.1 * steps_per_epoch * cfg.epochs), steps_per_epoch * cfg.epochs)
    loss_fn = nn.CrossEntropyLoss()
    best_acc, best_state, best_epoch, history = -1.0, None, 0, []
    started = time.perf_counter()
    step = 0
    bar = tqdm(total=steps_per_epoch * cfg.epochs, disable=not progress, desc="finetune", dynamic_ncols=True, mininterval=0.5)
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        for epoch in range(1, cfg.epochs + 1):
            model.train()
            order = torch.randperm(n_train, generator=_gen(cfg.seed, "finetune-epoch", epoch)).tolist()
            total = 0.0
            for s in range(0, n_train, cfg.batch_size):
                step += 1
                torch.manual_seed(derive_seed(cfg.seed, "finetune-dropout", step))
                idx = order[s : s + cfg.batch_size]
                ids, mask = _batch(enc["train"], idx, pad_id)
                target = torch.tensor([gold["train"][i] for i in idx], device=device)
                loss = loss_fn(model(ids.to(device), mask.to(device)), target)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                scheduler.step()
                total += float(loss.detach()) * len(idx)
                bar.update(1)
                bar.set_postfix(epoch=epoch, loss=f"{float(loss.detach()):.3f}", refresh=False)
            val_pred = _predict(model, enc["val"], pad_id, 64)
            val_acc = sum(p == g for p, g in zip(val_pred, gold["val"])) / len(val_pred)
            history.append({"epoch": epoch, "train_loss": total / n_train, "val_accuracy": val_acc})
            if val_acc > best_acc:
                best_acc, best_epoch = val_acc, epoch
                best_state = copy.deepcopy(model.state_dict())
            elif epoch - best_epoch >= cfg.patience:
                break
    bar.close()
    # wall-clock time goes to the log, not the metrics: artifacts must be the same bytes on a rerun
    print(f"fine-tuned {len(history)} epochs in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    model.load_state_dict(best_state)
    test_pred = _predict(model, enc["test"], pad_id, 64)
    report = mpobert.parameter_report(model)
    return {
        "test_accuracy": sum(p == g for p, g in zip(test_pred, gold["test"])) / len(test_pred),
        "test_macro_f1": macro_f1(test_pred, gold["test"], n_classes),
        "val_accuracy": best_acc,
        "best_epoch": best_epoch,
        "epochs_run": len(history),
        "history": history,
        "parameters": report["total"],
        "parameters_by_role": report,
        "trainable_parameters": sum(p.numel() for p in params),
        "examples": {split: len(v) for split, v in enc.items()},
        "chance_accuracy": max(gold["test"].count(c) for c in range(n_classes)) / len(gold["test"]),
    }


def headline(rows: Sequence[dict[str, Any]], reference: str = "dense") -> list[dict[str, Any]]:
    """The MPOBERT claim, checked per task for every variant deeper than ``reference``: fewer
    parameters than it, and test accuracy within 1 point of it or better."""
    out = []
    for task in sorted({r["task"] for r in rows}):
        ref = next((r for r in rows if r["task"] == task and r["variant"] == reference), None)
        if ref is None:
            continue
        for r in rows:
            if r["task"] != task or r["layers"] <= ref["layers"]:
                continue
            points = 100 * (r["test_accuracy"] - ref["test_accuracy"])
            fewer = r["parameters"] < ref["parameters"]
            out.append({"task": task, "variant": r["variant"], "layers": r["layers"], "reference_layers": ref["layers"],
                        "parameters": r["parameters"], "reference_parameters": ref["parameters"],
                        "accuracy_points_vs_reference": round(points, 2), "fewer_parameters": fewer,
                        "claim_holds": bool(fewer and points >= -1.0)})
    return out
