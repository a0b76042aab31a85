"""The masked-positions-only loss equals each family's own masked-LM loss, value and gradients."""

from __future__ import annotations

import pytest
import torch

from lmdecomp.models import mlm_head, zoo
from lmdecomp.models.tokenizing import train_tokenizer
from lmdecomp.mpo import mpobert
from models_helpers import _one_thread, corpus, tiny_recipe  # noqa: F401  (fixtures; _one_thread is autouse)


@pytest.fixture(scope="module")
def wordpiece(corpus):  # noqa: F811
    return train_tokenizer("wordpiece", corpus.train, 500, model_max_length=64)


def batch(tokenizer, texts, seed: int = 0):
    enc = tokenizer(texts, truncation=True, max_length=32, padding=True, return_tensors="pt")
    gen = torch.Generator().manual_seed(seed)
    scored = (torch.rand(enc["input_ids"].shape, generator=gen) < 0.2) & enc["attention_mask"].bool()
    labels = torch.where(scored, enc["input_ids"], torch.full_like(enc["input_ids"], -100))
    inputs = torch.where(scored, torch.full_like(enc["input_ids"], tokenizer.mask_token_id), enc["input_ids"])
    return inputs, enc["attention_mask"], labels


def compare(model, inputs, mask, labels) -> None:
    model.train()
    torch.manual_seed(1)
    ours = mlm_head.masked_lm_loss(model, inputs, mask, labels)
    ours.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(1)  # the same dropout masks
    theirs = model(input_ids=inputs, attention_mask=mask, labels=labels).loss
    theirs.backward()
    assert float(ours.detach()) == pytest.approx(float(theirs.detach()), rel=1e-6)
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads[n], p.grad, rtol=1e-4, atol=1e-7, msg=n)


@pytest.mark.parametrize("architecture", zoo.ARCHITECTURES)
def test_the_sparse_head_loss_is_the_familys_own_loss(architecture, wordpiece, corpus):  # noqa: F811
    model = zoo.build_model(tiny_recipe(architecture=architecture), wordpiece)
    assert mlm_head.prediction_head(model) is not None
    compare(model, *batch(wordpiece, corpus.val[:6]))


def test_the_sparse_head_loss_of_an_mpobert_model(wordpiece, corpus):  # noqa: F811
    base = zoo.build_model(tiny_recipe(architecture="bert"), wordpiece)
    deep, _ = mpobert.build(base, mpobert.MPOBertConfig(num_layers=3, bond=4, adapter_size=4, als_iterations=1))
    compare(deep, *batch(wordpiece, corpus.val[:6], seed=2))
