"""Distillation healing: the relative hidden-state error against an explicit loop, and a
truncated model brought back toward its base, deterministically."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

from lmdecomp import mpo
from lmdecomp.models import masking
from lmdecomp.mpo import distill
from conftest import package_folder
from mpo_helpers import one_thread  # noqa: F401  (autouse fixture)


TEXTS = [f"report {i}: the {w} market moved as {v} traders watched the {w} index" for i, (w, v) in
         enumerate(zip(["stock", "bond", "oil", "gold", "grain", "coffee"] * 12, ["many", "few", "nervous", "calm"] * 18))]


@pytest.fixture(scope="module")
def base_and_tokenizer():
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(package_folder("cognition/model"))
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return BertForMaskedLM(config).eval(), tokenizer


def test_val_error_is_the_relative_squared_error_over_real_tokens(base_and_tokenizer):
    base, tokenizer = base_and_tokenizer
    student = copy.deepcopy(base)
    with torch.no_grad():
        student.bert.encoder.layer[1].output.dense.weight.mul_(0.5)
    ids, mask = masking.make_blocks(tokenizer, TEXTS[:20], 24)
    mask[0, 10:] = 0  # padding counts nowhere
    got = distill.val_error(student, base, ids, mask, batch_size=3)
    num = den = 0.0
    with torch.no_grad():
        for i in range(len(ids)):
            n = int(mask[i].sum()) if i else 10
            h = base.bert(input_ids=ids[i : i + 1], attention_mask=mask[i : i + 1]).last_hidden_state[0, :n].double().numpy()
            s = student.bert(input_ids=ids[i : i + 1], attention_mask=mask[i : i + 1]).last_hidden_state[0, :n].double().numpy()
            num += np.sum((s - h) ** 2)
            den += np.sum(h**2)
    assert got == pytest.approx(num / den, rel=1e-9)
    assert distill.val_error(base, base, ids, mask) == 0.0


@pytest.mark.slow
def test_distillation_heals_a_truncated_model_and_is_deterministic(base_and_tokenizer):
    base, tokenizer = base_and_tokenizer
    ids, mask = masking.make_blocks(tokenizer, TEXTS[60:], 24)
    cfg = {"batch_size": 8, "learning_rate": 3e-3, "warmup_ratio": 0.1, "max_length": 24, "seed": 0}
    runs = []
    for _ in range(2):
        student = copy.deepcopy(base)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():  # a damaged copy: noisy weights, then every linear an MPO of bond 3
            for p in student.bert.encoder.parameters():
                if p.ndim == 2:
                    p.add_(0.2 * torch.randn(p.shape, generator=gen))
        mpo.convert_linears(student, max_bond=3, canonical="mixed")
        before = distill.val_error(student, base, ids, mask)
        log = distill.distill(student, base, tokenizer, TEXTS[:60], cfg, steps=40)
        runs.append((before, distill.val_error(student, base, ids, mask), log, student.state_dict()))
    (before, after, log, state), (_, after2, log2, state2) = runs
    assert after < 0.5 * before  # the held-out error fell by more than half
    assert len(log) == 40 and log == log2 and after == after2
    assert all(torch.equal(state[k], state2[k]) for k in state)
