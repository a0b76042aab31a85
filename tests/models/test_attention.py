"""Cache-blocked attention against an explicit float64 softmax(q kᵀ/√d + mask) v."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmdecomp.models import attention


class Module(torch.nn.Module):
    """Stands in for a transformers attention module: only its flags are read."""

    def __init__(self, is_causal=False):
        super().__init__()
        self.is_causal = is_causal
        self.eval()


def reference(q, k, v, keep=None, scale=None):
    """softmax over keys of q·k·scale, masked entries at −∞ (uniform if a row is all masked), times v."""
    q, k, v = (t.double().numpy() for t in (q, k, v))
    b, h, n, d = q.shape
    scale = d**-0.5 if scale is None else scale
    out = np.zeros((b, n, h, d))
    for i in range(b):
        for j in range(h):
            for t in range(n):
                scores = np.array([q[i, j, t] @ k[i, j, s] * scale for s in range(k.shape[2])])
                if keep is not None:
                    row = keep[i, 0, t].numpy()
                    scores = np.where(row, scores, -np.inf) if row.any() else np.zeros_like(scores)
                w = np.exp(scores - scores.max())
                out[i, t, j] = (w / w.sum()) @ v[i, j]
    return out


def padding_mask(lengths, n):
    keys = torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]
    return keys[:, None, None, :].expand(len(lengths), 1, n, n).clone()


@pytest.mark.parametrize("block_scores", [1, 2 * 3 * 7 * 7, 1 << 21])  # one sequence, two, all per block
def test_blocked_attention_equals_the_explicit_softmax(block_scores):
    torch.manual_seed(0)
    q, k, v = (torch.randn(5, 3, 7, 4) for _ in range(3))
    keep = padding_mask([7, 3, 5, 1, 6], 7)
    out, weights = attention.blocked_attention_forward(Module(), q, k, v, keep, scaling=0.3, block_scores=block_scores)
    assert weights is None and out.shape == (5, 7, 3, 4)
    np.testing.assert_allclose(out.double().numpy(), reference(q, k, v, keep, 0.3), atol=1e-5)


def test_additive_mask_no_mask_and_a_fully_masked_row():
    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 2, 5, 8) for _ in range(3))
    keep = padding_mask([5, 2], 5)
    keep[1, 0, 3] = False  # query 3 of sequence 1 may attend nowhere: uniform weights, not NaN
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    out, _ = attention.blocked_attention_forward(Module(), q, k, v, additive)
    np.testing.assert_allclose(out.double().numpy(), reference(q, k, v, keep), atol=1e-5)
    out, _ = attention.blocked_attention_forward(Module(), q, k, v, None)
    np.testing.assert_allclose(out.double().numpy(), reference(q, k, v), atol=1e-5)


def test_bfloat16_stays_within_bfloat16_rounding():
    torch.manual_seed(2)
    q, k, v = (torch.randn(4, 2, 16, 8) for _ in range(3))
    keep = padding_mask([16, 9, 12, 4], 16)
    out, _ = attention.blocked_attention_forward(Module(), *(t.bfloat16() for t in (q, k, v)), keep)
    assert out.dtype == torch.bfloat16
    # scores, weights and output each rounded to 8 significant bits: a few 2⁻⁸ of |v| ≈ 1
    np.testing.assert_allclose(out.double().numpy(), reference(q, k, v, keep), atol=4e-2)


def test_an_implicit_causal_mask_goes_to_sdpa():
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 2, 6, 4) for _ in range(3))
    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None].expand(2, 1, 6, 6)
    out, _ = attention.blocked_attention_forward(Module(is_causal=True), q, k, v, None)
    np.testing.assert_allclose(out.double().numpy(), reference(q, k, v, causal), atol=1e-5)


def _tiny(kind):
    from transformers import BertConfig, BertModel, GPT2Config, GPT2Model

    torch.manual_seed(5)
    if kind == "bert":
        return BertModel(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=64, max_position_embeddings=32)).eval()
    return GPT2Model(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=32)).eval()


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_a_model_switched_to_blocked_attention_gives_the_same_states(kind):
    model = _tiny(kind)
    ids = torch.randint(0, 50, (3, 10), generator=torch.Generator().manual_seed(0))
    mask = (torch.arange(10)[None, :] < torch.tensor([[10], [4], [7]])).long()
    with torch.inference_mode():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        assert attention.use_blocked_attention(model)
        assert model.config._attn_implementation == attention.NAME
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
        full = model(input_ids=ids).last_hidden_state  # no padding: mask None (causal for gpt2)
        model.set_attn_implementation("sdpa")
        full_sdpa = model(input_ids=ids).last_hidden_state
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(full, full_sdpa, atol=1e-5, rtol=1e-5)


def test_amx_is_read_from_the_cpu_flags():
    """The choice of bf16 attention follows the machine: SDPA where AMX tiles run its matmuls."""
    with_amx = "processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
    zen4 = "processor\t: 0\nflags\t\t: fpu sse2 avx512f avx512_bf16\n"
    assert attention.cpu_has_amx(with_amx) and not attention.cpu_has_amx(zen4)
    assert not attention.cpu_has_amx("")
    assert attention.prefer_blocked_attention() == (not attention.cpu_has_amx())


def test_native_bf16_is_avx512_bf16_or_amx():
    """bf16 runs in hardware on Zen 4 (avx512_bf16) and on AMX Xeons, and is emulated on AVX2."""
    amx_only = "flags\t\t: fpu avx512f amx_bf16 amx_tile\n"
    zen4 = "flags\t\t: fpu sse2 avx512f avx512_bf16\n"
    zen3 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\nbugs\t\t: sysret_ss_attrs\n"
    assert attention.cpu_has_native_bf16(amx_only) and attention.cpu_has_native_bf16(zen4)
    assert not attention.cpu_has_native_bf16(zen3) and not attention.cpu_has_native_bf16("")
    assert attention.cpu_flags(zen3) == {"fpu", "sse2", "avx", "avx2", "fma"}
