"""Cache-blocked attention for reduced-precision inference on CPU.

    out = softmax(q kᵀ · scale + bias) v

computed a few sequences at a time, so that one block of scores (at most ``BLOCK_SCORES``
elements) stays in cache across the three passes over it (q kᵀ, softmax, · v).

Why: PyTorch's CPU ``scaled_dot_product_attention`` tiles for large head dimensions. At the
small heads of the sentence encoders (MiniLM: 12 heads of 32) it runs at ~75 GFLOP/s in
bfloat16 on a Zen 4 core pair, while bfloat16 ``bmm`` of the same shapes runs at 400–600;
the blocked form takes ~16 ms where SDPA takes ~22 ms for 64 sequences × 128 tokens and is
about a fifth of a bfloat16 MiniLM forward (``benchmarks/bench_embed.py``). On a CPU with AMX
tiles the balance turns: SDPA's bfloat16 matmuls run on the tiles, and a whole MiniLM run took
8.2 s with SDPA against 9.0 s blocked on a Xeon core pair, so :func:`prefer_blocked_attention`
is False there.

Numerics: the scores are rounded to the input dtype before the softmax, as transformers'
eager attention does under autocast, while SDPA keeps them in float32. In bfloat16 that
drifts more than SDPA (MiniLM pooled vectors: min cosine to float32 0.99994 against 0.99995);
``embed`` therefore uses it only for ``embed.dtype: bfloat16``, never for the float32 default.

Registered with transformers' attention interface under :data:`NAME`. Anything this does not
cover exactly (training, dropout, attention weights as output, position bias, soft-capping,
grouped key/value heads, an implicit causal mask, devices other than the CPU) is passed to
transformers' own SDPA function unchanged.
"""

from __future__ import annotations

import torch

NAME = "lmdecomp_blocked"
# Scores per block: 2 M elements = 4 MiB in bfloat16. Measured on the benchmark machine
# (1 MiB L2 per core, shared L3): 1–2 M elements are fastest, 8 M and more lose the gain.
BLOCK_SCORES = 1 << 21


def _sdpa(*args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(*args, **kwargs)


def blocked_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    block_scores: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: (batch, heads, q, d) inputs → (batch, q, heads, d) output.

    ``attention_mask`` is what ``sdpa_mask`` builds: ``None`` (attend everywhere), a boolean
    mask (True = attend) or an additive float mask, broadcastable to (batch, heads, q, k).
    """
    if attention_mask is None:
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        implicit_causal = causal and query.shape[2] > 1
    else:
        implicit_causal = False
    unsupported = (
        query.device.type != "cpu"
        or module.training
        or dropout > 0
        or implicit_causal
        or getattr(module, "num_key_value_groups", 1) != 1
        or kwargs.get("position_bias") is not None
        or kwargs.get("softcap") is not None
        or kwargs.get("output_attentions", False)
    )
    if unsupported:
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                     is_causal=is_causal, **kwargs)

    batch, heads, q_len, dim = query.shape
    k_len = key.shape[2]
    scale = dim**-0.5 if scaling is None else scaling
    step = max(1, (block_scores or BLOCK_SCORES) // (heads * q_len * k_len))
    out = torch.empty(batch, q_len, heads, dim, dtype=query.dtype, device=query.device)
    probs = bias = None
    scaled_query = query * scale
    for start in range(0, batch, step):
        stop = min(start + step, batch)
        scores = torch.matmul(scaled_query[start:stop], key[start:stop].transpose(-1, -2))
        if probs is None:
            # the scores' dtype, not the query's: under autocast a rotary model's query is float32
            # while matmul gives bfloat16 (an encoder's query is bfloat16 already: no change there)
            probs = torch.empty(min(step, batch), heads, q_len, k_len, dtype=scores.dtype, device=query.device)
            bias = _additive_bias(attention_mask, scores.dtype)
        if bias is not None:
            scores.add_(bias[start:stop] if bias.shape[0] > 1 else bias)
        p = probs[: stop - start]
        torch.softmax(scores, -1, out=p)
        out[start:stop] = torch.matmul(p, value[start:stop]).transpose(1, 2)
    return out, None


def _additive_bias(attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The mask as a bias added to the scores: a float mask as it is, a boolean one (True = attend)
    as 0 / the dtype's minimum, finite so that a fully masked row gives uniform weights instead
    of NaN (as eager attention does)."""
    if attention_mask is None:
        return None
    if attention_mask.dtype != torch.bool:
        return attention_mask.to(dtype)
    bias = torch.zeros(attention_mask.shape, dtype=dtype, device=attention_mask.device)
    return bias.masked_fill_(~attention_mask, torch.finfo(dtype).min)


def register() -> None:
    """Make :data:`NAME` a valid ``attn_implementation`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, blocked_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's feature flags: the first ``flags`` line of ``/proc/cpuinfo`` (or of the
    ``cpuinfo`` text given); empty where that file does not exist."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                cpuinfo = fh.read()
        except OSError:
            return set()
    return set(next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), []))


def cpu_has_amx(cpuinfo: str | None = None) -> bool:
    """Whether the CPU has AMX bfloat16 tiles (the ``amx_bf16`` flag)."""
    return "amx_bf16" in cpu_flags(cpuinfo)


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU computes bfloat16 in hardware (``avx512_bf16`` or ``amx_bf16``); without
    either, bf16 is emulated through float32 conversions, and bf16 autocast usually runs slower
    than float32 itself."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags(cpuinfo))


def prefer_blocked_attention() -> bool:
    """Whether the blocked form beats PyTorch's SDPA for bfloat16 on this CPU (module doc): on
    CPUs without AMX. A property of the machine, so a rerun there makes the same choice."""
    return not cpu_has_amx()


def use_blocked_attention(model: torch.nn.Module) -> bool:
    """Switch ``model`` to the blocked attention; False (model untouched) if it cannot use it."""
    register()
    if not getattr(model, "_supports_attention_backend", False):
        return False  # its attention classes do not dispatch through the interface
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, NotImplementedError):
        return False
    return True
