"""lmdecomp.lmd.moments: the scatter blocks of Moments, its triangle and index helpers, and its
input checks, against float64 numpy products, explicit loops and fancy indexing."""

from __future__ import annotations

import numpy as np
import pytest

from lmd_helpers import _three_models
from lmdecomp import lmd
from lmdecomp.lmd.moments import _column_dots, _GramTraces, _sub, _symmetrise_from_lower, _traces_with_lower


@pytest.mark.parametrize("width,block", [(700, 512), (1030, 512), (200, 64), (20, 7), (7, 7)])
def test_symmetrise_from_lower_across_tiles(width, block):
    """The lower triangle is copied onto the upper one a ``block`` × ``block`` tile at a time;
    widths past one tile (and a last partial row and column of tiles) must give numpy's
    tril + tril(−1)ᵀ exactly."""
    a = np.random.default_rng(width).normal(size=(width, width))
    expected = np.tril(a) + np.tril(a, -1).T
    _symmetrise_from_lower(a, block=block)
    np.testing.assert_array_equal(a, expected)


@pytest.mark.parametrize("width,band", [(40, 256), (40, 16), (37, 5), (1, 256), (7, 7)])
def test_traces_with_lower_triangle_equal_explicit_sums_over_both_matrices(width, band):
    """tr(C H) for several symmetric C from H's lower triangle alone, band by band (widths past
    one band, and a last partial one), against an explicit float64 loop over i, j of the full
    matrices — C contiguous and as a block view of a larger scatter."""
    rng = np.random.default_rng(width + band)
    big = rng.normal(size=(width + 9, width + 9))
    big = big + big.T
    h = rng.normal(size=(width, width))
    h = h + h.T
    symmetric = [np.ascontiguousarray(big[3:3 + width, 3:3 + width]), big[3:3 + width, 3:3 + width],
                 np.eye(width)]
    expected = [sum(c[i, j] * h[i, j] for i in range(width) for j in range(width)) for c in symmetric]
    got = _traces_with_lower(np.tril(h), symmetric, band=band)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert got[2] == pytest.approx(np.trace(h), rel=1e-12)


@pytest.mark.parametrize("width,band", [(40, 768), (40, 16), (37, 5), (9, 9), (1, 4)])
def test_gram_traces_equal_explicit_sums_with_the_gram_formed(width, band):
    """tr(C G), G = R Rᵀ never formed, band by band (one band, several, a last partial one),
    against an explicit float64 loop over i, j of C and of G built by np.dot; two calls on one
    instance with different R (the kept buffers must not carry anything over), C contiguous and
    as a block view of a larger symmetric matrix."""
    rng = np.random.default_rng(width * band)
    big = rng.normal(size=(width + 9, width + 9))
    big = big + big.T
    symmetric = [np.ascontiguousarray(big[3:3 + width, 3:3 + width]), big[3:3 + width, 3:3 + width],
                 np.eye(width)]
    traces = _GramTraces(width, band=band)
    for k in (6, 3):
        rows_t = rng.normal(size=(k, width))
        g = np.dot(rows_t.T, rows_t)
        expected = [sum(c[i, j] * g[i, j] for i in range(width) for j in range(width)) for c in symmetric]
        got = traces(rows_t, symmetric)
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
        assert got[2] == pytest.approx(np.sum(rows_t**2), rel=1e-12)  # tr G = ‖R‖²


@pytest.mark.parametrize("rows,cols", [
    ([0, 1, 2], [3, 4, 8, 9]), ([5, 0, 1], [2, 7, 3]), (list(range(10)), [4]),
    (list(range(0, 20, 2)), list(range(1, 20, 2))),  # 10 × 10 runs: the gathered-copy path
])
def test_column_dots_over_model_blocks_equal_an_explicit_loop(rows, cols):
    """Σ_i a[i, k] · M[rows[i], cols[k]], read run by run from views of M, against a loop."""
    rng = np.random.default_rng(len(rows))
    matrix, a = rng.normal(size=(20, 20)), rng.normal(size=(len(rows), len(cols)))
    expected = [sum(a[i, k] * matrix[r, c] for i, r in enumerate(rows)) for k, c in enumerate(cols)]
    np.testing.assert_allclose(_column_dots(a, matrix, np.array(rows), np.array(cols)), expected, rtol=1e-13)


def test_scatter_blocks_without_the_centred_scatter():
    """The fits read S = C − n μμᵀ as blocks and a diagonal, never as a width² matrix: the blocks
    equal numpy's centred float64 cross-product, and S's entries are the same sums in a block,
    on the diagonal and in the full matrix."""
    rng = np.random.default_rng(5)
    dims = [2, 3, 4]
    x = {s: rng.normal(size=(40, sum(dims))) + 3.0 for s in lmd.SPLITS}
    moments = lmd.Moments(["a", "b", "c"], dims)
    for s in lmd.SPLITS:
        moments.update(s, x[s])
    centred = x["val"] - x["val"].mean(axis=0)
    expected = centred.T @ centred
    for rows, cols in [(["c", "a"], ["b", "c"]), (["b"], ["b"]), (["a", "c"], ["a", "b", "c"])]:
        r, c = moments.columns(rows), moments.columns(cols)
        block = moments.scatter_block("val", r, c)
        np.testing.assert_allclose(block, expected[np.ix_(r, c)], rtol=1e-12, atol=1e-12)
    everything = np.arange(moments.width)
    full = moments.scatter_block("val", everything, everything)
    np.testing.assert_array_equal(full, full.T)
    np.testing.assert_array_equal(moments.scatter_diagonal("val"), np.diagonal(full))
    r, c = moments.columns(["a", "c"]), moments.columns(["a", "b", "c"])
    np.testing.assert_array_equal(moments.scatter_block("val", r, c), full[np.ix_(r, c)])


@pytest.mark.parametrize("rows, cols", [([1, 2, 3], [4, 5]), ([0, 1, 7, 8, 9], [2, 3, 5]),
                                        (list(range(0, 12, 2)), [0, 1, 2, 9, 10])])
def test_sub_copies_runs_like_fancy_indexing(rows, cols):
    """One run each: a view; a few runs: block copies; many runs (above max_runs): fancy
    indexing; over the last two axes of a stack (the bootstrap's blocks) as of one matrix."""
    stack = np.arange(288.0).reshape(2, 12, 12)
    for max_runs in (64, 2):
        for matrix in (stack[0], stack):
            np.testing.assert_array_equal(_sub(matrix, np.array(rows), np.array(cols), max_runs),
                                          matrix[..., np.array(rows)[:, None], np.array(cols)[None, :]])
        np.testing.assert_array_equal(_sub(stack, np.array(rows), np.array(cols), max_runs)[1],
                                      stack[1][np.ix_(rows, cols)])


def test_malformed_calls_get_errors_that_say_what_to_pass():
    """Before, these were a KeyError, a raw BLAS/broadcast error after n had already grown, a
    1-D row counted as three rows, a TypeError, an IndexError and a silent empty table."""
    m, bm = _three_models()
    before = m.n["train"], m.sums["train"].copy()
    for rows in (np.ones(12), np.ones((5, 11))):  # one row as a vector; one column short
        with pytest.raises(lmd.LMDError, match=r"must be a \(rows × 12\) array"):
            m.update("train", rows)
    assert m.n["train"] == before[0] and np.array_equal(m.sums["train"], before[1])  # left untouched
    fit = lmd.fit_ridge(m, ["a"], "b", 0.1)
    unknown = r"unknown split 'dev'; the splits are \['train', 'val', 'test'\]"
    for call in (lambda: m.update("dev", np.ones((2, 12))), lambda: lmd.r_squared(m, fit, "dev"),
                 lambda: lmd.bootstrap_r2_samples(bm, ["a"], "b", 0.1, n_boot=5, split=["val", "dev"])):
        with pytest.raises(lmd.LMDError, match=unknown):
            call()
    with pytest.raises(lmd.LMDError, match="n_boot must be at least 1"):
        lmd.bootstrap_r2(bm, ["a"], "b", 0.1, n_boot=0)
    with pytest.raises(lmd.LMDError, match="select_alpha chooses among a grid"):
        lmd.select_alpha(m, ["a"], "b", 0.1)
    with pytest.raises(lmd.LMDError, match="max_k must be at least 1"):
        lmd.greedy_selection(m, "b", 0.1, max_k=0)
    with pytest.raises(lmd.LMDError, match=r"2 model names \['a', 'b'\] but the widths \[3\]"):
        lmd.Moments(["a", "b"], [3])


def test_unknown_model_names_are_listed():
    from lmdecomp.lmd import similarity

    m, bm = _three_models()
    known = r"these moments hold \['a', 'b', 'c'\]"
    for call in (lambda: lmd.fit_ridge(m, ["zz"], "b", 0.1), lambda: lmd.fit_ridge(m, ["a"], "zz", 0.1),
                 lambda: lmd.fit_targets(m, ["a"], ["zz"], 0.1),
                 lambda: similarity.cka_from_moments(m, "zz", "a"),
                 lambda: lmd.bootstrap_r2_samples(bm, ["a", "zz"], "b", 0.1, n_boot=5),
                 lambda: bm.select(["zz"])):
        with pytest.raises(lmd.LMDError, match=rf"unknown model\(s\) \['zz'\]; {known}"):
            call()
