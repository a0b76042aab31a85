"""Similarity baselines against O(n²) Gram-matrix formulas and brute-force loops."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from conftest import moments_of
from lmdecomp import lmd
from lmdecomp.lmd import similarity

SPLIT_NAMES = np.array(lmd.SPLITS, dtype=object)


def related(rng, n, d=5, e=4, noise=0.7):
    x = rng.normal(size=(n, d)) * rng.uniform(0.5, 2, size=d) + rng.normal(size=d) * 3
    y = np.tanh(x @ rng.normal(size=(d, e))) + noise * rng.normal(size=(n, e)) - 1.5
    return x, y


def cka_gram(x, y):
    """Kornblith et al. 2019 eq. (linear kernel, biased HSIC) with explicit centring matrices."""
    n = len(x)
    h = np.eye(n) - np.ones((n, n)) / n
    k, l = x @ x.T, y @ y.T

    def hsic(a, b):
        return np.trace(a @ h @ b @ h) / (n - 1) ** 2

    return hsic(k, l) / np.sqrt(hsic(k, k) * hsic(l, l))


def hsic_u_matrix(k, l):
    """Song et al. 2012 unbiased HSIC, written with n×n matrices."""
    n = len(k)
    kt, lt = k - np.diag(np.diag(k)), l - np.diag(np.diag(l))
    one = np.ones(n)
    return (np.trace(kt @ lt) + (one @ kt @ one) * (one @ lt @ one) / ((n - 1) * (n - 2))
            - 2.0 / (n - 2) * one @ kt @ lt @ one) / (n * (n - 3))


def hsic_u_quadruples(k, l):
    """The same estimator as a U-statistic: mean over ordered distinct (i, j, q, r) of
    k_ij l_ij + k_ij l_qr − 2 k_ij l_iq."""
    total, count = 0.0, 0
    for i, j, q, r in itertools.permutations(range(len(k)), 4):
        total += k[i, j] * l[i, j] + k[i, j] * l[q, r] - 2 * k[i, j] * l[i, q]
        count += 1
    return total / count


def random_orthogonal(rng, d):
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    return q * np.sign(np.diag(r))


def test_cka_from_moments_equals_gram_matrix_hsic_on_every_split():
    rng = np.random.default_rng(20)
    n = 240
    x, y = related(rng, n)
    w = rng.normal(size=(n, 3)) + 1
    split = rng.choice(SPLIT_NAMES, size=n, p=[0.5, 0.25, 0.25])
    m = moments_of([x, y, w], ["x", "y", "w"], split)
    for s in lmd.SPLITS:
        rows = split == s
        assert similarity.cka_from_moments(m, "x", "y", s) == pytest.approx(cka_gram(x[rows], y[rows]), abs=1e-10)
        assert similarity.cka_from_moments(m, "y", "w", s) == pytest.approx(cka_gram(y[rows], w[rows]), abs=1e-10)
        both = np.hstack([x, w])[rows]
        assert similarity.cka_from_moments(m, ["x", "w"], "y", s) == pytest.approx(cka_gram(both, y[rows]), abs=1e-10)
    assert similarity.cka_from_moments(m, "x", "x", "val") == pytest.approx(1.0, abs=1e-12)
    table = similarity.cka_pairwise(m, "val")
    assert [(r["a"], r["b"]) for r in table] == [("x", "y"), ("x", "w"), ("y", "w")]
    assert table[0]["cka"] == pytest.approx(cka_gram(x[split == "val"], y[split == "val"]), abs=1e-10)


def test_unbiased_cka_equals_the_matrix_and_u_statistic_forms():
    rng = np.random.default_rng(21)
    x, y = related(rng, 70, d=6, e=3)
    k, l = x @ x.T, y @ y.T
    expected = hsic_u_matrix(k, l) / np.sqrt(hsic_u_matrix(k, k) * hsic_u_matrix(l, l))
    assert similarity.cka_unbiased(x, y) == pytest.approx(expected, abs=1e-10)
    assert similarity.hsic_unbiased(x, y) == pytest.approx(hsic_u_matrix(k, l), rel=1e-10)
    # The matrix form itself against the U-statistic definition, on a size loops can afford.
    xs, ys = x[:9], y[:9]
    ks, ls = xs @ xs.T, ys @ ys.T
    assert similarity.hsic_unbiased(xs, ys) == pytest.approx(hsic_u_quadruples(ks, ls), rel=1e-10)
    assert similarity.hsic_unbiased(xs, xs) == pytest.approx(hsic_u_quadruples(ks, ks), rel=1e-10)
    # Unlike biased CKA, it is near 0 (either sign) for independent representations.
    a, b = rng.normal(size=(100, 20)), rng.normal(size=(100, 20))
    assert abs(similarity.cka_unbiased(a, b)) < 0.05 < 0.1 < similarity.cka_from_moments(
        moments_of([a, b], ["a", "b"], np.array(["test"] * 100, dtype=object)), "a", "b")


def test_cka_is_invariant_to_orthogonal_maps_and_isotropic_scaling_only():
    rng = np.random.default_rng(22)
    n = 150
    x, y = related(rng, n)
    q_x, q_y = random_orthogonal(rng, x.shape[1]), random_orthogonal(rng, y.shape[1])
    x2, y2 = 3.7 * x @ q_x + 5.0, 0.02 * y @ q_y - 1.0  # shifts too: centring removes them
    split = np.array(["test"] * n, dtype=object)
    base = similarity.cka_from_moments(moments_of([x, y], ["x", "y"], split), "x", "y")
    moved = similarity.cka_from_moments(moments_of([x2, y2], ["x", "y"], split), "x", "y")
    assert moved == pytest.approx(base, abs=1e-10)
    assert similarity.cka_unbiased(x2, y2) == pytest.approx(similarity.cka_unbiased(x, y), abs=1e-10)
    # Not a vacuous check: an anisotropic scaling does change CKA.
    stretched = x * np.array([10.0, 1, 1, 1, 0.1])
    assert abs(similarity.cka_unbiased(stretched, y) - similarity.cka_unbiased(x, y)) > 1e-3
    assert abs(similarity.cka_from_moments(moments_of([stretched, y], ["x", "y"], split), "x", "y") - base) > 1e-3


def knn_brute(x, k):
    """For each i: sort all j ≠ i by cosine similarity, keep the first k."""
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    out = []
    for i in range(len(x)):
        sims = [(float(unit[i] @ unit[j]), j) for j in range(len(x)) if j != i]
        out.append({j for _, j in sorted(sims, reverse=True)[:k]})
    return out


def test_mutual_knn_equals_a_set_intersection_loop():
    rng = np.random.default_rng(23)
    x, y = related(rng, 60, noise=0.4)
    for k in (1, 5, 10):
        nx, ny = knn_brute(x, k), knn_brute(y, k)
        expected = np.mean([len(a & b) / k for a, b in zip(nx, ny)])
        assert similarity.mutual_knn(x, y, k=k) == pytest.approx(expected, abs=1e-15)
        assert similarity.mutual_knn(x, y, k=k, chunk=7) == pytest.approx(expected, abs=1e-15)
        assert [set(r) for r in similarity.knn_indices(x, k, chunk=11)] == nx
    assert 0 < similarity.mutual_knn(x, y, k=5) < 1
    assert similarity.mutual_knn(x, x, k=10) == 1.0
    # Cosine neighbours ignore orthogonal maps and scaling.
    assert similarity.mutual_knn(x, 2.5 * x @ random_orthogonal(rng, x.shape[1]), k=10) == 1.0
    with pytest.raises(lmd.LMDError, match="k must be"):
        similarity.mutual_knn(x, y, k=60)
