"""LMD fits against numpy float64 least squares and explicit formulas."""

from __future__ import annotations

import numpy as np
import scipy.linalg
import pytest

from conftest import moments_of, r2_direct, ridge_reference, write_embeddings
from lmdecomp import lmd
from lmdecomp.lmd import memory as lmd_memory  # patched where check_block_memory looks it up
from lmdecomp.lmd.fits import _check_pivots
from lmdecomp.lmd.loo import _ridge_inverse
from lmdecomp.lmd.moments import _quadratic_forms, _sub, _symmetrise_from_lower


def planted(rng, n, widths, noise=0.3):
    """Models sharing a latent factor: x_m = latent @ A_m + offset_m + noise."""
    latent = rng.normal(size=(n, 6))
    return [latent @ rng.normal(size=(6, w)) + rng.normal(size=w) * 3 + noise * rng.normal(size=(n, w)) for w in widths]


def lstsq_fit(z, u):
    """Reference: numpy least squares with an explicit bias column."""
    design = np.hstack([z, np.ones((len(z), 1))])
    coef, *_ = np.linalg.lstsq(design, u, rcond=None)
    return coef[:-1].T, coef[-1]


@pytest.fixture()
def data():
    rng = np.random.default_rng(0)
    n = 900
    blocks = planted(rng, n, [7, 5, 9])
    split = rng.choice(np.array(lmd.SPLITS, dtype=object), size=n, p=[0.6, 0.2, 0.2])
    return blocks, split


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


def test_leave_one_out_equals_numpy_lstsq_on_concatenated_basis(data):
    blocks, split = data
    names = ["a", "b", "c"]
    m = moments_of(blocks, names, split)
    rows = {r["target"] + r["split"]: r["r2"] for r in lmd.fit_leave_one_out(m, alpha=0.0)}
    train = split == "train"
    for ti, target in enumerate(names):
        z = np.hstack([blocks[i] for i in range(3) if i != ti])
        w, b = lstsq_fit(z[train], blocks[ti][train])
        for s in lmd.SPLITS:
            assert rows[target + s] == pytest.approx(r2_direct(z[split == s], blocks[ti][split == s], w, b), abs=1e-8)


@pytest.mark.parametrize("scales", [(1.0, 1e3, 1e-2, 30.0), (1.0, 1e4, 1e-4, 30.0)])
@pytest.mark.parametrize("alpha", [0.05, [0.0, 1e-3, 0.05, 1.0]])
def test_leave_one_out_from_one_joint_inverse_equals_separate_solves(alpha, scales):
    """Every leave-one-out fit is read off one inverse of the regularised joint scatter; each
    must equal an explicit ridge solve on its own concatenated basis, on every split, also
    when the models' scales differ by orders of magnitude (a variance ratio of 1e16 makes the
    joint scatter's condition number ~1e16: the singularity check must not refuse it)."""
    rng = np.random.default_rng(21)
    n, widths = 700, [6, 4, 8, 5]
    blocks = [b * s for b, s in zip(planted(rng, n, widths, noise=1.0), scales)]
    split = rng.choice(np.array(lmd.SPLITS, dtype=object), size=n, p=[0.5, 0.25, 0.25])
    names = ["a", "b", "c", "d"]
    m = moments_of(blocks, names, split)
    rows = lmd.fit_leave_one_out(m, alpha)
    grid = alpha if isinstance(alpha, list) else [alpha]
    train = split == "train"
    for ti, target in enumerate(names):
        others = [i for i in range(4) if i != ti]
        z = np.hstack([blocks[i] for i in others])
        scores = {}
        for a in grid:  # brute force over the grid: fit on train, score on every split
            w, b = ridge_reference(z[train], blocks[ti][train], a, [widths[i] for i in others])
            scores[a] = {s: r2_direct(z[split == s], blocks[ti][split == s], w, b) for s in lmd.SPLITS}
        chosen = max(grid, key=lambda a: scores[a]["val"])
        got = {r["split"]: r for r in rows if r["target"] == target}
        for s in lmd.SPLITS:
            assert got[s]["alpha"] == chosen
            assert got[s]["r2"] == pytest.approx(scores[chosen][s], abs=1e-10)


def test_leave_one_out_without_ridge_when_the_joint_scatter_is_singular():
    """α = 0 with fewer train rows than the joint width but more than each basis width: the
    joint inverse does not exist, each fit still does (one solve per target instead)."""
    rng = np.random.default_rng(22)
    widths = [3, 4, 5]
    blocks = planted(rng, 40, widths)
    split = np.array(["train"] * 11 + ["val"] * 14 + ["test"] * 15, dtype=object)
    m = moments_of(blocks, ["a", "b", "c"], split)
    rows = lmd.fit_leave_one_out(m, 0.0)
    train = split == "train"
    for ti, target in enumerate(["a", "b", "c"]):
        z = np.hstack([blocks[i] for i in range(3) if i != ti])
        w, b = lstsq_fit(z[train], blocks[ti][train])
        for r in rows:
            if r["target"] == target:
                expected = r2_direct(z[split == r["split"]], blocks[ti][split == r["split"]], w, b)
                assert r["r2"] == pytest.approx(expected, abs=1e-8)


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


def assert_moments_equal_numpy(streamed, x, split):
    """Counts, sums and cross-products per split against float64 numpy on the rows in memory."""
    x = x.astype(np.float64)
    for s in lmd.SPLITS:
        rows = x[split == s]
        assert streamed.n[s] == len(rows)
        np.testing.assert_allclose(streamed.sums[s], rows.sum(0), rtol=1e-12)
        np.testing.assert_allclose(streamed.cross[s], rows.T @ rows, rtol=1e-12)


def test_streaming_moments_over_shards_equal_one_in_memory_pass(tmp_path):
    rng = np.random.default_rng(3)
    n = 250
    blocks = [b.astype(np.float32) for b in planted(rng, n, [4, 6, 3])]
    split = rng.choice(np.array(lmd.SPLITS, dtype=object), size=n)
    ids = np.arange(n, dtype=np.int64)
    names = ["m0", "m1", "m2"]
    for name, block in zip(names, blocks):
        write_embeddings(tmp_path / name, name, ids, split, block, rows_per_shard=64)
    streamed = lmd.accumulate_moments({name: tmp_path / name for name in names})
    assert_moments_equal_numpy(streamed, np.concatenate(blocks, axis=1), split)
    streamed.save(tmp_path / "m.safetensors")
    loaded = lmd.Moments.load(tmp_path / "m.safetensors")
    assert loaded.names == names and loaded.dims == [4, 6, 3]
    np.testing.assert_array_equal(loaded.cross["val"], streamed.cross["val"])


@pytest.mark.parametrize("flush_rows", [1, 5, 50, 2048])
def test_streaming_moments_for_every_flush_size(tmp_path, flush_rows, monkeypatch):
    """Rows are gathered per split into a buffer of ``flush_rows`` and added when it is full; a
    shard holding more rows of a split than that is added in chunks of ``flush_rows``. Small sizes
    chunk most shards; the result must equal float64 numpy for every size. Every update but a
    split's last holds exactly ``flush_rows`` rows (rows carry over from shard to shard)."""
    rng = np.random.default_rng(8)
    n = 230
    blocks = [b.astype(np.float32) for b in planted(rng, n, [5, 3])]
    split = rng.choice(np.array(lmd.SPLITS, dtype=object), size=n, p=[0.5, 0.25, 0.25])
    split[64:128] = "train"  # shard 1 is all train: 64 rows of one split, several chunks of the smaller sizes
    for name, block in zip(["a", "b"], blocks):
        write_embeddings(tmp_path / name, name, np.arange(n), split, block, rows_per_shard=64)
    updates = {s: [] for s in lmd.SPLITS}
    add = lmd.Moments._add

    def recording_add(self, s, x):
        updates[s].append(len(x))
        add(self, s, x)

    monkeypatch.setattr(lmd.Moments, "_add", recording_add)
    streamed = lmd.accumulate_moments({name: tmp_path / name for name in ["a", "b"]}, flush_rows=flush_rows)
    assert_moments_equal_numpy(streamed, np.concatenate(blocks, axis=1), split)
    for s in lmd.SPLITS:
        count = int(np.sum(split == s))
        assert updates[s] == [flush_rows] * (count // flush_rows) + ([count % flush_rows] if count % flush_rows else [])
    for s in lmd.SPLITS:
        np.testing.assert_array_equal(streamed.cross[s], streamed.cross[s].T)


@pytest.mark.parametrize("width,block", [(700, 512), (1030, 512), (20, 7), (7, 7)])
def test_symmetrise_from_lower_across_row_bands(width, block):
    """The lower triangle is copied onto the upper one a band of ``block`` rows at a time; widths
    past one band (and a last partial band) must give numpy's tril + tril(−1)ᵀ exactly."""
    a = np.random.default_rng(width).normal(size=(width, width))
    expected = np.tril(a) + np.tril(a, -1).T
    _symmetrise_from_lower(a, block=block)
    np.testing.assert_array_equal(a, expected)


@pytest.mark.parametrize("rows,width", [(5, 40), (1, 1), (3, 7)])
def test_quadratic_forms_from_one_triangle_equal_the_full_products(rows, width):
    """r S rᵀ per row from S's lower triangle (dtrmm) against an explicit float64 loop over
    i, j — on a contiguous S and on a block view of a larger scatter, as the pairwise fits
    pass it."""
    rng = np.random.default_rng(width)
    big = rng.normal(size=(width + 9, width + 9))
    big = big + big.T
    r = rng.normal(size=(rows, width))
    for scatter in (np.ascontiguousarray(big[3:3 + width, 3:3 + width]), big[3:3 + width, 3:3 + width]):
        expected = [sum(row[i] * scatter[i, j] * row[j] for i in range(width) for j in range(width)) for row in r]
        np.testing.assert_allclose(_quadratic_forms(scatter, r), expected, rtol=1e-12, atol=1e-12)


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


def four_shards_of_three_models(tmp_path, seed):
    """Float32 embeddings of models m0, m1, m2 (widths 4, 6, 3) for 250 sequences in 4 shards
    of 64, random splits: (blocks, split, folders)."""
    rng = np.random.default_rng(seed)
    n = 250
    blocks = [b.astype(np.float32) for b in planted(rng, n, [4, 6, 3])]
    split = rng.choice(np.array(lmd.SPLITS, dtype=object), size=n)
    names = ["m0", "m1", "m2"]
    for name, block in zip(names, blocks):
        write_embeddings(tmp_path / name, name, np.arange(n, dtype=np.int64), split, block, rows_per_shard=64)
    return blocks, split, {name: tmp_path / name for name in names}


@pytest.mark.parametrize("per_job", [1, 2, 3])
def test_moments_computed_in_parts_reduce_to_the_one_pass_bits(tmp_path, per_job):
    """The scale-out (lmd.shards_per_job): partial block moments over groups of shards, reduced,
    equal one pass bit for bit — with blocks of 37 sequences that straddle shards of 64."""
    blocks, split, folders = four_shards_of_three_models(tmp_path, seed=4)
    one_pass = lmd.accumulate_block_moments(folders, rows_per_block=37)
    parts = [lmd.accumulate_block_moments(folders, rows_per_block=37, shard_range=(lo, min(lo + per_job, 4)))
             for lo in range(0, 4, per_job)]
    assert sum(len(p) for p in parts) >= len(one_pass) == 7
    reduced = lmd.reduce_block_moments(part for part in parts)  # as the reduce job loads them: one at a time
    for field in ("n", "sums", "cross"):
        np.testing.assert_array_equal(getattr(reduced, field), getattr(one_pass, field))
    # and against an explicit float64 computation of each block
    x = np.concatenate(blocks, axis=1).astype(np.float64)
    for b in range(7):
        rows = x[37 * b:37 * (b + 1)][split[37 * b:37 * (b + 1)] == "train"]
        np.testing.assert_allclose(reduced.cross[b, 0], rows.T @ rows, rtol=1e-12, atol=1e-12)
    reduced.save(tmp_path / "r.safetensors")
    one_pass.save(tmp_path / "o.safetensors")
    assert (tmp_path / "r.safetensors").read_bytes() == (tmp_path / "o.safetensors").read_bytes()
    with pytest.raises(lmd.LMDError, match="not a part of a scale-out"):
        lmd.reduce_block_moments([one_pass])


@pytest.mark.parametrize("per_job", [1, 3])
def test_moments_without_blocks_computed_in_parts_reduce_to_the_one_pass_bits(tmp_path, per_job):
    """lmd.bootstrap: 0 with lmd.shards_per_job: streaming moments of groups of shards, reduced
    (from a generator, one part at a time), equal to the bit the one pass that sums the same
    groups (group_shards), and an explicit float64 computation; the ungrouped pass flushes at
    other rows, so it agrees to rounding only. The reduce checks that the parts tile the shards."""
    blocks, split, folders = four_shards_of_three_models(tmp_path, seed=8)
    one_pass = lmd.accumulate_moments(folders, flush_rows=16, group_shards=per_job)
    ungrouped = lmd.accumulate_moments(folders, flush_rows=16)
    parts = [lmd.accumulate_moments(folders, flush_rows=16, shard_range=(lo, min(lo + per_job, 4)))
             for lo in range(0, 4, per_job)]
    assert [p.info["shard_range"] for p in parts] == [[lo, min(lo + per_job, 4)] for lo in range(0, 4, per_job)]
    assert {p.info["n_shards"] for p in parts} == {4}
    reduced = lmd.reduce_moments(part for part in parts)
    assert "shard_range" not in reduced.info and reduced.info == one_pass.info == ungrouped.info
    reduced.save(tmp_path / "r.safetensors")
    one_pass.save(tmp_path / "o.safetensors")
    assert (tmp_path / "r.safetensors").read_bytes() == (tmp_path / "o.safetensors").read_bytes()
    x = np.concatenate(blocks, axis=1).astype(np.float64)
    for s in lmd.SPLITS:
        rows = x[split == s]
        assert reduced.n[s] == ungrouped.n[s] == len(rows)
        np.testing.assert_allclose(reduced.sums[s], ungrouped.sums[s], rtol=1e-13, atol=1e-12)
        np.testing.assert_allclose(reduced.cross[s], ungrouped.cross[s], rtol=1e-13, atol=1e-11)
        np.testing.assert_allclose(reduced.cross[s], rows.T @ rows, rtol=1e-12, atol=1e-10)
    if per_job == 1:
        with pytest.raises(lmd.LMDError, match=r"part 1 \(shards 0..0\) overlaps"):
            lmd.reduce_moments([parts[0], *parts[:3]])
        with pytest.raises(lmd.LMDError, match=r"shards 3..3 are in no part"):
            lmd.reduce_moments(parts[:3])


def test_block_moments_that_cannot_fit_in_memory_are_refused_before_the_pass(tmp_path, monkeypatch):
    """8 · blocks · 3 · width² bytes: the paper's 12 × 768-wide models with 40 blocks need 76 GiB;
    the error gives the numbers and the two ways out instead of an out-of-memory kill."""
    gib = 2**30
    with pytest.raises(lmd.LMDError, match=r"need 75\.9 GiB \(40 blocks × 3 splits × 9216² float64.*16\.0 GiB.*"
                                           r"lmd.bootstrap_blocks.*lmd.bootstrap: 0"):
        lmd.check_block_memory(40, 9216, available=16 * gib)
    lmd.check_block_memory(2, 9216, available=16 * gib)  # 3.8 GiB fits
    rng = np.random.default_rng(9)
    split = np.array(["train"] * 30, dtype=object)
    for name in ("a", "b"):
        write_embeddings(tmp_path / name, name, np.arange(30), split, rng.normal(size=(30, 5)).astype(np.float32), 10)
    folders = {name: tmp_path / name for name in ("a", "b")}
    needed = 8 * 3 * 3 * 10**2  # 3 blocks of 10 sequences, width 10
    monkeypatch.setattr(lmd_memory, "available_memory_bytes", lambda: needed)
    with pytest.raises(lmd.LMDError, match="block moments need"):
        lmd.accumulate_block_moments(folders, rows_per_block=10)
    monkeypatch.setattr(lmd_memory, "available_memory_bytes", lambda: 2 * needed)
    assert len(lmd.accumulate_block_moments(folders, rows_per_block=10)) == 3


def test_parts_that_do_not_tile_the_shards_are_refused(tmp_path):
    """Parts of one shard each: a part passed twice, missing, or out of order would add blocks
    twice or leave them empty, silently; the reduce checks the recorded shard ranges instead."""
    rng = np.random.default_rng(5)
    n = 160
    split = rng.choice(np.array(lmd.SPLITS, dtype=object), size=n)
    for name in ("a", "b"):
        write_embeddings(tmp_path / name, name, np.arange(n), split, rng.normal(size=(n, 3)).astype(np.float32), 40)
    folders = {name: tmp_path / name for name in ("a", "b")}
    p0, p1, p2, p3 = (lmd.accumulate_block_moments(folders, rows_per_block=30, shard_range=(k, k + 1))
                      for k in range(4))
    assert p2.info["shard_range"] == [2, 3] and p2.info["n_shards"] == 4
    reduced = lmd.reduce_block_moments([p0, p1, p2, p3])
    assert "shard_range" not in reduced.info and "block_offset" not in reduced.info
    np.testing.assert_array_equal(reduced.n.sum(axis=0), [(split == s).sum() for s in lmd.SPLITS])
    for parts, message in (([p0, p0, p2, p3], r"part 1 \(shards 0..0\) overlaps the parts before it"),
                           ([p0, p1, p3], r"shards 2..2 are in no part"),
                           ([p0, p1, p2], r"shards 3..3 are in no part"),
                           ([p1, p0, p2, p3], r"shards 0..0 are in no part"),
                           ([p0, p1, p2, p3, p3], r"part 4 \(shards 3..3\) overlaps")):
        with pytest.raises(lmd.LMDError, match=message):
            lmd.reduce_block_moments(parts)
    old = lmd.BlockMoments(p1.names, p1.dims, p1.n, p1.sums, p1.cross,
                           {k: v for k, v in p1.info.items() if k != "shard_range"})
    with pytest.raises(lmd.LMDError, match="do not record their shard range"):
        lmd.reduce_block_moments([p0, old, p2, p3])


def test_models_with_different_seq_ids_are_refused(tmp_path):
    rng = np.random.default_rng(4)
    split = np.array(["train"] * 40, dtype=object)
    write_embeddings(tmp_path / "a", "a", np.arange(40), split, rng.normal(size=(40, 3)).astype(np.float32), 20)
    write_embeddings(tmp_path / "b", "b", np.arange(40) + 1, split, rng.normal(size=(40, 3)).astype(np.float32), 20)
    with pytest.raises(lmd.LMDError, match="different seq_id sets"):
        lmd.accumulate_moments({"a": tmp_path / "a", "b": tmp_path / "b"})


# ------------------------------------------------------------------ inputs that are refused


def _three_models(seed=30, n=300, const=None):
    """Moments of models a, b, c (and their block moments); ``const`` replaces c by that constant."""
    rng = np.random.default_rng(seed)
    blocks = planted(rng, n, [4, 3, 5])
    if const is not None:
        blocks[2] = np.full((n, 5), const)
    split = rng.choice(np.array(lmd.SPLITS, dtype=object), size=n, p=[0.6, 0.2, 0.2])
    m = moments_of(blocks, ["a", "b", "c"], split)
    edges = np.linspace(0, n, 6).astype(int)
    bm = lmd.BlockMoments.from_moments([moments_of([b[lo:hi] for b in blocks], ["a", "b", "c"], split[lo:hi])
                                        for lo, hi in zip(edges[:-1], edges[1:])])
    return m, bm


ENTRY_POINTS = {
    "fit_ridge": lambda m, bm, a: lmd.fit_ridge(m, ["a"], "b", a),
    "fit_targets": lambda m, bm, a: lmd.fit_targets(m, ["a"], ["b", "c"], a),
    "fit_with_alpha": lambda m, bm, a: lmd.fit_with_alpha(m, ["a", "c"], "b", a),
    "fit_pairwise": lambda m, bm, a: lmd.fit_pairwise(m, a),
    "fit_leave_one_out": lambda m, bm, a: lmd.fit_leave_one_out(m, a),
    "greedy_selection": lambda m, bm, a: lmd.greedy_selection(m, "b", a),
    "bootstrap_r2_samples": lambda m, bm, a: lmd.bootstrap_r2_samples(bm, ["a"], "b", a, n_boot=5),
    "bootstrap_r2": lambda m, bm, a: lmd.bootstrap_r2(bm, ["a"], "b", a, n_boot=5),
    "ridge_penalty": lambda m, bm, a: lmd.ridge_penalty(np.ones(3), [3], a),
}


@pytest.mark.parametrize("alpha", [-0.5, float("nan"), float("inf"), "0.1"])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_one_alpha_must_be_finite_and_non_negative_everywhere(entry, alpha):
    """The grid's check applies to a single α too: a negative ridge ran silently, NaN gave all-NaN
    R² (or a StopIteration in fit_pairwise)."""
    m, bm = _three_models()
    ENTRY_POINTS[entry](m, bm, 0.1)  # the same call with a valid α runs
    with pytest.raises(lmd.LMDError, match="α must be"):
        ENTRY_POINTS[entry](m, bm, alpha)


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


def test_different_shard_layouts_name_the_first_differing_shard(tmp_path):
    rng = np.random.default_rng(6)
    split = np.array(["train"] * 60, dtype=object)
    x = rng.normal(size=(60, 3)).astype(np.float32)
    write_embeddings(tmp_path / "a", "a", np.arange(60), split, x, 30)  # shards of 30, 30
    write_embeddings(tmp_path / "b", "b", np.arange(60), split, x, 40)  # 40, 20: same count
    write_embeddings(tmp_path / "c", "c", np.arange(60), split, x, 20)  # 3 shards
    with pytest.raises(lmd.LMDError, match="shard 0 holds 30 rows for 'a' but 40 for 'b'"):
        lmd.accumulate_moments({"a": tmp_path / "a", "b": tmp_path / "b"})
    with pytest.raises(lmd.LMDError, match=r"\(2 vs 3 shards\)"):
        lmd.accumulate_moments({"a": tmp_path / "a", "c": tmp_path / "c"})
