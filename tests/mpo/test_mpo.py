"""MPO decomposition, MPOLinear and model conversion, each checked against a reference
computed independently of lmdecomp.mpo (numpy SVDs and einsums, hand counts,
torch.nn.functional.linear, the unconverted model, finite differences)."""

from __future__ import annotations

import copy
import io
import math
import string

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmdecomp.mpo.convert import convert_linears, load_converted, save_converted
from lmdecomp.mpo.decompose import MPO, _rebuild_costs, contract_cores, factorize, mpo_decompose
from lmdecomp.mpo.layer import MPOLinear

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


# --- factorize -------------------------------------------------------------------------


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


# --- decomposition ---------------------------------------------------------------------


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


@pytest.mark.parametrize("seed", [10, 11, 12])
def test_rel_err_budget_is_respected(seed):
    out_shape, in_shape = [4, 4, 4, 4], [4, 4, 4, 4]
    w = mpo_like_matrix(out_shape, in_shape, bond=24, seed=seed)
    w_norm = np.linalg.norm(w.numpy())
    full = mpo_decompose(w, out_shape, in_shape).bond_dims
    for rel_err in [0.5, 0.2, 0.05, 0.01, 1e-3]:
        mpo = mpo_decompose(w, out_shape, in_shape, rel_err=rel_err)
        err = np.linalg.norm(dense_reference(mpo.cores) - w.numpy())
        assert err <= rel_err * w_norm * (1 + 1e-12)
        assert any(r < f for r, f in zip(mpo.bond_dims, full))  # truncation happened
        # The step errors are orthogonal: ‖W − Ŵ‖² = Σ ε_k² (reported), ε_k from the spectra.
        assert err == pytest.approx(mpo.error_norm, rel=1e-6)
        # Each kept rank is the smallest whose discarded tail fits the carried budget.
        bonds, ref_err = reference_tt_svd(w.numpy(), out_shape, in_shape, rel_err, carry=True)
        assert mpo.bond_dims == bonds
        assert err == pytest.approx(ref_err, rel=1e-6)


@pytest.mark.parametrize("kind", ["gaussian", "mpo_like"])
def test_rel_err_bound_holds_over_many_budgets(kind):
    out_shape, in_shape = [2, 4, 3, 4], [4, 2, 4, 3]
    if kind == "gaussian":
        w = torch.randn(96, 96, generator=torch.Generator().manual_seed(13), dtype=torch.float64)
    else:
        w = mpo_like_matrix(out_shape, in_shape, bond=16, seed=14)
    w_norm = np.linalg.norm(w.numpy())
    ranks = set()
    for rel_err in np.geomspace(1e-3, 0.95, 30):
        mpo = mpo_decompose(w, out_shape, in_shape, rel_err=float(rel_err))
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

# --- MPOLinear -------------------------------------------------------------------------


def linear(in_features: int, out_features: int, seed: int, dtype=torch.float32) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(in_features, out_features, dtype=dtype)


@pytest.mark.parametrize("in_f,out_f,shapes", [(60, 96, ([4, 6, 4], [3, 5, 4])), (96, 60, ([3, 5, 4], [4, 6, 4]))])
def test_mpolinear_full_rank_equals_dense(in_f, out_f, shapes):
    lin = linear(in_f, out_f, seed=8, dtype=torch.float64)
    layer = MPOLinear.from_linear(lin, shapes)
    x = torch.randn(2, 3, in_f, dtype=torch.float64)
    expected = F.linear(x, lin.weight, lin.bias)
    for mode in ("contract", "dense", "auto"):
        layer.forward_mode = mode
        assert (layer(x) - expected).abs().max().item() <= 1e-10


def test_both_contraction_directions_used():
    wide = MPOLinear.from_linear(linear(60, 96, 9), ([4, 6, 4], [3, 5, 4]))
    tall = MPOLinear.from_linear(linear(96, 60, 9), ([3, 5, 4], [4, 6, 4]))
    assert {wide._left_to_right, tall._left_to_right} == {True, False}


@pytest.mark.parametrize("out_shape,in_shape", [(BERT_3072, BERT_768), (BERT_768, BERT_3072)])
def test_contract_and_dense_paths_agree_when_truncated(out_shape, in_shape):
    torch.manual_seed(10)
    layer = MPOLinear(out_shape, in_shape, [1, 8, 8, 8, 8, 1])
    x = torch.randn(5, math.prod(in_shape))
    layer.forward_mode = "contract"
    y_contract = layer(x)
    layer.forward_mode = "dense"
    y_dense = layer(x)
    assert (y_contract - y_dense).abs().max().item() <= 1e-5 * y_dense.abs().max().item()


def test_gradients_reach_cores_and_match_between_paths():
    layer = MPOLinear.from_linear(linear(60, 96, seed=11, dtype=torch.float64), ([4, 6, 4], [3, 5, 4]), max_bond=5)
    x = torch.randn(7, 60, dtype=torch.float64)
    grads = {}
    for mode in ("contract", "dense"):
        layer.zero_grad()
        layer.forward_mode = mode
        (layer(x) ** 2).sum().backward()
        grads[mode] = [p.grad.clone() for p in layer.parameters()]
        assert all(g.abs().sum() > 0 for g in grads[mode])
    for a, b in zip(grads["contract"], grads["dense"]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["contract", "dense"])
def test_gradcheck_against_finite_differences(mode):
    torch.manual_seed(12)
    layer = MPOLinear((2, 3), (3, 2), (1, 3, 1), dtype=torch.float64)
    layer.forward_mode = mode
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    params = tuple(layer.parameters())

    def fn(x, *ps):
        return torch.func.functional_call(layer, dict(zip([n for n, _ in layer.named_parameters()], ps)), (x,))

    assert torch.autograd.gradcheck(fn, (x, *params))


def test_flops_hand_count_and_auto_choice(monkeypatch):
    layer = MPOLinear((2, 3), (4, 5), (1, 3, 1))
    # Left to right: core 0 sees 1·5 and core 1 sees 2·1 input slices -> 5·24 + 2·45 = 210
    # MACs per row (right to left would be 3·24 + 4·45 = 252). Rebuild: 24 + (2·4)·45 = 384.
    assert layer.flops(1) == {"contract": 2 * 210, "dense": 2 * (384 + 6 * 20)}
    assert layer.flops(10) == {"contract": 2 * 2100, "dense": 2 * (384 + 10 * 120)}
    # Memory terms. Contraction outputs per row: (2)·1·(5) + (2·3)·1·1 = 36 elements.
    # Rebuild (split 2, one left sweep): 2·8·3 + 2·120·1 = 288 elements.
    # contract 420 + 480·36 = 17700 per row; dense 2·384 + 240 per row + 75·288 = 22368 + 240 per row.
    assert layer.cost(1) == {"contract": 17700, "dense": 22368 + 240}
    assert layer.cost(10) == {"contract": 177000, "dense": 22368 + 2400}
    assert (layer.auto_path(1), layer.auto_path(2)) == ("contract", "dense")
    calls = []
    original = layer._contract

    def spy(t):
        calls.append(t.shape[0])
        return original(t)

    monkeypatch.setattr(layer, "_contract", spy)
    layer(torch.randn(1, 20))
    layer(torch.randn(10, 20))
    assert calls == [1]



@pytest.mark.parametrize("mode", ["contract", "dense", "auto"])
def test_wrong_input_width_is_a_clear_error(mode):
    layer = MPOLinear.from_linear(linear(60, 96, seed=14), ([4, 6, 4], [3, 5, 4]), max_bond=3)
    layer.forward_mode = mode
    for bad in (torch.randn(4, 59), torch.randn(2, 30), torch.randn(60, 1)):
        with pytest.raises(ValueError, match=r"in_features=60, got shape"):
            layer(bad)


def test_auto_choice_weighs_memory_traffic_768_to_3072():
    """768 → 3072 at bond 10: flops alone would pick the contraction for 4096 rows, which
    measured ~7× slower than the dense path (MPOLinear docstring); the memory terms pick dense."""
    layer = MPOLinear(BERT_3072, BERT_768, [1, 10, 10, 10, 10, 1])
    assert layer._left_to_right
    # |G_k| = 160, 1600, 3200, 2400, 120. Left to right, core k sees (∏_{m<k} i_m)(∏_{m>k} j_m) slices:
    macs = 1 * 192 * 160 + 4 * 48 * 1600 + 16 * 12 * 3200 + 128 * 3 * 2400 + 768 * 1 * 120
    # step k writes (∏_{m≤k} i_m)·r_k·(∏_{m>k} j_m) per row
    elements = 4 * 10 * 192 + 16 * 10 * 48 + 128 * 10 * 12 + 768 * 10 * 3 + 3072 * 1 * 1
    # rebuild at split 3: left 160 + 16·1600 + 256·3200, right 12·2400 + 120, join 2359296·10
    rebuild = 160 + 16 * 1600 + 256 * 3200 + 12 * 2400 + 120 + 2359296 * 10
    # written: left 2·(16·10 + 256·10 + 8192·10), right 2·(10·288 + 10·12), join + permute 2·2359296
    rebuild_elements = 2 * (16 * 10 + 256 * 10 + 8192 * 10) + 2 * (10 * 288 + 10 * 12) + 2 * 2359296
    assert (macs, elements, rebuild, rebuild_elements) == (1966080, 56832, 24466840, 4893872)

    def expected(rows):
        return {"contract": 2 * rows * macs + 480 * rows * elements,
                "dense": 2 * (rebuild + rows * 2359296) + 75 * rebuild_elements}

    for rows in (1, 15, 16, 4096):
        assert layer.cost(rows) == expected(rows)
    flops = layer.flops(4096)
    assert flops["contract"] < flops["dense"]  # 0.83: flops alone pick the slow path
    assert layer.auto_path(4096) == "dense"
    assert [layer.auto_path(r) for r in (1, 15, 16, 64)] == ["contract", "contract", "dense", "dense"]

def test_state_dict_round_trip():
    layer = MPOLinear.from_linear(linear(60, 96, seed=13), ([4, 6, 4], [3, 5, 4]), max_bond=3)
    assert layer.bond_dims == (1, 3, 3, 1)
    buffer = io.BytesIO()
    torch.save(layer.state_dict(), buffer)
    buffer.seek(0)
    fresh = MPOLinear(layer.out_shape, layer.in_shape, layer.bond_dims)
    fresh.load_state_dict(torch.load(buffer))
    x = torch.randn(3, 60)
    assert torch.equal(fresh(x), layer(x))
    assert sorted(layer.state_dict()) == ["bias"] + [f"cores.{k}" for k in range(3)]


def test_bias_free_layer():
    lin = torch.nn.Linear(60, 96, bias=False)
    layer = MPOLinear.from_linear(lin, ([4, 6, 4], [3, 5, 4]))
    assert layer.bias is None
    x = torch.randn(4, 60)
    torch.testing.assert_close(layer(x), F.linear(x, lin.weight), rtol=1e-5, atol=1e-5)


# --- model conversion ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, vocab_size=100
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    inputs = {
        "input_ids": torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1)),
        "attention_mask": torch.ones(2, 12, dtype=torch.long),
    }
    return model, inputs


def outputs(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).last_hidden_state


def test_convert_full_rank_matches_original(tiny_bert):
    model, inputs = tiny_bert
    converted = copy.deepcopy(model)
    records = convert_linears(converted)
    expected_paths = {
        f"encoder.layer.{i}.{p}"
        for i in range(2)
        for p in (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
            "intermediate.dense",
            "output.dense",
        )
    }
    assert set(records) == expected_paths
    assert isinstance(converted.encoder.layer[1].output.dense, MPOLinear)
    assert not isinstance(converted.pooler.dense, MPOLinear)
    assert records["encoder.layer.0.intermediate.dense"]["out_shape"] == factorize(256)
    assert all(r["rel_error"] < 1e-6 for r in records.values())
    assert (outputs(converted, inputs) - outputs(model, inputs)).abs().max().item() <= 1e-4


def test_suffix_targets_match_precisely(tiny_bert):
    model, _ = tiny_bert
    ffn_out = convert_linears(copy.deepcopy(model), targets=("output.dense",))
    assert set(ffn_out) == {"encoder.layer.0.output.dense", "encoder.layer.1.output.dense"}
    attn_out = convert_linears(copy.deepcopy(model), targets=("attention.output.dense",))
    assert set(attn_out) == {"encoder.layer.0.attention.output.dense", "encoder.layer.1.attention.output.dense"}
    with pytest.raises(ValueError, match="match no nn.Linear"):
        convert_linears(copy.deepcopy(model), targets=("dense.output",))


def test_save_load_round_trip(tiny_bert, tmp_path):
    model, inputs = tiny_bert
    converted = copy.deepcopy(model)
    records = convert_linears(converted, max_bond=4, shapes={64: [4, 4, 4]}, n_cores=3)
    assert records["encoder.layer.0.attention.self.query"]["bond_dims"] == [1, 4, 4, 1]
    save_converted(converted, tmp_path / "mpo_bert")
    loaded = load_converted(tmp_path / "mpo_bert")
    assert type(loaded) is type(model)
    for path, record in records.items():
        assert list(loaded.get_submodule(path).bond_dims) == record["bond_dims"]
    assert torch.equal(outputs(loaded, inputs), outputs(converted, inputs))


def test_save_load_keeps_the_saved_dtype(tiny_bert, tmp_path):
    model, inputs = tiny_bert
    converted = copy.deepcopy(model).double()
    convert_linears(converted, max_bond=4, shapes={64: [4, 4, 4]}, n_cores=3)
    save_converted(converted, tmp_path / "f64")
    loaded = load_converted(tmp_path / "f64")
    assert {p.dtype for p in loaded.parameters()} == {torch.float64}
    assert torch.equal(outputs(loaded, inputs), outputs(converted, inputs))


def test_match_saved_dtype_warns_on_mixed_floating_dtypes(tmp_path):
    from safetensors.torch import save_file

    from lmdecomp.mpo.convert import match_saved_dtype

    module = torch.nn.Linear(2, 2)
    save_file({"weight": torch.zeros(2, 2, dtype=torch.float64), "bias": torch.zeros(2, dtype=torch.float16)}, str(tmp_path / "mixed.safetensors"))
    with pytest.warns(UserWarning, match="several floating dtypes"):
        match_saved_dtype(module, tmp_path / "mixed.safetensors")
    assert module.weight.dtype == torch.float32
    save_file({"weight": torch.zeros(2, 2, dtype=torch.bfloat16), "steps": torch.zeros(1, dtype=torch.int64)}, str(tmp_path / "bf16.safetensors"))
    match_saved_dtype(module, tmp_path / "bf16.safetensors")
    assert module.weight.dtype == module.bias.dtype == torch.bfloat16
