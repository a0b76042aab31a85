"""The model variants compared by fine-tuning, all derived from one trained base.

``dense``    the base, trained further with the same masked-LM budget as the others.
``mpo``      the base with every targeted linear layer an MPO truncated to ``bond``
             (:func:`lmdecomp.mpo.convert_linears`, mixed-canonical: the central core
             carries the norm), then healed by masked-LM training.
``mpobert``  ``layers`` deep, one central tensor per weight type shared by all layers
             (:mod:`lmdecomp.mpo.mpobert`): fit at the base's depth, healed, grown, pretrained.
``albert``   ``layers`` deep, one whole layer shared by all depths (ALBERT-style), built
             the same way.
``deep``     ``layers`` deep with nothing shared (every layer its own dense weights), built
             the same way: the dense ceiling of the same depth and pretraining budget that
             the shared models trade parameters against.

Every variant gets the same training budget, so fine-tuning compares architectures and not
amounts of pretraining: ``heal_steps`` at the base's depth then ``steps`` at the final depth
(``dense`` and ``mpo`` stay at the base's depth for both). The objective (``objective``) is
the masked-LM loss (``mlm``) or distillation toward the base's last hidden states
(``distill``, :mod:`lmdecomp.mpo.distill`: for a base without a trained masked-LM head; the
dense variant is then the base itself). The record holds the val loss of that objective after
each phase (for ``distill`` the relative error against the base, 0 for the base), so the
stable initialisation can be read off: ``grown`` equals ``healed`` (growth preserves the
function), and both are compared with ``base``.

Fine-tuning variants (``finetune.variants`` in params.yaml) name one of these models and
which of its parameters train, e.g. ``mpobert`` with ``trainable: auxiliary``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from lmdecomp import mpo
from lmdecomp.models import masking, train
from lmdecomp.mpo import distill, mpobert

__all__ = ["MODEL_VARIANTS", "make_variant", "load_variant", "val_loss"]

MODEL_VARIANTS = ("dense", "mpo", "mpobert", "albert", "deep")
SHARING = {"mpobert": "central", "albert": "layer", "deep": "none"}
OBJECTIVES = ("mlm", "distill")  # how the variants are healed and pretrained (mpobert.objective)
MODEL_DIR = "model"


def val_loss(model, tokenizer, val_texts: Sequence[str], max_length: int, val_blocks: int, seed: int = 0) -> float:
    """Masked-LM loss on the first ``val_blocks`` val blocks under a fixed seeded mask."""
    ids, mask = masking.make_blocks(tokenizer, list(val_texts), max_length)
    ids, mask = ids[:val_blocks], mask[:val_blocks]
    masked, labels = masking.fixed_eval_mask(tokenizer, ids, mask, 0.15, seed)
    loss, _ = train.evaluate_mlm(model, masked, mask, labels)
    return float(loss)


def _train_config(cfg: Mapping[str, Any], steps: int) -> dict[str, Any]:
    return {
        "steps": steps,
        "batch_size": cfg["batch_size"],
        "learning_rate": cfg["learning_rate"],
        "warmup_ratio": cfg["warmup_ratio"],
        "max_length": cfg["max_length"],
        "seed": cfg["seed"],
        "checkpoint_every": max(50, steps // 4),
        "device": cfg.get("device", "auto"),
    }


def make_variant(name: str, base, tokenizer, train_texts: Sequence[str], val_texts: Sequence[str],
                 cfg: Mapping[str, Any], out_dir: str | Path, work_dir: str | Path | None = None,
                 progress: bool = True) -> dict[str, Any]:
    """Build, train and save variant ``name`` into ``out_dir`` (model/, metrics.json,
    train_log.parquet); ``work_dir`` keeps resumable checkpoints. Returns the record."""
    if name not in MODEL_VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose from {MODEL_VARIANTS}")
    out_dir = Path(out_dir)
    work = Path(work_dir) if work_dir is not None else None
    objective = cfg.get("objective", "mlm")
    if objective not in OBJECTIVES:
        raise ValueError(f"mpobert.objective must be one of {OBJECTIVES}, got {objective!r}")
    if objective == "distill":
        val_ids, val_mask = masking.make_blocks(tokenizer, list(val_texts), cfg["max_length"])
        loss = lambda m: distill.val_error(m, base, val_ids[: cfg["val_blocks"]], val_mask[: cfg["val_blocks"]])  # noqa: E731
    else:
        loss = lambda m: val_loss(m, tokenizer, val_texts, cfg["max_length"], cfg["val_blocks"])  # noqa: E731
    n_base = base.config.num_hidden_layers
    record: dict[str, Any] = {"variant": name, "base_layers": n_base, "objective": objective, "val_loss": {"base": loss(base)}}
    logs: list[dict] = []

    def pretrain(model, phase: str, steps: int):
        if steps == 0:
            return
        if objective == "distill":
            logs.extend({"phase": phase, **row} for row in distill.distill(model, base, tokenizer, train_texts, cfg, steps))
        else:
            ckpt = work / phase if work is not None else None
            result = train.train_mlm_restarting(model, tokenizer, train_texts, val_texts, _train_config(cfg, steps), ckpt,
                                                progress=progress)
            logs.extend({"phase": phase, **row} for row in result.log)
        model.cpu().eval()
        record["val_loss"][phase] = loss(model)

    if name == "dense":
        model = copy.deepcopy(base)
        # distilling the base into itself is the identity: the dense variant is the base
        pretrain(model, "healed", 0 if objective == "distill" else cfg["heal_steps"] + cfg["steps"])
    elif name == "mpo":
        model = copy.deepcopy(base)
        targets = tuple(mpobert._family(model).values())
        # mixed canonical: the central cores carry the norm, the auxiliary ones are isometries
        mpo.convert_linears(model, targets, max_bond=cfg["bond"], n_cores=cfg["n_cores"], canonical="mixed")
        record["val_loss"]["built"] = loss(model)
        pretrain(model, "healed", cfg["heal_steps"] + cfg["steps"])
    else:
        sharing = SHARING[name]
        spec = mpobert.MPOBertConfig(num_layers=n_base, sharing=sharing, bond=cfg["bond"], n_cores=cfg["n_cores"],
                                     adapter_size=cfg["adapter_size"] if sharing == "central" else 0,
                                     als_iterations=cfg["als_iterations"])
        model, info = mpobert.build(base, spec, seed=cfg["seed"])
        if "fit_rel_error" in info:
            record["shared_central_fit_rel_error"] = info["fit_rel_error"]
        record["val_loss"]["built"] = loss(model)
        pretrain(model, "healed", cfg["heal_steps"])
        model = mpobert.grow(model, cfg["layers"])
        record["val_loss"]["grown"] = loss(model)
        pretrain(model, "pretrained", cfg["steps"])
        record["gates"] = [round(float(layer.gate.detach()), 6) for layer in model.base_model.encoder.layer]
    record["layers"] = model.config.num_hidden_layers
    record["parameters"] = mpobert.parameter_report(model)
    record["encoder_parameters"] = mpobert.parameter_report(model.base_model)

    folder = out_dir / MODEL_DIR
    if name == "dense":
        model.save_pretrained(folder)
    elif name == "mpo":
        mpo.save_converted(model, folder)
    else:
        mpobert.save(model, folder)
    tokenizer.save_pretrained(folder)
    if logs:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(logs), out_dir / "train_log.parquet")
    (out_dir / "metrics.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def load_variant(folder: str | Path):
    """``(masked-LM model, tokenizer)`` of a variant folder written by :func:`make_variant`."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    folder = Path(folder) / MODEL_DIR
    if mpobert.is_mpobert(folder):
        model = mpobert.load(folder)
    elif (folder / mpo.LAYOUT_FILE).exists():
        model = mpo.load_converted(folder)
    else:
        model = AutoModelForMaskedLM.from_pretrained(folder)
    return model.eval(), AutoTokenizer.from_pretrained(folder)
