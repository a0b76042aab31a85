"""The linear probe: what a frozen encoder's features allow without training the encoder.

It is the floor every fine-tuned variant must beat. The encoder is frozen (eval mode, no
dropout); an example's feature vector is its mean-pooled last hidden state (the pooling of
:class:`lmdecomp.mpo.finetune.SequenceClassifier`), standardised with the train split's mean
and standard deviation, ``x = (h̄ − μ) / σ``. On top of it, a convex fit with an L2 penalty
``λ`` on the weights (not the bias):

* classification: multinomial logistic regression,
  ``min_{W,b} (1/n) Σ_i −log softmax(W x_i + b)_{y_i} + λ ‖W‖_F²``,
  fitted in float64 by L-BFGS with a strong-Wolfe line search until the gradient's largest
  entry is below 1e-9 (the optimum is unique, so any careful solver lands on it);
* regression: ridge on the standardised target ``z = (y − ȳ)/s_y``, in closed form,
  ``w = (XᵀX/n + λI)⁻¹ Xᵀz/n`` on centred ``X`` (the bias is the mean).

``λ`` is picked from :data:`L2_GRID` by the task's metric on val (the smallest on a tie).
The fit does not depend on a seed: one fit serves every ``finetune.seeds`` entry.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from lmdecomp.models.train import _resolve_device
from lmdecomp.mpo import finetune, metrics, mpobert

__all__ = ["L2_GRID", "pooled_features", "fit_logistic", "fit_ridge", "linear_probe"]

L2_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


@torch.no_grad()
def pooled_features(model: finetune.SequenceClassifier, encoded, pad_id: int, batch_size: int = 64) -> torch.Tensor:
    """(n, hidden) float64 mean-pooled last hidden states, in example order."""
    model.eval()
    ids = encoded[0]
    out = torch.zeros((len(ids), model.head.in_features), dtype=torch.float64)
    for s in range(0, len(ids), batch_size):
        idx = list(range(s, min(s + batch_size, len(ids))))
        out[idx] = model.pool(*finetune._batch(encoded, idx, pad_id, model.head.weight.device)).double().cpu()
    return out


def fit_logistic(x: torch.Tensor, y: torch.Tensor, n_classes: int, l2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(W of shape (d, classes), b) minimising the mean cross-entropy plus ``l2 · ‖W‖²``."""
    w = torch.zeros(x.shape[1], n_classes, dtype=torch.float64, requires_grad=True)
    b = torch.zeros(n_classes, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=2000, tolerance_grad=1e-9, tolerance_change=1e-15,
                            history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w + b, y) + l2 * w.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def fit_ridge(x: torch.Tensor, z: torch.Tensor, l2: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(w of shape (d, 1), b) of ridge regression of ``z`` on ``x`` (bias unpenalised)."""
    mu, zbar = x.mean(0), z.mean()
    xc = x - mu
    gram = xc.T @ xc / len(x) + l2 * torch.eye(x.shape[1], dtype=x.dtype)
    w = torch.linalg.solve(gram, xc.T @ (z - zbar) / len(x))
    return w[:, None], (zbar - mu @ w).reshape(1)


def linear_probe(encoder, tokenizer, data: Mapping[str, finetune.Examples], task: finetune.TaskInfo, max_length: int,
                 device: str = "auto") -> dict[str, Any]:
    """Fit the probe on ``data["train"]``, pick λ on val, score test (module docstring).

    Returns the keys of :func:`lmdecomp.mpo.finetune.finetune`'s result (``best_epoch`` and
    ``epochs_run`` are 0: nothing is trained by epochs; ``history`` holds the val metric per
    λ) and ``probe_l2``, the λ chosen."""
    model = finetune.SequenceClassifier(encoder, encoder.config.hidden_size, task.outputs).to(_resolve_device(device))
    for p in model.parameters():
        p.requires_grad_(False)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    types = finetune._takes_token_types(encoder)
    feats = {s: pooled_features(model, finetune._encode(tokenizer, data[s], max_length, types), pad_id) for s in finetune.SPLITS}
    mu, sd = feats["train"].mean(0), feats["train"].std(0).clamp_min(1e-12)
    feats = {s: (f - mu) / sd for s, f in feats.items()}
    objective = finetune._Objective.of(task, data["train"].label)
    history, best = [], None
    for l2 in L2_GRID:
        if task.kind == "classification":
            w, b = fit_logistic(feats["train"], torch.tensor([int(v) for v in data["train"].label]), task.n_classes, l2)
        else:
            z = (torch.tensor([float(v) for v in data["train"].label], dtype=torch.float64) - objective.mean) / objective.std
            w, b = fit_ridge(feats["train"], z, l2)
        val = float(task.score(objective.decode(feats["val"] @ w + b), np.asarray(data["val"].label)))
        history.append({"l2": l2, "val_metric": val})
        if best is None or val > best[0] + 1e-12:
            best = (val, l2, w, b)
    val, l2, w, b = best
    pred = objective.decode(feats["test"] @ w + b)
    gold = np.asarray(data["test"].label)
    report = mpobert.parameter_report(model)
    out = {"metric": task.metric, "kind": task.kind, "test_metric": float(task.score(pred, gold)), "val_metric": val,
           "chance_metric": finetune._chance(task, data["train"].label, gold), "best_epoch": 0, "epochs_run": 0,
           "history": history, "probe_l2": l2, "parameters": report["total"], "parameters_by_role": report,
           "trainable_parameters": int(w.numel() + b.numel()), "examples": {s: len(data[s].text) for s in finetune.SPLITS},
           "test_predictions": pred.tolist()}
    if task.kind == "classification":
        out.update(n_classes=task.n_classes, positive_class=task.positive,
                   test_accuracy=float(metrics.accuracy(pred, gold)), test_macro_f1=float(metrics.macro_f1(pred, gold, task.n_classes)))
    return out
