"""The masked-LM loss with the prediction head applied to the masked positions only.

A masked-LM model's own ``model(..., labels=…).loss`` projects *every* position onto the
vocabulary and then ignores all but the masked ~15%: for a vocabulary V, width H and T
tokens that is ``T·H·V`` multiply-adds of which 85% are thrown away (for a 30,522-token
BERT at H = 128 the head costs more than two encoder layers). The loss is

    L = (1/|M|) Σ_{t ∈ M} −log softmax(head(h_t))_{y_t},   M = {t : label_t ≠ −100}

so gathering ``h_t`` for ``t ∈ M`` before the head gives the same value and the same
gradients (up to float rounding of a smaller GEMM). Used for the families the pipeline trains
(the zoo's seven: BERT, RoBERTa, ALBERT, DeBERTa-v2, ELECTRA, ModernBERT, RoFormer, and MPOBERT/MPO
variants of them); any other family
falls back on the model's own loss.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

__all__ = ["prediction_head", "masked_lm_loss"]


def prediction_head(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """hidden states (..., H) → vocabulary logits (..., V), as the model's forward applies
    them; None for a family not listed here."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    if kind in ("bert", "roformer") and isinstance(getattr(model, "cls", None), nn.Module):
        return model.cls
    if kind == "roberta":
        return model.lm_head
    if kind == "albert":
        return model.predictions
    if kind == "electra":
        return lambda h: model.generator_lm_head(model.generator_predictions(h))
    if kind == "deberta-v2":
        if model.legacy:
            return model.cls
        embeddings = model.deberta.embeddings.word_embeddings
        return lambda h: model.lm_predictions(h, embeddings)
    if kind == "modernbert":
        return lambda h: model.decoder(model.head(h))
    return None


def masked_lm_loss(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy over positions with ``labels != -100`` (module docstring)."""
    head = prediction_head(model)
    if head is None:
        return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    scored = labels != -100
    logits = head(hidden[scored])
    return nn.functional.cross_entropy(logits.float(), labels[scored])
