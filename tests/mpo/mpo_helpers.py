"""Shared by the tests of lmdecomp.mpo's modules."""

from __future__ import annotations

import torch


def linear(in_features: int, out_features: int, seed: int, dtype=torch.float32) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(in_features, out_features, dtype=dtype)
