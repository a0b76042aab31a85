"""Reference embeddings for the embed tests: hand-made texts, the embed config they run
with, and the pooled hidden states written out one sequence at a time (no batching)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import write_sequences

TEXTS = [
    "A short one.",
    "The Quick Brown Fox jumps over the lazy dog, twice, near Zürich on a sunny afternoon.",
    "Markets rose sharply on Tuesday after the central bank held rates.",
    "Ok.",
    "An incredibly long sentence " * 12,
    "Punctuation!?; and (brackets) [too].",
    "Numbers like 3.14159 and 2,718 appear.",
]


@pytest.fixture()
def sequences(tmp_path):
    return write_sequences(tmp_path / "sequences.parquet", TEXTS,
                           ["train", "val", "test", "train", "train", "val", "test"], np.arange(len(TEXTS)) * 10)


def cfg(**over):
    base = {"layer": -1, "pooling": "mean", "max_length": 40, "batch_tokens": 96, "shard_rows": 3,
            "threads": 1, "device": "cpu", "dtype": "float32"}
    base.update(over)
    return base


def reference(folder, text, layer, pooling, max_length):
    """One sequence at a time, no padding: the pooled state written out by hand."""
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    ids = tok(text, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        h = model(**ids, output_hidden_states=True).hidden_states[layer][0].double().numpy()
    if pooling == "cls":
        return h[0]
    total = np.zeros(h.shape[1])
    for t in range(h.shape[0]):
        total += h[t]
    return total / (h.shape[0] if pooling == "mean" else max_length)


def reference_windows(folder, text, layer, max_length):
    """Mean over every token of every window: the text's tokens cut by hand into consecutive
    runs of max_length − (special tokens), each wrapped in the special tokens and run alone."""
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    room = max_length - tok.num_special_tokens_to_add()
    total, count = 0.0, 0
    for start in range(0, max(len(ids), 1), room):
        window = torch.tensor([[tok.cls_token_id, *ids[start : start + room], tok.sep_token_id]])  # BERT's template
        with torch.no_grad():
            h = model(input_ids=window, output_hidden_states=True).hidden_states[layer][0].double().numpy()
        for t in range(h.shape[0]):
            total, count = total + h[t], count + 1
    return total / count
