"""lmdecomp.mpo.decompose: factorize, the TT-SVD (bond caps, error budgets), MPO counts and
contract_cores, against numpy SVDs and einsums, a numpy TT-SVD sweep and hand counts."""

from __future__ import annotations

import math
import string

import numpy as np
import pytest
import torch

from lmdecomp.mpo.decompose import MPO, _rebuild_costs, contract_cores, factorize, mpo_decompose
from lmdecomp.mpo.layer import MPOLinear
from mpo_helpers import linear

BERT_768 = [4, 4, 4, 4, 3]
BERT_3072 = [4, 4, 8, 6, 4]


def dense_reference(cores: list[torch.Tensor]) -> np.ndarray:
    """The matrix an MPO represents, by one numpy einsum over all cores."""
    n = len(cores)
    letters = iter(string.ascii_letters)
    bonds = [next(letters) for _ in range(n + 1)]
    outs = [next(letters) for _ in range(n)]
    ins = [next(letters) for _ in range(n)]
    terms = [bonds[k] + outs[k] + ins[k] + bonds[k + 1] for k in range(n)]
    spec = ",".join(terms) + "->" + "".join(outs) + "".join(ins)
    full = np.einsum(spec, *[c.detach().double().numpy() for c in cores], optimize=True)
    rows = math.prod(c.shape[1] for c in cores)
    return full.reshape(rows, -1)


def mpo_like_matrix(out_shape, in_shape, bond: int, seed: int) -> torch.Tensor:
    """A float64 matrix with decaying TT spectra: a random MPO whose bond channel s is
    damped by 0.7**s, plus a little dense noise (so no unfolding is exactly low rank)."""
    g = torch.Generator().manual_seed(seed)
    n = len(out_shape)
    bonds = [1] + [bond] * (n - 1) + [1]
    cores = []
    for k in range(n):
        core = torch.randn(bonds[k], out_shape[k], in_shape[k], bonds[k + 1], generator=g, dtype=torch.float64)
        cores.append(core * 0.7 ** torch.arange(bonds[k + 1], dtype=torch.float64))
    w = torch.from_numpy(dense_reference(cores))
    return w / w.norm() + 1e-4 * torch.randn(w.shape, generator=g, dtype=torch.float64) / math.sqrt(w.numel())


def test_factorize_bert_dims():
    assert factorize(768, 5) == BERT_768
    assert factorize(3072, 5) == BERT_3072


@pytest.mark.parametrize("dim,n", [(64, 5), (256, 5), (1000, 3), (30522, 4), (1, 3), (97, 2)])
def test_factorize_product_and_length(dim, n):
    factors = factorize(dim, n)
    assert len(factors) == n and math.prod(factors) == dim and min(factors) >= 1


def test_factorize_prime_needs_ones():
    assert factorize(769, 5) == [1, 1, 769, 1, 1]
    with pytest.raises(ValueError, match="769"):
        factorize(769, 5, min_factor=2)
    with pytest.raises(ValueError):
        factorize(0, 5)


@pytest.mark.parametrize("out_dim,in_dim", [(768, 768), (3072, 768), (768, 3072)])
def test_full_rank_reconstruction_float64(out_dim, in_dim):
    w = torch.randn(out_dim, in_dim, generator=torch.Generator().manual_seed(out_dim + in_dim), dtype=torch.float64)
    mpo = mpo_decompose(w)
    assert mpo.out_shape == tuple(factorize(out_dim)) and mpo.in_shape == tuple(factorize(in_dim))
    assert np.abs(dense_reference(mpo.cores) - w.numpy()).max() <= 1e-10
    assert (mpo.to_matrix() - w).abs().max().item() <= 1e-10


@pytest.fixture(scope="module")
def mpo_3072x768() -> MPO:
    return mpo_decompose(torch.randn(3072, 768, generator=torch.Generator().manual_seed(1)), BERT_3072, BERT_768)


def test_full_rank_bond_dims_3072x768(mpo_3072x768):
    mpo = mpo_3072x768
    assert mpo.bond_dims == [1, 16, 256, 288, 12, 1]
    assert [tuple(c.shape) for c in mpo.cores] == [
        (1, 4, 4, 16),
        (16, 4, 4, 256),
        (256, 8, 4, 288),
        (288, 6, 4, 12),
        (12, 4, 3, 1),
    ]
    assert mpo.central_index == 2 and mpo.central_tensor is mpo.cores[2]
    assert len(mpo.auxiliary_tensors) == 4


def test_float32_full_rank():
    w = torch.randn(768, 768, generator=torch.Generator().manual_seed(2))
    mpo = mpo_decompose(w)
    assert all(c.dtype == torch.float32 for c in mpo.cores)
    assert ((mpo.to_matrix() - w).norm() / w.norm()).item() < 1e-5


def test_single_step_error_is_discarded_singular_values():
    """Two cores = one SVD step: the error must be √(Σ discarded σ²) of that unfolding."""
    w = mpo_like_matrix([16, 48], [16, 48], bond=64, seed=3)
    keep = 8
    mpo = mpo_decompose(w, [16, 48], [16, 48], max_bond=keep)
    unfolding = w.numpy().reshape(16, 48, 16, 48).transpose(0, 2, 1, 3).reshape(16 * 16, 48 * 48)
    sigma = np.linalg.svd(unfolding, compute_uv=False)
    expected = math.sqrt(float(np.sum(sigma[keep:] ** 2)))
    assert expected > 1e-3 * np.linalg.norm(sigma)  # the truncation really discards something
    assert mpo.bond_dims == [1, keep, 1]
    assert np.linalg.norm(dense_reference(mpo.cores) - w.numpy()) == pytest.approx(expected, rel=1e-9)
    assert mpo.truncation_errors[0] == pytest.approx(expected, rel=1e-9)
    np.testing.assert_allclose(mpo.spectra[0].numpy(), sigma, rtol=1e-9, atol=1e-14)


def test_first_step_spectrum_of_five_core_sweep():
    w = torch.randn(768, 768, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    mpo = mpo_decompose(w, BERT_768, BERT_768)
    unfolding = w.numpy().reshape(BERT_768 + BERT_768).transpose(0, 5, 1, 2, 3, 4, 6, 7, 8, 9).reshape(16, -1)
    np.testing.assert_allclose(mpo.spectra[0].numpy(), np.linalg.svd(unfolding, compute_uv=False), rtol=1e-10)


def reference_tt_svd(w: np.ndarray, out_shape, in_shape, rel_err: float, carry: bool) -> tuple[list[int], float]:
    """Bond dims and ‖W − Ŵ‖_F of a numpy TT-SVD sweep under the error budget τ²‖W‖²:
    ``carry=False`` splits it equally (δ² = τ²‖W‖²/(n−1) per step), ``carry=True`` gives
    step k (0-based) the unused rest over the steps left, (τ²‖W‖² − Σ_{j<k} ε_j²)/(n−1−k).
    Each step keeps the smallest rank whose discarded tail Σ σ² fits, found by a loop."""
    n = len(out_shape)
    t = w.reshape(list(out_shape) + list(in_shape)).transpose([p for k in range(n) for p in (k, n + k)])
    budget = rel_err**2 * float(np.sum(w**2))
    used, rank, bonds, rest = 0.0, 1, [1], t
    for k in range(n - 1):
        _, sigma, vh = np.linalg.svd(rest.reshape(rank * out_shape[k] * in_shape[k], -1), full_matrices=False)
        delta_sq = (budget - used) / (n - 1 - k) if carry else budget / (n - 1)
        keep = len(sigma)
        while keep > 1 and float(np.sum(sigma[keep - 1 :] ** 2)) <= delta_sq:
            keep -= 1
        used += float(np.sum(sigma[keep:] ** 2))
        bonds.append(keep)
        rest, rank = sigma[:keep, None] * vh[:keep], keep
    return bonds + [1], math.sqrt(used)


def mpo_params(bonds, out_shape, in_shape) -> int:
    return sum(bonds[k] * out_shape[k] * in_shape[k] * bonds[k + 1] for k in range(len(out_shape)))


@pytest.mark.parametrize("canonical", ["mixed", "left"])
@pytest.mark.parametrize("seed", [10, 11, 12])
def test_rel_err_budget_is_respected(seed, canonical):
    out_shape, in_shape = [4, 4, 4, 4], [4, 4, 4, 4]
    w = mpo_like_matrix(out_shape, in_shape, bond=24, seed=seed)
    w_norm = np.linalg.norm(w.numpy())
    full = mpo_decompose(w, out_shape, in_shape, canonical=canonical).bond_dims
    for rel_err in [0.5, 0.2, 0.05, 0.01, 1e-3]:
        mpo = mpo_decompose(w, out_shape, in_shape, rel_err=rel_err, canonical=canonical)
        err = np.linalg.norm(dense_reference(mpo.cores) - w.numpy())
        assert err <= rel_err * w_norm * (1 + 1e-12)
        assert any(r < f for r, f in zip(mpo.bond_dims, full))  # truncation happened
        # The step errors are orthogonal: ‖W − Ŵ‖² = Σ ε_k² (reported), ε_k from the spectra.
        assert err == pytest.approx(mpo.error_norm, rel=1e-6)
        # Each kept rank is the smallest whose discarded tail fits the carried budget.
        bonds, ref_err = reference_tt_svd(w.numpy(), out_shape, in_shape, rel_err, carry=True)
        assert mpo.bond_dims == bonds
        assert err == pytest.approx(ref_err, rel=1e-6)


@pytest.mark.parametrize("canonical", ["mixed", "left"])
@pytest.mark.parametrize("kind", ["gaussian", "mpo_like"])
def test_rel_err_bound_holds_over_many_budgets(kind, canonical):
    out_shape, in_shape = [2, 4, 3, 4], [4, 2, 4, 3]
    if kind == "gaussian":
        w = torch.randn(96, 96, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    else:
        w = mpo_like_matrix(out_shape, in_shape, bond=16, seed=14)
    w_norm = np.linalg.norm(w.numpy())
    ranks = set()
    for rel_err in np.geomspace(1e-3, 0.95, 30):
        mpo = mpo_decompose(w, out_shape, in_shape, rel_err=float(rel_err), canonical=canonical)
        assert np.linalg.norm(dense_reference(mpo.cores) - w.numpy()) <= rel_err * w_norm * (1 + 1e-12)
        ranks.add(tuple(mpo.bond_dims))
    assert len(ranks) >= 5  # the budgets really truncate differently


def test_carried_budget_keeps_no_more_parameters_than_the_equal_split():
    """The first unfolding is 4 × 4096: its 4 singular values are all large, so the equal
    split keeps all of them (ε_1 = 0) and its share is lost; carried forward it lets the
    later steps discard more."""
    out_shape, in_shape = [2, 4, 4, 4], [2, 4, 4, 4]
    w = mpo_like_matrix(out_shape, in_shape, bond=24, seed=30)
    w_norm = np.linalg.norm(w.numpy())
    strictly_fewer = 0
    for rel_err in [0.05, 0.1, 0.2, 0.3, 0.5]:
        equal, equal_err = reference_tt_svd(w.numpy(), out_shape, in_shape, rel_err, carry=False)
        mpo = mpo_decompose(w, out_shape, in_shape, rel_err=rel_err)
        assert mpo.num_params <= mpo_params(equal, out_shape, in_shape)
        assert mpo.error_norm <= rel_err * w_norm * (1 + 1e-12)
        strictly_fewer += mpo.num_params < mpo_params(equal, out_shape, in_shape)
    equal, _ = reference_tt_svd(w.numpy(), out_shape, in_shape, 0.05, carry=False)
    carried = mpo_decompose(w, out_shape, in_shape, rel_err=0.05)
    assert equal == [1, 4, 9, 9, 1] and carried.bond_dims == [1, 4, 8, 8, 1]  # 2032 vs 1680 parameters
    assert carried.truncation_errors[0] == 0.0  # the first step used none of its share
    assert strictly_fewer == 5


def interleaved(w: np.ndarray, out_shape, in_shape) -> np.ndarray:
    n = len(out_shape)
    return w.reshape(list(out_shape) + list(in_shape)).transpose([p for k in range(n) for p in (k, n + k)])


def reference_mixed_canonical(w: np.ndarray, out_shape, in_shape, bonds, centre: int) -> list[np.ndarray]:
    """numpy float64: a left-to-right SVD sweep keeping the given bonds, then a right-to-left
    SVD sweep (``M = U S Vᵀ``: core ← Vᵀ, left neighbour ← · U S) from the last core to ``centre``.
    Where ``M`` has fewer columns than rows the bond shrinks here; only the matrix matters."""
    n = len(out_shape)
    rest, rank, cores = interleaved(w, out_shape, in_shape), 1, []
    for k in range(n - 1):
        u, sigma, vh = np.linalg.svd(rest.reshape(rank * out_shape[k] * in_shape[k], -1), full_matrices=False)
        keep = bonds[k + 1]
        cores.append(u[:, :keep].reshape(rank, out_shape[k], in_shape[k], keep))
        rest, rank = sigma[:keep, None] * vh[:keep], keep
    cores.append(rest.reshape(rank, out_shape[-1], in_shape[-1], 1))
    for k in range(n - 1, centre, -1):
        r0, i, j, r1 = cores[k].shape
        u, sigma, vh = np.linalg.svd(cores[k].reshape(r0, -1), full_matrices=False)
        cores[k] = vh.reshape(-1, i, j, r1)
        cores[k - 1] = np.tensordot(cores[k - 1], u * sigma, axes=(3, 0))
    return cores


def gram_left(core: torch.Tensor) -> np.ndarray:
    """``Σ_{a,i,j} G[a,i,j,b] G[a,i,j,b']``: identity for a left-orthonormal core."""
    m = core.double().numpy().reshape(-1, core.shape[-1])
    return m.T @ m


def gram_right(core: torch.Tensor) -> np.ndarray:
    """``Σ_{i,j,b} G[a,i,j,b] G[a',i,j,b]``: identity for a right-orthonormal core."""
    m = core.double().numpy().reshape(core.shape[0], -1)
    return m @ m.T


MIXED_CASES = {  # out_shape, in_shape, max_bond, rel_err
    "n2-cap": ([8, 12], [6, 10], 5, None),
    "n3-budget": ([4, 6, 4], [3, 5, 4], None, 0.1),
    "n4-budget": ([4, 4, 4, 4], [4, 4, 4, 4], None, 0.2),
    "n4-full": ([2, 4, 3, 4], [4, 2, 4, 3], None, None),
    "n5-cap": ([2, 4, 3, 2, 2], [3, 2, 2, 4, 2], 6, None),
    "n5-cap-budget": ([2, 4, 3, 2, 2], [3, 2, 2, 4, 2], 10, 0.3),
    "n6-caps": ([2, 2, 3, 2, 2, 2], [2, 3, 2, 2, 2, 2], [4, 8, 10, 8, 4], None),
}


@pytest.mark.parametrize("case", sorted(MIXED_CASES))
def test_mixed_canonical_against_a_numpy_sweep(case):
    out_shape, in_shape, max_bond, rel_err = MIXED_CASES[case]
    w = mpo_like_matrix(out_shape, in_shape, bond=12, seed=40 + len(case))
    left = mpo_decompose(w, out_shape, in_shape, max_bond=max_bond, rel_err=rel_err, canonical="left")
    mixed = mpo_decompose(w, out_shape, in_shape, max_bond=max_bond, rel_err=rel_err)
    c, n = mixed.central_index, mixed.n_cores
    assert c == n // 2
    # the same truncation, decided by the same sweep
    assert mixed.bond_dims == left.bond_dims and mixed.truncation_errors == left.truncation_errors
    assert all(torch.equal(a, b) for a, b in zip(mixed.spectra, left.spectra))
    assert [tuple(x.shape) for x in mixed.cores] == [tuple(x.shape) for x in left.cores]
    ref = reference_mixed_canonical(w.numpy(), out_shape, in_shape, mixed.bond_dims, c)
    w_hat = dense_reference([torch.from_numpy(x) for x in ref])
    scale = np.linalg.norm(w_hat)
    assert np.abs(dense_reference(mixed.cores) - w_hat).max() <= 1e-12 * scale
    assert np.abs(dense_reference(left.cores) - w_hat).max() <= 1e-12 * scale
    for k in range(n):
        if k < c:
            np.testing.assert_allclose(gram_left(mixed.cores[k]), np.eye(mixed.bond_dims[k + 1]), atol=1e-12)
        elif k > c:
            np.testing.assert_allclose(gram_right(mixed.cores[k]), np.eye(mixed.bond_dims[k]), atol=1e-12)
    assert float(mixed.central_tensor.norm()) == pytest.approx(scale, rel=1e-12)
    # the centre's singular values are Ŵ's at the cut after core c (gauge-free)
    cut = np.linalg.svd(interleaved(w_hat, out_shape, in_shape).reshape(math.prod(
        o * i for o, i in zip(out_shape[: c + 1], in_shape[: c + 1])), -1), compute_uv=False)
    centre = np.linalg.svd(mixed.central_tensor.numpy().reshape(-1, mixed.bond_dims[c + 1]), compute_uv=False)
    np.testing.assert_allclose(centre, cut[: centre.size], rtol=1e-10, atol=1e-12 * scale)
    if rel_err is not None and max_bond is None:
        assert np.linalg.norm(w_hat - w.numpy()) <= rel_err * np.linalg.norm(w.numpy()) * (1 + 1e-12)


def test_mixed_canonical_zeroes_the_channels_a_truncated_bond_cannot_use():
    """Caps 4, 16, 16, 1 on 2×…×2: core 3 is (16, 2, 2, 1), 16 rows in a 4-wide space, so at most
    4 rows can be orthonormal; they are, the other 12 are zero (in core 2's columns too)."""
    w = torch.randn(32, 32, generator=torch.Generator().manual_seed(41), dtype=torch.float64)
    shape = [2, 2, 2, 2, 2]
    mixed = mpo_decompose(w, shape, shape, max_bond=[4, 16, 16, 1])
    assert mixed.bond_dims == [1, 4, 16, 16, 1, 1]
    ref = reference_mixed_canonical(w.numpy(), shape, shape, mixed.bond_dims, 2)
    w_hat = dense_reference([torch.from_numpy(x) for x in ref])
    assert np.abs(dense_reference(mixed.cores) - w_hat).max() <= 1e-12 * np.linalg.norm(w_hat)
    np.testing.assert_allclose(gram_right(mixed.cores[3]), np.diag([1.0] * 4 + [0.0] * 12), atol=1e-12)
    np.testing.assert_allclose(gram_right(mixed.cores[4]), np.eye(1), atol=1e-12)
    assert not mixed.cores[2][..., 4:].any()
    assert float(mixed.central_tensor.norm()) == pytest.approx(np.linalg.norm(w_hat), rel=1e-12)


def test_mixed_is_the_default_and_a_bad_gauge_is_a_clear_error():
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(42), dtype=torch.float64)
    default = mpo_decompose(w, [4, 4, 4], [4, 4, 4], max_bond=8)
    assert float(default.central_tensor.norm()) == pytest.approx(float(default.to_matrix().norm()), rel=1e-12)
    layer = MPOLinear.from_linear(linear(64, 64, seed=42), ([4, 4, 4], [4, 4, 4]), max_bond=8)
    assert float(layer.cores[1].detach().norm()) == pytest.approx(float(layer.weight().detach().norm()), rel=1e-5)
    with pytest.raises(ValueError, match="canonical must be one of"):
        mpo_decompose(w, [4, 4, 4], [4, 4, 4], canonical="right")


def test_max_bond_per_bond_list():
    w = torch.randn(256, 256, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    mpo = mpo_decompose(w, [4, 4, 4, 4], [4, 4, 4, 4], max_bond=[3, 7, 5])
    assert mpo.bond_dims == [1, 3, 7, 5, 1]
    with pytest.raises(ValueError, match="3 entries"):
        mpo_decompose(w, [4, 4, 4, 4], [4, 4, 4, 4], max_bond=[3, 7])


def test_bad_rel_err_and_bond_caps_are_clear_errors():
    w = torch.randn(256, 256, generator=torch.Generator().manual_seed(15), dtype=torch.float64)
    shape = [4, 4, 4, 4]
    for bad in (float("nan"), -0.1):
        with pytest.raises(ValueError, match="rel_err must be a number >= 0"):
            mpo_decompose(w, shape, shape, rel_err=bad)
    with pytest.raises(TypeError, match="max_bond must be an int"):
        mpo_decompose(w, shape, shape, max_bond=3.0)
    with pytest.raises(TypeError, match="bond caps must be integers"):
        mpo_decompose(w, shape, shape, max_bond=[3, 2.5, 3])
    with pytest.raises(ValueError, match=">= 1"):
        mpo_decompose(w, shape, shape, max_bond=np.int64(0))


def test_numpy_integer_bond_caps():
    w = torch.randn(256, 256, generator=torch.Generator().manual_seed(16), dtype=torch.float64)
    shape = [4, 4, 4, 4]
    assert mpo_decompose(w, shape, shape, max_bond=np.int64(3)).bond_dims == [1, 3, 3, 3, 1]
    assert mpo_decompose(w, shape, shape, max_bond=np.array([2, 5, 4])).bond_dims == [1, 2, 5, 4, 1]
    lin = linear(256, 256, seed=16)
    assert MPOLinear.from_linear(lin, (shape, shape), max_bond=np.int32(2)).bond_dims == (1, 2, 2, 2, 1)


def test_parameter_counts_by_hand(mpo_3072x768):
    mpo = mpo_3072x768
    central = 256 * 8 * 4 * 288
    auxiliary = 1 * 4 * 4 * 16 + 16 * 4 * 4 * 256 + 288 * 6 * 4 * 12 + 12 * 4 * 3 * 1
    assert (mpo.num_params, mpo.num_central_params, mpo.num_auxiliary_params) == (central + auxiliary, central, auxiliary)

    w = torch.randn(768, 768, generator=torch.Generator().manual_seed(6))
    small = mpo_decompose(w, BERT_768, BERT_768, max_bond=32)
    assert small.bond_dims == [1, 16, 32, 32, 9, 1]
    central = 32 * 4 * 4 * 32
    auxiliary = 1 * 4 * 4 * 16 + 16 * 4 * 4 * 32 + 32 * 4 * 4 * 9 + 9 * 3 * 3 * 1
    assert (small.num_params, small.num_central_params, small.num_auxiliary_params) == (central + auxiliary, central, auxiliary)
    assert MPOLinear.from_mpo(small).num_params == central + auxiliary


def test_mpo_dataclass_from_given_cores():
    g = torch.Generator().manual_seed(7)
    cores = [torch.randn(1, 2, 3, 4, generator=g), torch.randn(4, 5, 2, 1, generator=g)]
    mpo = MPO(cores, (2, 5), (3, 2))
    assert mpo.bond_dims == [1, 4, 1] and mpo.central_index == 1
    np.testing.assert_allclose(mpo.to_matrix().numpy(), dense_reference(cores), rtol=1e-5, atol=1e-6)


def random_cores(out_shape, in_shape, bonds, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(bonds[k], out_shape[k], in_shape[k], bonds[k + 1], generator=g, dtype=dtype) for k in range(len(out_shape))]


@pytest.mark.parametrize("split", [0, 1, 2, 3, 4, None])
def test_contract_cores_every_split_matches_einsum(split):
    out_shape, in_shape = [3, 2, 4, 2], [2, 5, 3, 2]
    cores = random_cores(out_shape, in_shape, [1, 3, 5, 4, 1], seed=20)
    expected = dense_reference(cores)
    rebuilt = contract_cores(cores, out_shape, in_shape, split).numpy()
    assert np.abs(rebuilt - expected).max() <= 1e-12 * np.abs(expected).max()


@pytest.mark.parametrize("split", [0, 1, 2, 3])
def test_contract_cores_gradcheck_at_every_split(split):
    out_shape, in_shape = [2, 3, 2], [3, 1, 2]
    cores = [c.requires_grad_() for c in random_cores(out_shape, in_shape, [1, 2, 3, 1], seed=21)]
    assert torch.autograd.gradcheck(lambda *cs: contract_cores(cs, out_shape, in_shape, split), tuple(cores))


def test_contract_cores_rejects_a_bad_split():
    cores = random_cores([2, 2], [2, 2], [1, 2, 1], seed=22)
    with pytest.raises(ValueError, match="split must be in 0 … 2"):
        contract_cores(cores, [2, 2], [2, 2], 3)


def test_rebuild_costs_by_hand():
    # (2,3) x (4,5), bonds 1,3,1: |G| = 24, 45; d = 8, 15; O·I = 120.
    # s=0: 45 + 15·24 = 405; s=1: 24 + 45 + 120·3 = 429; s=2: 24 + 8·45 = 384.
    assert _rebuild_costs((2, 3), (4, 5), (1, 3, 1)) == [405, 429, 384]
    # 3072 x 768 at ~10 % of the parameters: d = 16, 16, 32, 24, 12; O·I = 2359296.
    sizes = [1 * 16 * 16, 16 * 16 * 78, 78 * 32 * 78, 78 * 24 * 12, 12 * 12 * 1]
    left = [1 * sizes[0], 16 * sizes[1], 256 * sizes[2], 8192 * sizes[3], 196608 * sizes[4]]
    right = [147456 * sizes[0], 9216 * sizes[1], 288 * sizes[2], 12 * sizes[3], 1 * sizes[4]]
    bonds = [1, 16, 78, 78, 12, 1]
    expected = [sum(left[:s]) + sum(right[s:]) + (2359296 * bonds[s] if 0 < s < 5 else 0) for s in range(6)]
    costs = _rebuild_costs(BERT_3072, BERT_768, bonds)
    assert costs == expected
    assert min(range(6), key=costs.__getitem__) == 3  # 234.5 M multiply-adds vs 262.5 M for one sweep
    layer = MPOLinear(BERT_3072, BERT_768, bonds)
    assert layer._rebuild_split == 3 and layer._rebuild_macs == expected[3]
