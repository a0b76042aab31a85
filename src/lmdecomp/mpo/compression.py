"""The MPO trade-off study of one model: how many parameters each truncation keeps, at what
reconstruction error, and what that costs in validation masked-LM loss.

Three tables, all from :mod:`lmdecomp.mpo`:

* spectrum — for every targeted linear layer and every bond k of its full-rank MPO, the
  singular values σ_{k,1} ≥ σ_{k,2} ≥ … of TT-SVD step k;
* ladder   — for every layer and every relative error budget τ, the parameters kept and the
  achieved error ‖W − Ŵ‖_F / ‖W‖_F (≤ τ by construction);
* loss     — for a few budgets, the whole model with every targeted layer truncated to τ:
  parameters of the converted layers and val masked-LM loss on a fixed seeded mask
  (τ = 0 is the dense model itself).
"""

from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import torch

from lmdecomp import mpo
from lmdecomp.models import masking, train


def spectrum_and_ladder(model, budgets: Sequence[float], n_cores: int,
                        targets: Sequence[str] = mpo.DEFAULT_TARGETS) -> tuple[list[dict], list[dict]]:
    spectrum, ladder = [], []
    for path in mpo.find_linears(model, targets):
        weight = model.get_submodule(path).weight.detach().double()
        norm = float(torch.linalg.norm(weight))
        full = mpo.mpo_decompose(weight, n_cores=n_cores)
        for bond, values in enumerate(full.spectra, start=1):
            spectrum.append({"matrix": path, "bond": bond, "singular_values": values.tolist()})
        for budget in budgets:
            truncated = full if budget == 0 else mpo.mpo_decompose(weight, n_cores=n_cores, rel_err=budget)
            error = float(torch.linalg.norm(truncated.to_matrix() - weight)) / norm
            ladder.append({"matrix": path, "budget": float(budget), "rel_error": error,
                           "params": truncated.num_params, "dense_params": weight.numel(),
                           "bond_dims": truncated.bond_dims})
    return spectrum, ladder


def loss_curve(model, tokenizer, val_texts: Sequence[str], budgets: Sequence[float], n_cores: int,
               cfg: Mapping[str, Any], targets: Sequence[str] = mpo.DEFAULT_TARGETS) -> list[dict]:
    """Val masked-LM loss of the model with every targeted layer truncated to each budget."""
    inputs, mask = masking.make_blocks(tokenizer, list(val_texts), int(cfg["max_length"]))
    inputs = inputs[: int(cfg["val_blocks"])]
    mask = mask[: int(cfg["val_blocks"])]
    masked, labels = masking.fixed_eval_mask(tokenizer, inputs, mask, float(cfg["mask_prob"]), int(cfg["seed"]))
    dense = sum(model.get_submodule(p).weight.numel() for p in mpo.find_linears(model, targets))
    rows = []
    for budget in budgets:
        candidate = copy.deepcopy(model)
        kept = dense
        if budget > 0:
            records = mpo.convert_linears(candidate, targets, rel_err=budget, n_cores=n_cores)
            kept = sum(r["params"] for r in records.values())
        loss, scored = train.evaluate_mlm(candidate, masked, mask, labels)
        rows.append({"budget": float(budget), "params": int(kept), "dense_params": int(dense),
                     "val_loss": float(loss), "tokens_scored": int(scored)})
    return rows
