"""The optimizer of fine-tuning and distillation, against AdamW written out in numpy."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from lmdecomp.models.optim import fused_adamw


def test_fused_adamw_follows_the_adamw_update_in_float64():
    """Three steps of fused_adamw against AdamW's update written out in numpy float64:
    p ← p(1 − lr·λ); m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²;
    p ← p − lr · (m / (1−β₁ᵗ)) / (√(v / (1−β₂ᵗ)) + ε)."""
    rng = np.random.default_rng(0)
    p0, grads = rng.standard_normal((7, 5)), rng.standard_normal((3, 7, 5))
    lr, wd, (b1, b2), eps = 0.01, 0.1, (0.9, 0.999), 1e-8
    w = nn.Parameter(torch.tensor(p0, dtype=torch.float32))
    opt = fused_adamw([{"params": [w], "weight_decay": wd}], lr=lr)
    assert opt.defaults["fused"] is True
    p, m, v = p0.copy(), np.zeros_like(p0), np.zeros_like(p0)
    for t, g in enumerate(grads, start=1):
        w.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
        p *= 1 - lr * wd
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p -= lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    np.testing.assert_allclose(w.detach().double().numpy(), p, rtol=0, atol=2e-6)
    # each step moves a weight by about lr: the check would fail on a skipped step
    assert np.abs(p - p0).max() > 2 * lr
