"""Healing a variant by distillation: its last hidden states are trained to match the base's.

A packaged encoder may ship without a trained masked-LM head (the 2-layer ``cassette`` BERT's
head scores BBC text at a loss of 8.8 nats, near the 10.3 of a uniform guess over its 30,522
tokens), and then masked-LM steps train a random head rather than heal the encoder. Matching
the frozen base instead needs no head. On a batch of blocks with real-token mask ``m``, for
the variant's (student's) last hidden states ``s_t`` and the base's (teacher's) ``h_t``:

    L = Σ_t m_t ‖s_t − h_t‖² / Σ_t m_t ‖h_t‖²

the relative squared error of the hidden states (0: the variant computes what the base
computes; 1: as far off as predicting zeros). The blocks are those of masked-LM training
(:func:`lmdecomp.models.masking.make_blocks`, no tokens masked); fused AdamW (weight decay 0.01
on matrices) with linear warmup and decay, gradient clipping at 1; the batch order comes from a
seeded permutation per epoch and dropout from a seed per step, so a run is deterministic. The
teacher runs in eval mode without gradients. Not resumable: a killed job starts over (a
variant's distillation is a few minutes).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from lmdecomp.models import masking
from lmdecomp.models.masking import _gen, derive_seed
from lmdecomp.models.optim import fused_adamw
from lmdecomp.models.train import _param_groups

__all__ = ["relative_error", "val_error", "distill"]


def relative_error(student: nn.Module, teacher: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``Σ m ‖s − h‖² / Σ m ‖h‖²`` over the batch (module docstring); gradients flow to the student."""
    with torch.no_grad():
        target = teacher.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    out = student.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).to(out.dtype)
    return ((out - target).square() * m).sum() / (target.square() * m).sum()


@torch.no_grad()
def val_error(student: nn.Module, teacher: nn.Module, ids: torch.Tensor, mask: torch.Tensor, batch_size: int = 64) -> float:
    """The relative error over all of ``ids`` at once (the sums run over every block)."""
    was = student.training
    student.eval()
    teacher.eval()
    num = den = 0.0
    for s in range(0, len(ids), batch_size):
        i, m = ids[s : s + batch_size], mask[s : s + batch_size]
        target = teacher.base_model(input_ids=i, attention_mask=m).last_hidden_state.double()
        out = student.base_model(input_ids=i, attention_mask=m).last_hidden_state.double()
        w = m.unsqueeze(-1).double()
        num += float(((out - target).square() * w).sum())
        den += float((target.square() * w).sum())
    student.train(was)
    return num / den


def distill(student: nn.Module, teacher: nn.Module, tokenizer, train_texts: Sequence[str], cfg: Mapping[str, Any],
            steps: int) -> list[dict[str, float]]:
    """Train ``student`` (in place, CPU) for ``steps`` steps toward ``teacher``; returns one log
    row per step (step, loss, lr). ``cfg``: batch_size, learning_rate, warmup_ratio,
    max_length, seed (as for masked-LM training)."""
    ids, mask = masking.make_blocks(tokenizer, list(train_texts), cfg["max_length"])
    if len(ids) == 0:
        raise ValueError("distillation needs training text: the train split gave no blocks")
    teacher.eval()
    student.train()
    optimizer = fused_adamw(_param_groups(student, 0.01), lr=cfg["learning_rate"])
    warmup = int(round(cfg["warmup_ratio"] * steps))
    schedule = lambda t: (t + 1) / max(1, warmup) if t < warmup else max(0.0, (steps - t) / max(1, steps - warmup))  # noqa: E731
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    params = [p for p in student.parameters() if p.requires_grad]
    per_epoch, batch, log = max(1, len(ids) // cfg["batch_size"]), cfg["batch_size"], []
    with torch.random.fork_rng(devices=[]):
        for step in range(1, steps + 1):
            epoch, k = divmod(step - 1, per_epoch)
            order = torch.randperm(len(ids), generator=_gen(cfg["seed"], "distill-epoch", epoch))
            idx = order[k * batch : (k + 1) * batch]
            torch.manual_seed(derive_seed(cfg["seed"], "distill-dropout", step))
            lr = float(scheduler.get_last_lr()[0])
            loss = relative_error(student, teacher, ids[idx], mask[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            scheduler.step()
            value = float(loss.detach())
            if not math.isfinite(value):
                raise FloatingPointError(f"non-finite distillation loss {value} at step {step}")
            log.append({"step": step, "loss": value, "lr": lr})
    student.eval()
    return log
