"""Do MPOBERT's residual gates open during pretraining, and does their own learning rate open them?

Starts from the *healed* shared-central model at the base's depth (the checkpoint that
``variants.make_variant`` writes under ``results/variants/mpobert.work/healed`` before it grows;
copy it while the variant is being built), grows it to ``mpobert.layers`` exactly as the
pipeline does (:func:`lmdecomp.mpo.mpobert.grow`: every further copy of a layer starts with gate
0) and runs the pipeline's own masked-LM pretraining (:func:`lmdecomp.models.train.train_mlm`,
the variant's settings) once per gate learning-rate multiplier ``m``: the gates get ``m × lr``,
everything else ``lr``. Records every gate after every step and the val masked-LM loss.

Why a multiplier: AdamW moves a parameter by at most about ``lr_t`` per step whatever its
gradient (the update is ``lr_t · m̂/(√v̂ + ε)``, ``|m̂/√v̂| ≲ 1``), so over a run a gate moves at
most ``Σ_t lr_t`` ≈ ``steps · lr · (1 − warmup/2 − (1 − warmup)/2)`` = ``0.5 · steps · lr`` with
linear warmup and decay: 0.1 for 200 steps at 1e-3. A gate that starts at 0 cannot open.

Usage::

    python benchmarks/diagnose_gates.py --healed /tmp/diag/healed_checkpoint.pt \\
        --base results/models/zoo-wp-s0 --sequences results/corpus/sequences.parquet \\
        --multipliers 1,100 --out results/benchmarks/diagnose_gates.json [--save-dir /tmp/diag/gates]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import yaml

from lmdecomp.data import corpus
from lmdecomp.models import train
from lmdecomp.mpo import mpobert, variants


def healed_model(base_dir: str, healed: str, cfg: dict):
    """The shared-central model at the base's depth with the healed checkpoint's weights."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    base = AutoModelForMaskedLM.from_pretrained(base_dir).eval()
    spec = mpobert.MPOBertConfig(num_layers=base.config.num_hidden_layers, sharing="central", bond=cfg["bond"],
                                 n_cores=cfg["n_cores"], adapter_size=cfg["adapter_size"],
                                 als_iterations=cfg["als_iterations"])
    model, _ = mpobert.build(base, spec, seed=cfg["seed"])
    model.load_state_dict(torch.load(healed, weights_only=False)["model"])
    return model, AutoTokenizer.from_pretrained(base_dir)


def gate_groups(multiplier: float, lr: float):
    """``train._param_groups`` with MPOBERT's gates in their own group at ``multiplier × lr``."""
    plain = train._param_groups

    def groups(model, weight_decay):
        gates = {id(p) for p in mpobert.gate_parameters(model)}
        out = []
        for g in plain(model, weight_decay):
            rest = [p for p in g["params"] if id(p) not in gates]
            if rest:
                out.append({**g, "params": rest})
        out.append({"params": [p for p in mpobert.gate_parameters(model) if p.requires_grad], "weight_decay": 0.0,
                    "lr": multiplier * lr})
        return out

    return groups


def pretrain(model, tokenizer, texts, cfg: dict, multiplier: float) -> dict:
    trace = []
    settings = {**variants._train_config(cfg, cfg["steps"]), "checkpoint_every": 0}
    original = train._param_groups
    train._param_groups = gate_groups(multiplier, cfg["learning_rate"])
    try:
        gates = mpobert.gate_parameters(model)
        result = train.train_mlm(model, tokenizer, texts[0], texts[1], settings, None, progress=False,
                                 on_step=lambda step, loss: trace.append(
                                     {"step": step, "loss": round(loss, 4), "gates": [round(float(g.detach()), 5) for g in gates]}))
    finally:
        train._param_groups = original
    model.cpu().eval()
    return {"multiplier": multiplier, "gates_after": trace[-1]["gates"], "trace": trace,
            "val_loss_pipeline_protocol": variants.val_loss(model, tokenizer, texts[1], cfg["max_length"], cfg["val_blocks"]),
            "train_result_val_loss": result.val_loss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--healed", required=True, help="checkpoint.pt of the heal phase")
    parser.add_argument("--base", default="results/models/zoo-wp-s0")
    parser.add_argument("--sequences", default="results/corpus/sequences.parquet")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--multipliers", default="1,100")
    parser.add_argument("--steps", type=int, default=None, help="default: mpobert.steps")
    parser.add_argument("--out", default="results/benchmarks/diagnose_gates.json")
    parser.add_argument("--save-dir", default=None, help="save each pretrained model here (for diagnose_aux.py)")
    parser.add_argument("--threads", type=int, default=None, help="default: mpobert.threads")
    args = parser.parse_args()
    cfg = yaml.safe_load(Path(args.params).read_text())["mpobert"]
    if args.steps is not None:
        cfg["steps"] = args.steps
    torch.set_num_threads(args.threads or cfg["threads"])
    texts = corpus.split_texts(args.sequences, ("train", "val"))
    healed, tokenizer = healed_model(args.base, args.healed, cfg)
    record = {"settings": {**vars(args), "mpobert": cfg}, "runs": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for m in [float(x) for x in args.multipliers.split(",")]:
        model = mpobert.grow(healed, cfg["layers"])
        row = pretrain(model, tokenizer, texts, cfg, m)
        record["runs"].append(row)
        print(f"gate lr x{m:g}: gates {row['gates_after']}  val loss {row['val_loss_pipeline_protocol']:.4f}", file=sys.stderr)
        if args.save_dir:
            folder = Path(args.save_dir) / f"gates-x{m:g}"
            mpobert.save(model, folder / variants.MODEL_DIR)
            tokenizer.save_pretrained(folder / variants.MODEL_DIR)
        out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
