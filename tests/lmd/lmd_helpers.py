"""Shared by the tests of lmdecomp.lmd's modules: planted embeddings of several models, a numpy
least-squares reference, and the fixtures ``data`` and ``noisy`` (a test file imports them)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import moments_of, write_embeddings
from lmdecomp import lmd

SPLIT_NAMES = np.array(lmd.SPLITS, dtype=object)


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


@pytest.fixture(scope="module")
def noisy():
    """Few train rows for wide bases and weak shared signal, so ridge helps and the val
    optimum of α lies inside the grid for some fits."""
    rng = np.random.default_rng(10)
    n = 260
    latent = rng.normal(size=(n, 4))
    widths = [12, 9, 15, 6]
    blocks = [latent @ rng.normal(size=(4, w)) * 0.5 + rng.normal(size=w) * 2 + rng.normal(size=(n, w))
              for w in widths]
    split = rng.choice(SPLIT_NAMES, size=n, p=[0.5, 0.25, 0.25])
    names = ["a", "b", "c", "d"]
    return blocks, names, split, moments_of(blocks, names, split)


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
