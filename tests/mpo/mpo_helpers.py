"""Shared by the tests of lmdecomp.mpo's modules."""

from __future__ import annotations

import pytest
import torch


def linear(in_features: int, out_features: int, seed: int, dtype=torch.float32) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(in_features, out_features, dtype=dtype)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models gain nothing from a second thread, and on a loaded machine two threads spin:
    a tiny fine-tune took 25 s with two and 0.5 s with one. Autouse where imported."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
