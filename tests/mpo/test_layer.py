"""lmdecomp.mpo.layer: MPOLinear's contraction and dense paths, gradients, cost model and state,
against torch.nn.functional.linear, finite differences and hand counts."""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F

from lmdecomp.mpo.layer import MPOLinear
from mpo_helpers import linear

BERT_768 = [4, 4, 4, 4, 3]
BERT_3072 = [4, 4, 8, 6, 4]


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
