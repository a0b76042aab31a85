"""lmdecomp.lmd.fits: ridge and pairwise fits, their R², α chosen on val, and the pivot and input
checks, against numpy least squares, explicit ridge solves and brute force over the α grid."""

from __future__ import annotations

import numpy as np
import scipy.linalg
import pytest

from conftest import moments_of, r2_direct, ridge_reference
from lmd_helpers import _three_models, lstsq_fit
from lmd_helpers import data, noisy  # noqa: F401  (fixtures)
from lmdecomp import lmd
from lmdecomp.lmd.fits import _check_pivots
from lmdecomp.lmd.loo import _ridge_inverse

GRID = [0.0, 1e-3, 1e-2, 0.03, 0.1, 0.3, 1.0, 3.0]


def test_pairwise_fit_equals_numpy_lstsq(data):
    blocks, split = data
    names = ["a", "b", "c"]
    m = moments_of(blocks, names, split)
    train = split == "train"
    for ti, target in enumerate(names):
        for bi, basis in enumerate(names):
            if bi == ti:
                continue
            fit = lmd.fit_ridge(m, [basis], target, alpha=0.0)
            w_ref, b_ref = lstsq_fit(blocks[bi][train], blocks[ti][train])
            np.testing.assert_allclose(fit.weight, w_ref, rtol=1e-8, atol=1e-9)
            np.testing.assert_allclose(fit.bias, b_ref, rtol=1e-8, atol=1e-8)
            for s in lmd.SPLITS:
                rows = split == s
                expected = r2_direct(blocks[bi][rows], blocks[ti][rows], w_ref, b_ref)
                assert lmd.r_squared(m, fit, s) == pytest.approx(expected, abs=1e-8)


def test_pairwise_rows_equal_explicit_residuals_on_every_split(data):
    """fit_pairwise scores val and test through one gram of each target's weights
    (fits._block_grams); every row must equal R² from the residuals of numpy's least squares."""
    blocks, split = data
    names = ["a", "b", "c"]
    rows = lmd.fit_pairwise(moments_of(blocks, names, split), 0.0)
    train = split == "train"
    for r in rows:
        bi, ti = names.index(r["basis"]), names.index(r["target"])
        w_ref, b_ref = lstsq_fit(blocks[bi][train], blocks[ti][train])
        held = split == r["split"]
        assert r["r2"] == pytest.approx(r2_direct(blocks[bi][held], blocks[ti][held], w_ref, b_ref), abs=1e-8)
    assert len(rows) == 3 * 2 * 3


def test_least_squares_on_a_layernorm_basis_is_refused_as_singular():
    """LayerNorm outputs satisfy Σ_j (x_j − β_j)/γ_j = 0 on every row, so their scatter is
    singular up to float32 rounding, and Cholesky succeeds (checked here): α = 0 must be refused
    by the pivot test, not return weights of astronomical norm. A grid skips α = 0."""
    rng = np.random.default_rng(8)
    n, p = 400, 6
    gain, shift = rng.uniform(0.5, 2.0, p), rng.normal(size=p)
    raw = rng.normal(size=(n, p)) @ rng.normal(size=(p, p))
    normed = (raw - raw.mean(axis=1, keepdims=True)) / raw.std(axis=1, keepdims=True)
    layernormed = (normed * gain + shift).astype(np.float32)
    target = layernormed[:, :2] + (0.1 * rng.normal(size=(n, 2))).astype(np.float32)
    split = np.array(["train"] * 300 + ["val"] * 50 + ["test"] * 50, dtype=object)
    m = moments_of([layernormed, target], ["ln", "t"], split)
    cols = m.columns(["ln"])
    scipy.linalg.cho_factor(m.scatter_block("train", cols, cols))  # rounding hides the singularity from Cholesky
    with pytest.raises(lmd.LMDError, match=r"ill-posed: column 5 is a linear combination .* float32 rounding"):
        lmd.fit_ridge(m, ["ln"], "t", 0.0)
    fit, table = lmd.select_alpha(m, ["ln"], "t", [0.0, 0.1], warn_edge=False)
    assert fit.alpha == 0.1 and np.isnan(table[0]["val_r2"])
    # leave-one-out: the joint scatter names the column; every basis holding "ln" is skipped
    with pytest.raises(lmd.LMDError, match=r"ill-posed: the train scatter of \['ln'\] alone is singular"):
        lmd.fit_leave_one_out(m, 0.0)
    with pytest.raises(lmd.LMDError, match=r"column ln\[5\] is a linear combination"):
        _ridge_inverse(m, np.zeros(m.width))
    rows = lmd.fit_leave_one_out(m, [0.0, 0.1])
    assert {r["alpha"] for r in rows if r["target"] == "t"} == {0.1}


def test_cholesky_pivots_are_the_share_of_each_column_left_unexplained():
    """U_jj² / A_jj (A = XᵀX = UᵀU) against 1 − R² of column j of X regressed (with lstsq) on the
    columns before it; so a column that is a combination of earlier ones up to float32
    rounding (share ~u²) is refused, and healthy columns are not, whatever their scales."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(50, 6)) * np.array([1e-5, 1.0, 1e5, 3.0, 1e3, 0.1])
    factor = np.linalg.cholesky(x.T @ x).T
    for j in range(1, 6):
        coef = np.linalg.lstsq(x[:, :j], x[:, j], rcond=None)[0]
        unexplained = np.sum((x[:, j] - x[:, :j] @ coef) ** 2) / np.sum(x[:, j] ** 2)
        assert factor[j, j] ** 2 / (x[:, j] @ x[:, j]) == pytest.approx(unexplained, rel=1e-8)
    _check_pivots(np.diagonal(factor), np.diagonal(x.T @ x), "well posed")
    dependent = np.column_stack([x, (x[:, 1] - 2e-5 * x[:, 2]).astype(np.float32)])
    factor = scipy.linalg.cholesky(dependent.T @ dependent)
    with pytest.raises(lmd.LMDError, match="column 6 is a linear combination"):
        _check_pivots(np.diagonal(factor), np.diagonal(dependent.T @ dependent), "dependent")


def test_ridge_matches_explicit_centred_solution(data):
    blocks, split = data
    m = moments_of(blocks, ["a", "b", "c"], split)
    alpha = 0.3
    fit = lmd.fit_ridge(m, ["a", "c"], "b", alpha)
    train = split == "train"
    z = np.hstack([blocks[0], blocks[2]])[train]
    u = blocks[1][train]
    widths = [blocks[0].shape[1], blocks[2].shape[1]]
    w, _ = ridge_reference(z, u, alpha, widths)
    np.testing.assert_allclose(fit.weight, w, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(fit.bias, u.mean(0) - w @ z.mean(0), rtol=1e-9, atol=1e-10)
    val = split == "val"
    zv = np.hstack([blocks[0], blocks[2]])[val]
    assert lmd.r_squared(m, fit, "val") == pytest.approx(r2_direct(zv, blocks[1][val], w, fit.bias), abs=1e-10)
    # so a model's overall scale does not change the fit: only its weights rescale
    rescaled = lmd.fit_ridge(moments_of([blocks[0] * 1000.0, blocks[1], blocks[2]], ["a", "b", "c"], split),
                             ["a", "c"], "b", alpha)
    np.testing.assert_allclose(rescaled.weight[:, :widths[0]] * 1000.0, fit.weight[:, :widths[0]], rtol=1e-7)
    np.testing.assert_allclose(rescaled.weight[:, widths[0]:], fit.weight[:, widths[0]:], rtol=1e-7)


def test_exactly_linear_target_has_r2_one():
    rng = np.random.default_rng(1)
    z = rng.normal(size=(400, 6)) * 5 + 2
    u = z @ rng.normal(size=(6, 4)) + rng.normal(size=4)
    split = np.array(["train"] * 200 + ["val"] * 100 + ["test"] * 100, dtype=object)
    m = moments_of([z, u], ["z", "u"], split)
    fit = lmd.fit_ridge(m, ["z"], "u", 0.0)
    for s in lmd.SPLITS:
        assert abs(lmd.r_squared(m, fit, s) - 1.0) < 1e-9


def test_least_squares_with_too_few_rows_is_refused():
    rng = np.random.default_rng(2)
    z, u = rng.normal(size=(30, 8)), rng.normal(size=(30, 2))
    split = np.array(["train"] * 6 + ["val"] * 12 + ["test"] * 12, dtype=object)
    m = moments_of([z, u], ["z", "u"], split)
    with pytest.raises(lmd.LMDError, match="6 train rows for a basis 8 wide"):
        lmd.fit_ridge(m, ["z"], "u", 0.0)
    assert np.isfinite(lmd.r_squared(m, lmd.fit_ridge(m, ["z"], "u", 0.1), "test"))


def test_fits_need_at_least_two_models_and_a_basis():
    rng = np.random.default_rng(31)
    x = rng.normal(size=(200, 3))
    split = np.array(["train", "val", "test"] * 66 + ["train", "train"], dtype=object)
    one = moments_of([x], ["a"], split)
    for fit in (lmd.fit_pairwise, lmd.fit_leave_one_out):
        with pytest.raises(lmd.LMDError, match="LMD needs at least two models"):
            fit(one, 0.1)
    with pytest.raises(lmd.LMDError, match="LMD needs at least two models"):
        lmd.greedy_selection(one, "a", 0.1)
    m, bm = _three_models()
    with pytest.raises(lmd.LMDError, match="on an empty basis"):
        lmd.fit_ridge(m, [], "b", 0.1)
    with pytest.raises(lmd.LMDError, match="on an empty basis"):
        lmd.fit_targets(m, [], ["b"], [0.1, 1.0])
    with pytest.raises(lmd.LMDError, match="on an empty basis"):
        lmd.bootstrap_r2_samples(bm, [], "b", 0.1, n_boot=5)
    with pytest.raises(lmd.LMDError, match="as a list"):
        lmd.fit_ridge(m, "a", "b", 0.1)


@pytest.mark.parametrize("const", [0.0, 0.1, 3.7e4])
def test_a_constant_basis_model_is_named(const):
    """tr(S_cc) = 0 (exactly, or up to the rounding of C − nμμᵀ for a constant like 0.1) makes
    c's λ = α·tr(S_cc)/p zero for every α: the error names c instead of asking for an α > 0."""
    m, bm = _three_models(const=const)
    message = "basis model 'c' is constant on the train split"
    calls = [lambda: lmd.fit_ridge(m, ["a", "c"], "b", 0.1), lambda: lmd.fit_ridge(m, ["c"], "b", 0.0),
             lambda: lmd.fit_targets(m, ["c"], ["a", "b"], [0.0, 0.1, 1.0]),
             lambda: lmd.fit_pairwise(m, [0.1, 1.0]), lambda: lmd.fit_leave_one_out(m, 0.1),
             lambda: lmd.greedy_selection(m, "b", 0.1),
             lambda: lmd.bootstrap_r2_samples(bm, ["a", "c"], "b", 0.1, n_boot=5)]
    for call in calls:
        with pytest.raises(lmd.LMDError, match=message):
            call()
    # a model with a tiny spread around a large offset is not constant: std/|mean| = 1e-5 here
    rng = np.random.default_rng(32)
    n = 300
    split = rng.choice(np.array(lmd.SPLITS, dtype=object), size=n, p=[0.6, 0.2, 0.2])
    z = 1e4 + 0.1 * rng.normal(size=(n, 2))
    u = (z - 1e4) @ rng.normal(size=(2, 3)) + rng.normal(size=(n, 3))
    tiny = moments_of([z, u], ["z", "u"], split)
    fit = lmd.fit_ridge(tiny, ["z"], "u", 0.01)
    train = split == "train"
    w, b = ridge_reference(z[train], u[train], 0.01)
    # C − nμμᵀ cancels mean²/var = 1e10 here: ~eps·1e10 relative error left, hence the rtol
    np.testing.assert_allclose(fit.weight, w, rtol=1e-4)


def test_a_target_constant_on_a_held_out_split_is_refused():
    """A target identical on every val row has tr S_uu = 0, but C − nμμᵀ leaves rounding noise
    that is positive for about half the constants; R² = 1 − SSE/noise was then −1e17. Every
    entry point that scores val must refuse it, whatever the constant's rounding."""
    rng = np.random.default_rng(33)
    n, k = 200, 27
    split = np.array(["train"] * (n - 2 * k) + ["val"] * k + ["test"] * k, dtype=object)
    z = rng.normal(size=(n, 3))
    positive_noise = 0
    for const in (0.0, 0.1, 3.7e4, 0.42659544944763184):  # the last one's rounding is positive here
        u = z @ rng.normal(size=(3, 1)) + 0.1 * rng.normal(size=(n, 1))
        u[split == "val"] = const
        m = moments_of([z, u], ["z", "u"], split)
        positive_noise += m.scatter_diagonal("val")[3:].sum() > 0
        fit = lmd.fit_ridge(m, ["z"], "u", 0.1)
        assert np.isfinite(lmd.r_squared(m, fit, "test"))  # test rows vary: scored as usual
        for call in (lambda: lmd.r_squared(m, fit, "val"), lambda: lmd.fit_targets(m, ["z"], ["u"], [0.1, 1.0]),
                     lambda: lmd.fit_leave_one_out(m, 0.1)):
            with pytest.raises(lmd.LMDError, match="target 'u' has zero variance on the val split"):
                call()
    assert positive_noise > 0  # the case the old exact test (tr S ≤ 0) let through


def test_targets_sharing_a_basis_equal_per_alpha_fit_ridge(noisy):
    """fit_targets solves every target of a basis with one factor per α; each target's fit and
    its val table equal separate fit_ridge / r_squared calls for every α of the grid."""
    blocks, names, split, m = noisy
    fits = lmd.fit_targets(m, ["a", "c"], ["b", "d"], GRID)
    for target in ("b", "d"):
        fit, table = fits[target]
        per_alpha = [lmd.fit_ridge(m, ["a", "c"], target, alpha) for alpha in GRID]
        vals = [lmd.r_squared(m, f, "val") for f in per_alpha]
        np.testing.assert_allclose([row["val_r2"] for row in table], vals, rtol=0, atol=1e-10)
        chosen = per_alpha[int(np.argmax(vals))]
        assert fit.alpha == chosen.alpha
        np.testing.assert_allclose(fit.weight, chosen.weight, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(fit.bias, chosen.bias, rtol=1e-9, atol=1e-10)


def test_select_alpha_picks_the_brute_force_val_optimum(noisy):
    blocks, names, split, m = noisy
    chosen = []
    for target in names:
        for basis in ([n for n in names if n != target], [names[(names.index(target) + 1) % 4]]):
            fit, table = lmd.select_alpha(m, basis, target, GRID)
            brute = []
            for alpha in GRID:  # independent reference: one solve and one explicit score per α
                zi = np.hstack([blocks[names.index(b)] for b in basis])
                w, b = ridge_reference(zi[split == "train"], blocks[names.index(target)][split == "train"], alpha,
                                    [blocks[names.index(b)].shape[1] for b in basis])
                brute.append(r2_direct(zi[split == "val"], blocks[names.index(target)][split == "val"], w, b))
            assert [row["alpha"] for row in table] == GRID
            np.testing.assert_allclose([row["val_r2"] for row in table], brute, rtol=0, atol=1e-9)
            assert fit.alpha == GRID[int(np.argmax(brute))]
            ref = lmd.fit_ridge(m, basis, target, fit.alpha)
            np.testing.assert_array_equal(fit.weight, ref.weight)
            chosen.append(fit.alpha)
    # The data were built so that selection matters: neither end of the grid always wins.
    assert len(set(chosen)) > 1 and any(0 < a < GRID[-1] for a in chosen)


def test_least_squares_in_a_grid_is_skipped_when_the_basis_is_too_wide():
    rng = np.random.default_rng(11)
    z, u = rng.normal(size=(40, 8)), rng.normal(size=(40, 2))
    split = np.array(["train"] * 6 + ["val"] * 17 + ["test"] * 17, dtype=object)
    m = moments_of([z, u], ["z", "u"], split)
    fit, table = lmd.select_alpha(m, ["z"], "u", [0.0, 0.5, 2.0])
    assert np.isnan(table[0]["val_r2"]) and fit.alpha in (0.5, 2.0)
    with pytest.raises(lmd.LMDError, match="no α"):
        lmd.select_alpha(m, ["z"], "u", [0.0])
    with pytest.raises(lmd.LMDError, match="empty"):
        lmd.fit_pairwise(m, [])
