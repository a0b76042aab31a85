"""Task metrics of fine-tuning: accuracy, macro-F1, Matthews correlation and positive-class F1
for classification; Pearson and Spearman correlation for regression.

Every metric takes ``pred`` and ``gold`` of shape (..., n) — one example set per row, so a
(replicates, n) matrix of bootstrap resamples is scored in one call — and returns shape (...):
a 0-d array (a plain number after ``float``) for 1-D input. Class labels are int ids
0 … n_classes − 1. Where a formula divides by zero (a class never predicted and never
present, a constant prediction), the metric is 0, as in scikit-learn.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["CLASSIFICATION", "REGRESSION", "accuracy", "macro_f1", "mcc", "f1", "pearson", "spearman",
           "average_ranks", "score", "check_metric"]

CLASSIFICATION = ("accuracy", "macro_f1", "mcc", "f1")
REGRESSION = ("pearson", "spearman")


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, and 0 where den is 0."""
    num, den = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    return np.divide(num, den, out=np.zeros(np.broadcast(num, den).shape), where=den != 0)


def _counts(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """(..., n_classes): how often each class occurs along the last axis."""
    return np.stack([(labels == k).sum(-1) for k in range(n_classes)], axis=-1)


def accuracy(pred, gold, n_classes: int | None = None) -> np.ndarray:
    """Share of examples with ``pred == gold``."""
    return (np.asarray(pred) == np.asarray(gold)).mean(-1)


def macro_f1(pred, gold, n_classes: int) -> np.ndarray:
    """Mean over all ``n_classes`` of ``F1_c = 2 TP_c / (2 TP_c + FP_c + FN_c)``
    (0 for a class never predicted and never present)."""
    pred, gold = np.asarray(pred), np.asarray(gold)
    scores = [f1(pred, gold, n_classes, positive=c) for c in range(n_classes)]
    return np.mean(scores, axis=0)


def f1(pred, gold, n_classes: int | None = None, positive: int = 1) -> np.ndarray:
    """F1 of the class ``positive`` (one against the rest): ``2 TP / (2 TP + FP + FN)``, 0 when
    the class is neither predicted nor present (MRPC's metric, positive = paraphrase)."""
    p, g = np.asarray(pred) == positive, np.asarray(gold) == positive
    tp, fp, fn = (p & g).sum(-1), (p & ~g).sum(-1), (~p & g).sum(-1)
    return _ratio(2 * tp, 2 * tp + fp + fn)


def mcc(pred, gold, n_classes: int) -> np.ndarray:
    """Matthews correlation for K classes (Gorodkin's R_K, CoLA's metric), from the correct
    count c, the example count n, the predicted counts p_k and the true counts t_k:

        MCC = (c n − Σ_k p_k t_k) / sqrt((n² − Σ_k p_k²)(n² − Σ_k t_k²))

    For two classes it is (TP·TN − FP·FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)); 0 when a
    factor of the denominator is 0 (all predictions, or all labels, in one class)."""
    pred, gold = np.asarray(pred), np.asarray(gold)
    n = np.float64(pred.shape[-1])
    c = (pred == gold).sum(-1).astype(np.float64)
    p, t = _counts(pred, n_classes).astype(np.float64), _counts(gold, n_classes).astype(np.float64)
    cov_pt = c * n - (p * t).sum(-1)
    cov_pp, cov_tt = n * n - (p * p).sum(-1), n * n - (t * t).sum(-1)
    return _ratio(cov_pt, np.sqrt(cov_pp * cov_tt))


def pearson(pred, gold, n_classes: int | None = None) -> np.ndarray:
    """Σ (x − x̄)(y − ȳ) / sqrt(Σ (x − x̄)² Σ (y − ȳ)²) along the last axis (0 when either side
    is constant)."""
    x, y = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    x = x - x.mean(-1, keepdims=True)
    y = y - y.mean(-1, keepdims=True)
    return _ratio((x * y).sum(-1), np.sqrt((x * x).sum(-1) * (y * y).sum(-1)))


def average_ranks(values) -> np.ndarray:
    """1-based ranks along the last axis, tied values sharing the mean of their ranks:
    rank(v) = #{u < v} + (#{u = v} + 1) / 2.

    Vectorised over rows (bootstrap resamples, full of ties): every value is replaced by its
    code among the distinct values of the whole array, each row's code counts are cumulated,
    and a value's rank read from its row's counts — O(rows · (n + distinct values))."""
    values = np.asarray(values, dtype=np.float64)
    flat = values.reshape(-1, values.shape[-1])
    distinct, codes = np.unique(flat, return_inverse=True)
    codes = codes.reshape(flat.shape)
    m = len(distinct)
    rows = np.arange(flat.shape[0])[:, None]
    counts = np.bincount((rows * m + codes).ravel(), minlength=flat.shape[0] * m).reshape(flat.shape[0], m)
    below = np.cumsum(counts, axis=1) - counts
    ranks = below + (counts + 1) / 2.0
    return ranks[rows, codes].reshape(values.shape)


def spearman(pred, gold, n_classes: int | None = None) -> np.ndarray:
    """Pearson correlation of the average ranks (:func:`average_ranks`) of ``pred`` and ``gold``."""
    return pearson(average_ranks(pred), average_ranks(gold))


METRICS: dict[str, Callable[..., np.ndarray]] = {
    "accuracy": accuracy, "macro_f1": macro_f1, "mcc": mcc, "f1": f1, "pearson": pearson, "spearman": spearman}


def check_metric(metric: str, kind: str) -> None:
    """Raise ValueError unless ``metric`` is one of ``kind``'s ("classification"/"regression")."""
    allowed = {"classification": CLASSIFICATION, "regression": REGRESSION}.get(kind)
    if allowed is None:
        raise ValueError(f"task kind must be 'classification' or 'regression', got {kind!r}")
    if metric not in allowed:
        raise ValueError(f"metric {metric!r} does not score a {kind} task; use one of {list(allowed)}")


def score(metric: str, pred, gold, n_classes: int | None = None, positive: int = 1) -> np.ndarray:
    """``metric`` (a name in :data:`METRICS`) of ``pred`` against ``gold``; ``positive`` is the
    class id that ``f1`` scores."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {sorted(METRICS)}")
    if metric == "f1":
        return f1(pred, gold, positive=positive)
    return METRICS[metric](pred, gold, n_classes)
