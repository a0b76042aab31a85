"""Fine-tuning a (possibly MPO / MPOBERT) encoder on a labelled task: classification of one text
or a pair of texts, or regression of a float target.

The model is the encoder of a masked-LM model (its ``base_model``; the LM head is dropped)
followed by mean pooling over real tokens and a linear layer::

    out = W · (Σ_t m_t h_t / Σ_t m_t) + b

with one output per class (cross-entropy loss) or one output (regression: MSE loss on the
targets standardised by the train split's mean and std, predictions mapped back). A pair is
encoded with the tokenizer's pair encoding, ``tokenizer(text, text_pair, truncation=True)``
(longest side truncated first), and its ``token_type_ids`` go to the encoder when the tokenizer
gives them and the encoder has at least two token types.

Training: AdamW (the fused kernel, :func:`lmdecomp.models.optim.fused_adamw`) with linear
warmup (10%) and linear decay over ``epochs`` epochs, gradient clipping at 1, seeded head init,
example order and dropout per step (as in
:func:`lmdecomp.models.train.train_mlm`); after every epoch the task's metric on val
(:mod:`lmdecomp.mpo.metrics`), early stopping after ``patience`` epochs without a strict
improvement, and the best epoch's weights restored before the test split is scored.
``trainable="auxiliary"`` freezes everything except the auxiliary MPO cores, adapters,
residual gates and the head (central tensors frozen); it needs an MPOBERT encoder with shared
central tensors (``sharing="central"``) and raises ``ValueError`` otherwise.
"""

from __future__ import annotations

import copy
import inspect
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from lmdecomp.models.masking import _gen, derive_seed
from lmdecomp.models.optim import fused_adamw
from lmdecomp.models.train import _resolve_device
from lmdecomp.mpo import metrics, mpobert

__all__ = ["FinetuneConfig", "TaskInfo", "Examples", "SequenceClassifier", "task_info", "task_examples", "finetune",
           "seed_list", "combine_seeds", "prediction_matrix"]

SPLITS = ("train", "val", "test")


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
    gate_learning_rate: float | None = None  # the residual gates' own rate (None: learning_rate)


@dataclass(frozen=True)
class TaskInfo:
    """What a task predicts and how it is scored: ``kind`` "classification" (``n_classes``
    labels, ``positive`` the class id that ``f1`` scores) or "regression" (one float)."""

    kind: str = "classification"
    metric: str = "accuracy"
    n_classes: int = 2
    positive: int = 1

    def __post_init__(self) -> None:
        metrics.check_metric(self.metric, self.kind)
        if self.kind == "classification" and not 0 <= self.positive < self.n_classes:
            raise ValueError(f"positive class id {self.positive} is not among the task's {self.n_classes} classes")

    @property
    def outputs(self) -> int:
        return self.n_classes if self.kind == "classification" else 1

    def score(self, pred, gold) -> np.ndarray:
        return metrics.score(self.metric, pred, gold, self.n_classes, self.positive)


@dataclass(frozen=True)
class Examples:
    """One split: texts, (for a pair task) the second texts, and int class ids or float targets."""

    text: Sequence[str]
    label: Sequence[Any]
    text_pair: Sequence[str] | None = None


def task_info(record: Mapping[str, Any], spec: Mapping[str, Any] | None = None) -> TaskInfo:
    """The :class:`TaskInfo` of a task record (results/tasks/{task}.json), falling back on its
    params spec, then on classification scored by accuracy. ``positive_label`` (a label name)
    picks the class ``f1`` scores; label id 1 when absent."""
    spec = spec or {}
    kind = record.get("kind", spec.get("kind", "classification"))
    metric = record.get("metric", spec.get("metric", "accuracy" if kind == "classification" else "pearson"))
    if kind != "classification":
        return TaskInfo(kind=kind, metric=metric, n_classes=0, positive=0)
    labels = list(record.get("labels") or [])
    if len(labels) < 2:
        raise ValueError(f"a classification task record needs 'labels' (at least two names in label_id order), got {labels}")
    positive = record.get("positive_label", spec.get("positive_label"))
    if positive is not None and positive not in labels:
        raise ValueError(f"positive_label {positive!r} is not one of the task's labels {labels}")
    return TaskInfo(kind=kind, metric=metric, n_classes=len(labels), positive=1 if positive is None else labels.index(positive))


def task_examples(table, task: TaskInfo) -> dict[str, Examples]:
    """{split: Examples} of a task table (polars): ``text``, ``split`` and ``label_id``
    (classification) or ``target`` (regression); ``text_pair`` where the table has it with
    values (a table without it, or with it all null, is a single-text task)."""
    need = {"text", "split", "label_id" if task.kind == "classification" else "target"}
    missing = sorted(need - set(table.columns))
    if missing:
        raise ValueError(f"the task table lacks columns {missing} that a {task.kind} task needs (has {table.columns})")
    label = "label_id" if task.kind == "classification" else "target"
    paired = "text_pair" in table.columns and table["text_pair"].null_count() < table.height
    out = {}
    for split in SPLITS:
        rows = table.filter(table["split"] == split)
        if rows.height == 0:
            raise ValueError(f"the task table has no {split} rows; give every split a share in finetune.splits")
        if rows[label].null_count() or (paired and rows["text_pair"].null_count()):
            raise ValueError(f"the task table's {split} split has null {label} or text_pair values")
        out[split] = Examples(rows["text"].to_list(), rows[label].to_list(), rows["text_pair"].to_list() if paired else None)
    return out


class SequenceClassifier(nn.Module):
    """Encoder, mean pooling, dropout and a linear head of ``n_outputs`` (1 for regression)."""

    def __init__(self, encoder: nn.Module, hidden: int, n_outputs: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden, n_outputs)

    def pool(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The mean of the last hidden states over real tokens, ``Σ_t m_t h_t / Σ_t m_t``."""
        extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask, **extra).last_hidden_state
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return (h * m).sum(1) / m.sum(1).clamp_min(1.0)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.dropout(self.pool(input_ids, attention_mask, token_type_ids)))


def _takes_token_types(encoder: nn.Module) -> bool:
    return ("token_type_ids" in inspect.signature(encoder.forward).parameters
            and getattr(encoder.config, "type_vocab_size", 0) >= 2)


def _encode(tokenizer, ex: Examples, max_length: int, types: bool) -> tuple[list[list[int]], list[list[int]] | None]:
    args = (list(ex.text),) if ex.text_pair is None else (list(ex.text), list(ex.text_pair))
    enc = tokenizer(*args, truncation=True, max_length=max_length, return_attention_mask=False)
    return enc["input_ids"], (enc["token_type_ids"] if types and "token_type_ids" in enc else None)


def _batch(encoded, idx: Sequence[int], pad_id: int, device) -> tuple[torch.Tensor, ...]:
    ids_list, types_list = encoded
    width = max(len(ids_list[i]) for i in idx)
    ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(idx), width), dtype=torch.long)
    types = None if types_list is None else torch.zeros((len(idx), width), dtype=torch.long)
    for row, i in enumerate(idx):
        ids[row, : len(ids_list[i])] = torch.tensor(ids_list[i])
        mask[row, : len(ids_list[i])] = 1
        if types is not None:
            types[row, : len(types_list[i])] = torch.tensor(types_list[i])
    return ids.to(device), mask.to(device), None if types is None else types.to(device)


@torch.no_grad()
def _outputs(model: SequenceClassifier, encoded, pad_id: int, batch_size: int = 64) -> torch.Tensor:
    """(n, outputs) head outputs, in example order (batched by length: little padding)."""
    model.eval()
    ids_list = encoded[0]
    order = sorted(range(len(ids_list)), key=lambda i: len(ids_list[i]))
    out = torch.zeros((len(ids_list), model.head.out_features))
    for s in range(0, len(order), batch_size):
        idx = order[s : s + batch_size]
        out[idx] = model(*_batch(encoded, idx, pad_id, model.head.weight.device)).float().cpu()
    return out


def _trainable(model: SequenceClassifier, mode: str) -> list[nn.Parameter]:
    """The parameters ``mode`` trains ("all", or "auxiliary": central tensors frozen); the
    others get ``requires_grad=False``."""
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


def _groups(model: SequenceClassifier, params: list[nn.Parameter], cfg: FinetuneConfig) -> list[dict]:
    """One AdamW group, or two when the gates have their own rate: AdamW moves a parameter by
    at most about its rate per step, so a gate at 0 cannot open within a short run at the
    encoder's rate (67 steps at 2e-3 move it by at most ~0.07)."""
    gates = {id(p) for p in mpobert.gate_parameters(model.encoder)}
    if cfg.gate_learning_rate is None or not gates:
        return [{"params": params}]
    groups = [{"params": [p for p in params if id(p) not in gates]},
              {"params": [p for p in params if id(p) in gates], "lr": cfg.gate_learning_rate, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


@dataclass(frozen=True)
class _Objective:
    """The loss on head outputs and the map from outputs to predictions: argmax for
    classification; for regression ``y = μ + σ · out`` with μ, σ the train targets' mean and
    std (the head learns the standardised target, so one learning rate suits any scale)."""

    task: TaskInfo
    mean: float = 0.0
    std: float = 1.0

    @classmethod
    def of(cls, task: TaskInfo, train_labels: Sequence[Any]) -> "_Objective":
        if task.kind == "classification":
            return cls(task)
        y = np.asarray(train_labels, dtype=np.float64)
        return cls(task, float(y.mean()), float(y.std()) or 1.0)

    def loss(self, out: torch.Tensor, labels: Sequence[Any]) -> torch.Tensor:
        if self.task.kind == "classification":
            return nn.functional.cross_entropy(out, torch.tensor([int(y) for y in labels], dtype=torch.long, device=out.device))
        z = (torch.tensor([float(y) for y in labels], dtype=torch.float64) - self.mean) / self.std
        return nn.functional.mse_loss(out[:, 0], z.to(device=out.device, dtype=out.dtype))

    def decode(self, out: torch.Tensor) -> np.ndarray:
        if self.task.kind == "classification":
            return out.argmax(-1).numpy()
        return self.mean + self.std * out[:, 0].double().numpy()


def _chance(task: TaskInfo, train_labels: Sequence[Any], test_labels: Sequence[Any]) -> float:
    """The metric of a constant prediction: the most frequent train class (lowest id on a tie),
    or the train mean (a constant has correlation 0 by the metrics' convention)."""
    if task.kind == "classification":
        const = np.bincount(np.asarray(train_labels), minlength=task.n_classes).argmax()
    else:
        const = float(np.mean(train_labels))
    return float(task.score(np.full(len(test_labels), const), np.asarray(test_labels)))


def _train(model: SequenceClassifier, enc, data: Mapping[str, Examples], objective: _Objective, params: list[nn.Parameter],
           cfg: FinetuneConfig, pad_id: int, progress: bool) -> tuple[list[dict], dict, float, int]:
    """The epochs with early stopping; returns (history, best state, best val score, best epoch)."""
    from tqdm.auto import tqdm
    from transformers import get_linear_schedule_with_warmup

    device = model.head.weight.device
    n_train, labels = len(enc["train"][0]), data["train"].label
    steps_per_epoch = math.ceil(n_train / cfg.batch_size)
    optimizer = fused_adamw(_groups(model, params, cfg), lr=cfg.learning_rate, weight_decay=0.01)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.1 * steps_per_epoch * cfg.epochs), steps_per_epoch * cfg.epochs)
    best_val, best_state, best_epoch, history, step = -math.inf, None, 0, [], 0
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
                loss = objective.loss(model(*_batch(enc["train"], idx, pad_id, device)), [labels[i] for i in idx])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                scheduler.step()
                total += float(loss.detach()) * len(idx)
                bar.update(1)
                bar.set_postfix(epoch=epoch, loss=f"{float(loss.detach()):.3f}", refresh=False)
            val = float(objective.task.score(objective.decode(_outputs(model, enc["val"], pad_id)), np.asarray(data["val"].label)))
            history.append({"epoch": epoch, "train_loss": total / n_train, "val_metric": val})
            if val > best_val:
                best_val, best_epoch = val, epoch
                best_state = copy.deepcopy(model.state_dict())
            elif epoch - best_epoch >= cfg.patience:
                break
    bar.close()
    return history, best_state, best_val, best_epoch


def finetune(encoder: nn.Module, tokenizer, data: Mapping[str, Examples], task: TaskInfo, cfg: FinetuneConfig,
             progress: bool = True) -> dict[str, Any]:
    """Train the encoder with a head for ``task`` on ``data["train"]``, early-stop on
    ``data["val"]`` by the task's metric, score ``data["test"]`` (see the module docstring).

    Returns the metrics: ``test_metric`` and ``val_metric`` (the best epoch's) in the task's
    metric, for classification also ``test_accuracy`` and ``test_macro_f1``; ``chance_metric``
    (a constant prediction, :func:`_chance`); ``test_predictions`` (class ids or floats, in
    test order); epochs, history and parameter counts. The encoder is trained in place."""
    missing = [s for s in SPLITS if s not in data or not len(data[s].text)]
    if missing:
        raise ValueError(f"fine-tuning needs examples in every split; none in {missing}")
    torch.manual_seed(derive_seed(cfg.seed, "head"))
    model = SequenceClassifier(encoder, encoder.config.hidden_size, task.outputs)
    model.to(_resolve_device(cfg.device))
    params = _trainable(model, cfg.trainable)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    types = _takes_token_types(encoder)
    enc = {split: _encode(tokenizer, data[split], cfg.max_length, types) for split in SPLITS}
    objective = _Objective.of(task, data["train"].label)
    started = time.perf_counter()
    history, best_state, best_val, best_epoch = _train(model, enc, data, objective, params, cfg, pad_id, progress)
    # wall-clock time goes to the log, not the metrics: artifacts must be the same bytes on a rerun
    seconds = time.perf_counter() - started
    print(f"fine-tuned {len(history)} epochs in {seconds:.1f} s ({1e3 * seconds / (len(history) * len(data['train'].text)):.2f} ms "
          f"per train example and epoch, validation included)", file=sys.stderr)
    model.load_state_dict(best_state)
    pred = objective.decode(_outputs(model, enc["test"], pad_id))
    gold = np.asarray(data["test"].label)
    report = mpobert.parameter_report(model)
    out = {"metric": task.metric, "kind": task.kind, "test_metric": float(task.score(pred, gold)), "val_metric": best_val,
           "chance_metric": _chance(task, data["train"].label, gold), "best_epoch": best_epoch, "epochs_run": len(history),
           "history": history, "parameters": report["total"], "parameters_by_role": report,
           "trainable_parameters": sum(p.numel() for p in params), "examples": {s: len(data[s].text) for s in SPLITS},
           "test_predictions": pred.tolist()}
    gates = [round(float(m.gate.detach()), 6) for m in encoder.modules() if isinstance(m, mpobert.GatedLayer)]
    if gates:  # MPOBERT / ALBERT / deep: the residual gates after fine-tuning (0: a closed layer)
        out["gates"] = gates
    if task.kind == "classification":
        out.update(n_classes=task.n_classes, positive_class=task.positive)
        out["test_accuracy"] = float(metrics.accuracy(pred, gold))
        out["test_macro_f1"] = float(metrics.macro_f1(pred, gold, task.n_classes))
    return out


def seed_list(seeds: int | Sequence[int]) -> list[int]:
    """``finetune.seeds``: a count n (seeds 0 … n−1) or a list of distinct ints."""
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            raise ValueError(f"finetune.seeds as a count must be at least 1, got {seeds}")
        return list(range(seeds))
    out = [int(s) for s in seeds]
    if not out or len(set(out)) != len(out):
        raise ValueError(f"finetune.seeds as a list must be non-empty and without repeats, got {list(seeds)}")
    return out


SHARED = ("metric", "kind", "n_classes", "positive_class", "parameters", "parameters_by_role", "trainable_parameters", "examples", "chance_metric")
PER_SEED = ("test_metric", "val_metric", "test_accuracy", "test_macro_f1", "best_epoch", "epochs_run", "history", "gates")


def combine_seeds(runs: Mapping[int, Mapping[str, Any]], test_gold: Sequence[Any]) -> tuple[dict[str, Any], dict[str, list]]:
    """One variant's :func:`finetune` results, keyed by seed, as (metrics, predictions).

    metrics: what every seed shares (metric, parameter counts, example counts, chance), per
    seed under ``runs`` (test and best val metric, epochs, history), and over seeds the mean
    ``test_metric``, ``val_metric`` (and ``test_accuracy``/``test_macro_f1`` for
    classification) with ``test_metric_seed_min``/``_max``. predictions: columns ``seed``,
    ``index`` (position in the test split), ``prediction`` and ``gold``, seed by seed."""
    seeds = list(runs)
    first = runs[seeds[0]]
    for key in SHARED:
        if any(runs[s].get(key) != first.get(key) for s in seeds):
            raise ValueError(f"seeds disagree on {key!r}: the runs did not fine-tune the same model on the same task")
    out: dict[str, Any] = {key: first[key] for key in SHARED if key in first}
    out["seeds"] = seeds
    out["runs"] = [{"seed": s, **{k: runs[s][k] for k in PER_SEED if k in runs[s]}} for s in seeds]
    for key in ("test_metric", "val_metric", "test_accuracy", "test_macro_f1"):
        if key in first:
            out[key] = float(np.mean([runs[s][key] for s in seeds]))
    out["test_metric_seed_min"] = min(runs[s]["test_metric"] for s in seeds)
    out["test_metric_seed_max"] = max(runs[s]["test_metric"] for s in seeds)
    n = len(test_gold)
    if any(len(runs[s]["test_predictions"]) != n for s in seeds):
        raise ValueError(f"every seed must predict the {n} test examples")
    predictions = {"seed": [s for s in seeds for _ in range(n)], "index": list(range(n)) * len(seeds),
                   "prediction": [p for s in seeds for p in runs[s]["test_predictions"]], "gold": list(test_gold) * len(seeds)}
    return out, predictions


def prediction_matrix(predictions: Mapping[str, Sequence[Any]]) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The inverse of :func:`combine_seeds`' predictions columns: (seeds, (seeds, n)
    predictions, (n,) gold), checking that every seed predicts the same examples in order."""
    seed = np.asarray(predictions["seed"])
    seeds = list(dict.fromkeys(seed.tolist()))
    n = int((seed == seeds[0]).sum())
    index, gold = np.asarray(predictions["index"]), np.asarray(predictions["gold"])
    if len(seed) != n * len(seeds) or not all(np.array_equal(index[seed == s], np.arange(n)) for s in seeds):
        raise ValueError("the predictions must hold every test example once per seed, in index order 0 … n−1")
    if not all(np.array_equal(gold[seed == s], gold[seed == seeds[0]]) for s in seeds):
        raise ValueError("the seeds' predictions disagree on the gold labels")
    pred = np.asarray(predictions["prediction"])
    return seeds, np.stack([pred[seed == s] for s in seeds]), gold[seed == seeds[0]]
