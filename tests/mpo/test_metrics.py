"""Task metrics against explicit formulas: hand-computed cases and plain-Python loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmdecomp.mpo import metrics


def test_macro_f1_against_a_hand_computed_case():
    gold = [0, 0, 0, 1, 1, 2]
    pred = [0, 0, 1, 1, 2, 2]
    # class 0: tp 2 fp 0 fn 1 -> 4/5; class 1: tp 1 fp 1 fn 1 -> 2/4; class 2: tp 1 fp 1 fn 0 -> 2/3
    assert float(metrics.macro_f1(pred, gold, 3)) == pytest.approx((4 / 5 + 2 / 4 + 2 / 3) / 3, abs=1e-12)
    assert float(metrics.macro_f1([0, 0], [0, 0], 2)) == pytest.approx(0.5)  # absent class scores 0
    assert float(metrics.accuracy(pred, gold)) == pytest.approx(4 / 6)


def test_f1_of_the_positive_class_against_a_hand_computed_case():
    gold = [1, 1, 1, 0, 0, 0, 1]
    pred = [1, 1, 0, 1, 0, 0, 0]
    # positive 1: tp 2, fp 1, fn 2 -> 4 / 7
    assert float(metrics.f1(pred, gold, positive=1)) == pytest.approx(4 / 7, abs=1e-12)
    assert float(metrics.f1([1, 1, 0], [1, 0, 0], positive=0)) == pytest.approx(2 / 3)  # tp 1, fp 0, fn 1
    assert float(metrics.f1([0, 0], [0, 0], positive=1)) == 0.0  # never predicted, never present


def gorodkin_mcc(pred, gold, k):
    """Gorodkin (2004), eq. 8, from the confusion matrix C[true, predicted] with explicit loops."""
    c = [[0] * k for _ in range(k)]
    for p, g in zip(pred, gold):
        c[g][p] += 1
    num = sum(c[a][a] * c[b][m] - c[a][b] * c[m][a] for a in range(k) for b in range(k) for m in range(k))
    rows = sum(sum(c[a]) * sum(c[a2][b] for a2 in range(k) if a2 != a for b in range(k)) for a in range(k))
    cols = sum(sum(c[b][a] for b in range(k)) * sum(c[b][a2] for a2 in range(k) if a2 != a for b in range(k)) for a in range(k))
    return num / math.sqrt(rows * cols) if rows * cols else 0.0


def test_mcc_against_gorodkins_confusion_matrix_formula_and_the_binary_one():
    rng = np.random.default_rng(0)
    for k in (2, 3, 5):
        gold = rng.integers(0, k, 60)
        pred = np.where(rng.random(60) < 0.6, gold, rng.integers(0, k, 60))
        assert float(metrics.mcc(pred, gold, k)) == pytest.approx(gorodkin_mcc(pred.tolist(), gold.tolist(), k), abs=1e-12)
    # binary: TP 3, TN 2, FP 1, FN 2 -> (6 - 2) / sqrt(4 * 5 * 3 * 4)
    gold = [1, 1, 1, 1, 1, 0, 0, 0]
    pred = [1, 1, 1, 0, 0, 0, 0, 1]
    assert float(metrics.mcc(pred, gold, 2)) == pytest.approx(4 / math.sqrt(4 * 5 * 3 * 4), abs=1e-12)
    assert float(metrics.mcc([0, 0, 0], [0, 1, 2], 3)) == 0.0  # one predicted class: 0 by convention
    assert float(metrics.mcc([2, 0, 1], [2, 0, 1], 3)) == pytest.approx(1.0)


def loop_pearson(x, y):
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return sxy / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def loop_ranks(x):
    """rank(v) = #{u < v} + (#{u = v} + 1) / 2, by counting."""
    return [sum(u < v for u in x) + (sum(u == v for u in x) + 1) / 2 for v in x]


def test_pearson_and_spearman_against_loops_with_ties():
    x = [0.5, 2.0, 2.0, 3.5, 1.0, 4.0, 2.0]
    y = [1.0, 1.0, 2.5, 3.0, 0.0, 5.0, 2.0]
    assert loop_ranks(x) == [1, 4, 4, 6, 2, 7, 4]  # the three 2.0s share ranks 3, 4, 5
    assert metrics.average_ranks(x).tolist() == loop_ranks(x)
    assert float(metrics.pearson(x, y)) == pytest.approx(loop_pearson(x, y), abs=1e-12)
    assert float(metrics.spearman(x, y)) == pytest.approx(loop_pearson(loop_ranks(x), loop_ranks(y)), abs=1e-12)
    # hand case: ranks (1, 2.5, 2.5) and (1, 2, 3): Pearson = 1.5 / sqrt(1.5 * 2)
    assert float(metrics.spearman([1.0, 3.0, 3.0], [0.1, 0.2, 0.3])) == pytest.approx(1.5 / math.sqrt(3.0), abs=1e-12)
    assert float(metrics.pearson([1.0, 1.0, 1.0], [0.0, 1.0, 2.0])) == 0.0  # constant: 0 by convention


def test_every_metric_scores_rows_of_a_matrix_like_each_row_alone():
    rng = np.random.default_rng(1)
    gold = rng.integers(0, 3, (4, 25))
    pred = np.where(rng.random((4, 25)) < 0.5, gold, rng.integers(0, 3, (4, 25)))
    target = np.round(rng.normal(size=(4, 25)), 1)  # rounded: ties within rows
    guess = np.round(target + rng.normal(size=(4, 25)), 1)
    for name in metrics.CLASSIFICATION:
        rows = metrics.score(name, pred, gold, 3, positive=2)
        assert rows.shape == (4,)
        assert rows.tolist() == pytest.approx([float(metrics.score(name, p, g, 3, positive=2)) for p, g in zip(pred, gold)], abs=1e-12)
    for name in metrics.REGRESSION:
        rows = metrics.score(name, guess, target)
        want = [loop_pearson(*(map(loop_ranks, (a.tolist(), b.tolist())) if name == "spearman" else (a.tolist(), b.tolist())))
                for a, b in zip(guess, target)]
        assert rows.tolist() == pytest.approx(want, abs=1e-12)


def test_a_metric_of_the_wrong_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="does not score a regression task"):
        metrics.check_metric("accuracy", "regression")
    with pytest.raises(ValueError, match="unknown metric"):
        metrics.score("auc", [0], [0])
