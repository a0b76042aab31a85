"""MPOBERT: a deeper BERT-like model with fewer parameters, built from a trained base.

Architecture
------------
From a base masked-LM with ``L`` transformer layers, :func:`build` makes a model of the
same family with ``L' ≥ L`` layers. Every targeted weight of a layer (the six
:data:`WEIGHT_TYPES`: attention query, key, value and output, feed-forward in and out) is
an :class:`~lmdecomp.mpo.MPOLinear` of ``n`` cores ``G_1 … G_n`` (central core
``c = n // 2``). What is shared is declared by :class:`MPOBertConfig.sharing`:

``"central"`` (MPOBERT)
    per weight type ONE central tensor — a single ``nn.Parameter`` held by
    :class:`CentralTensors` and placed into the core list of that weight in every layer —
    while the auxiliary cores ``G_k, k ≠ c`` are layer-specific. Each layer also has a
    bottleneck :class:`Adapter` on its feed-forward output and a scalar residual gate.
``"layer"`` (ALBERT-style)
    one whole transformer layer (dense weights, LayerNorms, biases) is the same module
    at every depth; only the residual gates are per position.
``"none"`` (the deep dense baseline)
    nothing is shared: every layer keeps its own dense weights, built and grown with the
    same depth mapping and gates, so it has the depth of the shared models at the full
    parameter cost (the ceiling they trade against).

Residual gates
--------------
Layer ``l'`` computes ``h ← h + g_{l'} (f_{l'}(h) − h)`` around the family's own
(post-LayerNorm) layer ``f``. A gate at 0 makes the layer the identity, a gate at 1
leaves it as it was; the gate is trainable, so a closed layer opens under training
(``∂loss/∂g = ⟨∂loss/∂h_out, f(h) − h⟩ ≠ 0``, as in ReZero, Bachlechner et al. 2020).

Stable initialisation (``init="stable"``)
-----------------------------------------
Goal: the ``L'``-layer network starts as the trained ``L``-layer base, up to the
approximation the shared central tensor forces.

1. Shared central tensor by a joint fit. For a weight type, unfold each base layer's
   weight (interleaved as in :func:`~lmdecomp.mpo.mpo_decompose`) into a 3-way tensor
   ``M_l`` of shape ``(P, m, Q)``: ``P = ∏_{k<c} i_k j_k`` (left cores), ``m = i_c j_c``
   (central), ``Q = ∏_{k>c} i_k j_k`` (right cores). Fit::

       min_{C, A_l, B_l}  Σ_l ‖M_l − C ×₁ A_l ×₃ B_l‖²,   A_lᵀA_l = I,  B_l B_lᵀ = I

   (a Tucker-2 model with a core shared by all layers) by alternating exact updates —
   ``C = mean_l M_l ×₁ A_lᵀ ×₃ B_l`` (exact for orthonormal factors), then each
   ``A_l`` and ``B_l`` by orthogonal Procrustes (the SVD of ``M_l`` times the rest) —
   starting from each layer's own leading singular vectors. Every update is a global
   minimiser in its block, so the loss never increases. With one base layer and full
   bonds the fit is exact. The bond dimensions ``r_left, r_right`` of ``C`` are capped
   by ``bond``; ``A_l`` and ``B_l`` are then split into the auxiliary cores by exact
   (untruncated) TT-SVD, so they hold ``W_l``'s layer-specific bases and ``C`` the
   shared weight.
2. Depth mapping: deep layer ``l'`` takes its auxiliary cores, biases and LayerNorms from
   base layer ``⌊l'·L/L'⌋``.
3. Residual scaling: the first deep layer mapped to each base layer starts with gate 1,
   every further copy with gate 0. At initialisation the deep model therefore computes
   exactly the base model with its weights replaced by the shared-central fit; the
   residual stream passes the extra layers unchanged, so activation norms stay those of
   the base however deep the model is (repeating a post-LN layer ungated would instead
   feed each copy inputs it was never trained on). Training then opens the copies.
   (In a post-LN family LayerNorm bounds the residual stream whatever the weights, so a
   naive initialisation is not worse on activation norms; it is on the loss.)
4. Adapters: up-projection zero, so each adapter starts as the identity.

For ``sharing="layer"`` the shared layer is the element-wise mean of the base layers (the
least-squares single layer in weight space), with the same gate scheme.
``init="random_auxiliary"`` is the naive baseline: the shared central from step 1, but
Gaussian auxiliary cores scaled to orthonormal size and every gate at 1.

Parameter count
---------------
:func:`parameter_report` classifies every distinct parameter once: ``shared_central``,
``auxiliary``, ``adapters``, ``gates``, ``dense_weights`` (linear weights not in MPO
form), ``embeddings`` (every ``nn.Embedding``; a decoder tied to the word embeddings is
counted once) and ``other`` (biases, LayerNorms, heads).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import torch
from torch import Tensor, nn

from lmdecomp.mpo.convert import load_weights, match_saved_dtype, save_weights
from lmdecomp.mpo.layer import MPOLinear
from lmdecomp.mpo.sharing import (
    _interleaved_dims,
    _layer_shapes,
    _random_aux,
    _split,
    _split_right,
    mpo_bond_dims,
    shared_central_fit,
)

WEIGHT_TYPES = ("query", "key", "value", "attention_output", "ffn_in", "ffn_out")


_BERT_LINEARS = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attention_output": "attention.output.dense",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
}


# Where each weight type lives inside one transformer layer, per model family.
LAYER_LINEARS: dict[str, dict[str, str]] = {
    "bert": _BERT_LINEARS,
    "roberta": _BERT_LINEARS,
    "electra": _BERT_LINEARS,
    "deberta-v2": {
        **_BERT_LINEARS,
        "query": "attention.self.query_proj",
        "key": "attention.self.key_proj",
        "value": "attention.self.value_proj",
    },
}


CONFIG_FILE = "mpobert.json"


WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class MPOBertConfig:
    """What :func:`build` makes; stored next to the weights so :func:`load` can rebuild it."""

    num_layers: int  # L', the depth of the new model
    sharing: str = "central"  # "central" (MPOBERT), "layer" (ALBERT-style) or "none" (deep dense)
    bond: int | None = None  # cap on the central tensor's two bonds; None: full rank
    n_cores: int = 5
    adapter_size: int = 8  # bottleneck width of the per-layer adapters; 0: none
    init: str = "stable"  # "stable" or "random_auxiliary" (the naive baseline)
    als_iterations: int = 10

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {self.num_layers}")
        if self.sharing not in ("central", "layer", "none"):
            raise ValueError(f"sharing must be 'central', 'layer' or 'none', got {self.sharing!r}")
        if self.init not in ("stable", "random_auxiliary"):
            raise ValueError(f"init must be 'stable' or 'random_auxiliary', got {self.init!r}")
        if self.bond is not None and self.bond < 1:
            raise ValueError(f"bond must be >= 1 or None, got {self.bond}")
        if self.n_cores < 3:
            raise ValueError(f"n_cores must be >= 3 (auxiliary cores on both sides of the central one), got {self.n_cores}")
        if self.adapter_size < 0:
            raise ValueError(f"adapter_size must be >= 0, got {self.adapter_size}")


# --------------------------------------------------------------------------- #
# modules
# --------------------------------------------------------------------------- #
class CentralTensors(nn.Module):
    """The shared central tensors, one ``nn.Parameter`` per weight type."""

    def __init__(self, shapes: Mapping[str, Sequence[int]]) -> None:
        super().__init__()
        self.tensors = nn.ParameterDict({t: nn.Parameter(torch.zeros(*s)) for t, s in shapes.items()})


class Adapter(nn.Module):
    """Bottleneck adapter ``h + W_up σ(W_down h + b_down) + b_up`` (Houlsby et al. 2019);
    ``W_up`` and ``b_up`` start at zero, so the adapter starts as the identity."""

    def __init__(self, width: int, size: int) -> None:
        super().__init__()
        self.down = nn.Linear(width, size)
        self.up = nn.Linear(size, width)
        nn.init.normal_(self.down.weight, std=width**-0.5)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, h: Tensor) -> Tensor:
        return h + self.up(nn.functional.gelu(self.down(h)))


class AdaptedLinear(nn.Module):
    """A linear layer followed by an :class:`Adapter` on its output."""

    def __init__(self, linear: nn.Module, adapter: Adapter) -> None:
        super().__init__()
        self.linear = linear
        self.adapter = adapter

    def forward(self, x: Tensor) -> Tensor:
        return self.adapter(self.linear(x))


class GatedLayer(nn.Module):
    """``h + g (f(h) − h)`` around a transformer layer ``f`` (first positional argument is
    the hidden state; a tuple output keeps its other entries)."""

    def __init__(self, layer: nn.Module, gate: float) -> None:
        super().__init__()
        self.layer = layer
        self.gate = nn.Parameter(torch.tensor(float(gate)))

    def forward(self, hidden_states: Tensor, *args, **kwargs):
        out = self.layer(hidden_states, *args, **kwargs)
        h = out[0] if isinstance(out, tuple) else out
        gated = hidden_states + self.gate.to(h.dtype) * (h - hidden_states)
        return (gated, *out[1:]) if isinstance(out, tuple) else gated


# --------------------------------------------------------------------------- #
# build / install
# --------------------------------------------------------------------------- #
def _layers(model: nn.Module) -> nn.ModuleList:
    return model.base_model.encoder.layer


def _family(model: nn.Module) -> dict[str, str]:
    kind = model.config.model_type
    if kind not in LAYER_LINEARS:
        raise ValueError(f"MPOBERT supports the families {sorted(LAYER_LINEARS)}; this base is {kind!r}")
    return LAYER_LINEARS[kind]


def _set(module: nn.Module, path: str, child: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, name, child)


def _install(model: nn.Module, cfg: MPOBertConfig, gates: Sequence[float]) -> None:
    """Turn a freshly built ``L'``-layer model into the declared structure (weights are
    filled in by :func:`build` or loaded by :func:`load`)."""
    layers = _layers(model)
    if len(layers) != cfg.num_layers:
        raise ValueError(f"model has {len(layers)} layers, config says {cfg.num_layers}")
    if cfg.sharing != "central":
        inner = [layers[0] if cfg.sharing == "layer" else layer for layer in layers]
        for k, layer in enumerate(inner):
            layers[k] = GatedLayer(layer, gates[k])
        return
    paths = _family(model)
    first = layers[0]
    specs = {}
    for t in WEIGHT_TYPES:
        out_shape, in_shape = _layer_shapes(first.get_submodule(paths[t]), cfg.n_cores, t)
        specs[t] = (out_shape, in_shape, mpo_bond_dims(out_shape, in_shape, cfg.bond))
    c = cfg.n_cores // 2
    bank = CentralTensors({t: (b[c], o[c], i[c], b[c + 1]) for t, (o, i, b) in specs.items()})
    # under the encoder, so the encoder alone (as fine-tuning uses it) still holds it
    model.base_model.add_module("mpobert_central", bank)
    for k, layer in enumerate(layers):
        for t in WEIGHT_TYPES:
            dense = layer.get_submodule(paths[t])
            out_shape, in_shape, bonds = specs[t]
            mpo_layer = MPOLinear(out_shape, in_shape, bonds, bias=dense.bias is not None)
            mpo_layer.cores[c] = bank.tensors[t]  # the one shared Parameter
            if dense.bias is not None:
                with torch.no_grad():
                    mpo_layer.bias.copy_(dense.bias)
            if t == "ffn_out" and cfg.adapter_size:
                width = mpo_layer.out_features
                _set(layer, paths[t], AdaptedLinear(mpo_layer, Adapter(width, cfg.adapter_size)))
            else:
                _set(layer, paths[t], mpo_layer)
        layers[k] = GatedLayer(layer, gates[k])


def _origins(base_layers: int, num_layers: int) -> list[int]:
    return [k * base_layers // num_layers for k in range(num_layers)]


def _stable_gates(origins: Sequence[int]) -> list[float]:
    return [1.0 if k == 0 or origins[k] != origins[k - 1] else 0.0 for k in range(len(origins))]


def _mpo_of(module: nn.Module) -> MPOLinear:
    return module.linear if isinstance(module, AdaptedLinear) else module


def build(base: nn.Module, cfg: MPOBertConfig, seed: int = 0) -> tuple[nn.Module, dict]:
    """The ``cfg.num_layers``-deep model initialised from ``base`` (module docstring).

    Returns ``(model, info)``; ``info`` holds the depth mapping, the gates and, for
    ``sharing="central"``, the relative error of the shared-central fit per weight type
    and base layer."""
    base_layers = _layers(base)
    n_base = len(base_layers)
    if cfg.num_layers < n_base:
        raise ValueError(f"num_layers={cfg.num_layers} is below the base's {n_base} layers")
    torch.manual_seed(seed)
    config = copy.deepcopy(base.config)
    config.num_hidden_layers = cfg.num_layers
    model = type(base)(config).to(base.dtype)  # a new model takes torch's default dtype, not the base's
    prefix = f"{base.base_model_prefix}.encoder.layer."
    outer = {k: v for k, v in base.state_dict().items() if not k.startswith(prefix)}
    missing, unexpected = model.load_state_dict(outer, strict=False)
    outside = [k for k in missing if not k.startswith(prefix)]
    if unexpected or outside:
        raise RuntimeError(f"base and deep model differ outside the layers: {unexpected or outside}")
    origins = _origins(n_base, cfg.num_layers)
    layers = _layers(model)
    if cfg.sharing == "layer":
        mean = {k: torch.stack([bl.state_dict()[k].double() for bl in base_layers]).mean(0).to(base.dtype)
                for k in base_layers[0].state_dict()}
        layers[0].load_state_dict(mean)
    else:
        for k, layer in enumerate(layers):
            layer.load_state_dict(base_layers[origins[k]].state_dict())
    gates = _stable_gates(origins) if cfg.init == "stable" else [1.0] * cfg.num_layers
    _install(model, cfg, gates)
    model.to(base.dtype)  # the MPO layers _install made
    info: dict = {"origins": origins, "gates": gates, "base_layers": n_base}
    if cfg.sharing == "central":
        info["fit_rel_error"] = _initialise_cores(model, base_layers, origins, cfg, seed)
    model.mpobert_config = cfg
    model.mpobert_base_layers = n_base
    return model, info


@torch.no_grad()
def _initialise_cores(model: nn.Module, base_layers: nn.ModuleList, origins: Sequence[int], cfg: MPOBertConfig, seed: int) -> dict[str, list[float]]:
    paths = _family(model)
    layers = _layers(model)
    c = cfg.n_cores // 2
    generator = torch.Generator().manual_seed(seed)
    errors = {}
    for t in WEIGHT_TYPES:
        weights = [bl.get_submodule(paths[t]).weight for bl in base_layers]
        ref = _mpo_of(layers[0].layer.get_submodule(paths[t]))
        out_shape, in_shape, bonds = ref.out_shape, ref.in_shape, ref.bond_dims
        pairs = list(zip(out_shape, in_shape))
        d = _interleaved_dims(out_shape, in_shape)
        central, lefts, rights, errors[t] = shared_central_fit(weights, out_shape, in_shape, bonds[c], bonds[c + 1], cfg.als_iterations)
        model.base_model.mpobert_central.tensors[t].copy_(central.reshape(bonds[c], *pairs[c], bonds[c + 1]))
        aux = [_split(a, 1, d[:c], pairs[:c], bonds[c]) + [None] + _split_right(b, bonds[c + 1], d[c + 1 :], pairs[c + 1 :])
               for a, b in zip(lefts, rights)]
        for k, layer in enumerate(layers):
            target = _mpo_of(layer.layer.get_submodule(paths[t]))
            for idx, core in enumerate(aux[origins[k]]):
                if idx == c:
                    continue
                if cfg.init == "random_auxiliary":
                    fan = core.shape[0] * core.shape[1] * core.shape[2] if idx < c else core.shape[1] * core.shape[2] * core.shape[3]
                    core = _random_aux(core, fan, generator)
                target.cores[idx].copy_(core)
    return errors


def grow(model: nn.Module, num_layers: int) -> nn.Module:
    """A deeper copy of a built model that computes exactly the same function.

    Deep layer ``l''`` copies layer ``⌊l''·L'/L''⌋`` of ``model`` (its auxiliary cores,
    adapter, biases, LayerNorms and gate); the central tensors (or, for
    ``sharing="layer"``, the one layer) stay shared; every further copy of a layer starts
    with gate 0, i.e. as the identity. This is the growth step of the stable
    initialisation: fit and heal the shared-central model at the base's depth, then grow."""
    cfg = dataclasses.replace(model.mpobert_config, num_layers=num_layers)
    old = _layers(model)
    if num_layers < len(old):
        raise ValueError(f"cannot grow a {len(old)}-layer model to {num_layers} layers")
    origins = _origins(len(old), num_layers)
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = num_layers
    torch.manual_seed(0)
    deep = type(model)(config)
    gates = [float(old[o].gate.detach()) if g else 0.0 for o, g in zip(origins, _stable_gates(origins))]
    _install(deep, cfg, gates)
    deep.to(model.dtype)  # so that a float64 model grows into the same function to float64 rounding
    prefix = f"{model.base_model_prefix}.encoder.layer."
    outer = {k: v for k, v in model.state_dict().items() if not k.startswith(prefix)}
    deep.load_state_dict(outer, strict=False)
    new = _layers(deep)
    with torch.no_grad():
        for k, layer in enumerate(new):
            state = {n: v for n, v in old[origins[k]].state_dict().items() if n != "gate"}
            layer.layer.load_state_dict(
                {n.removeprefix("layer."): v for n, v in state.items()}, strict=True)
            layer.gate.fill_(gates[k])
    deep.mpobert_config = cfg
    deep.mpobert_base_layers = model.mpobert_base_layers
    return deep


# --------------------------------------------------------------------------- #
# parameter groups and the count
# --------------------------------------------------------------------------- #
def _unique(params) -> list[nn.Parameter]:
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def central_parameters(model: nn.Module) -> list[nn.Parameter]:
    return _unique(p for m in model.modules() if isinstance(m, CentralTensors) for p in m.tensors.values())


def auxiliary_parameters(model: nn.Module) -> list[nn.Parameter]:
    central = {id(p) for p in central_parameters(model)}
    return _unique(core for m in model.modules() if isinstance(m, MPOLinear) for core in m.cores if id(core) not in central)


def adapter_parameters(model: nn.Module) -> list[nn.Parameter]:
    return _unique(p for m in model.modules() if isinstance(m, Adapter) for p in m.parameters())


def gate_parameters(model: nn.Module) -> list[nn.Parameter]:
    return _unique(m.gate for m in model.modules() if isinstance(m, GatedLayer))


def parameter_report(model: nn.Module) -> dict[str, int]:
    """Exact parameter count, every distinct parameter once, split by role (module docstring)."""
    groups = {
        "shared_central": central_parameters(model),
        "auxiliary": auxiliary_parameters(model),
        "adapters": adapter_parameters(model),
        "gates": gate_parameters(model),
        "embeddings": _unique(p for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()),
        # adapter weights were claimed above, so only the other linear layers count here
        "dense_weights": _unique(m.weight for m in model.modules() if isinstance(m, nn.Linear)),
    }
    claimed: set[int] = set()
    counts = {}
    for name, params in groups.items():
        fresh = [p for p in params if id(p) not in claimed]
        claimed.update(id(p) for p in fresh)
        counts[name] = sum(p.numel() for p in fresh)
    counts["other"] = sum(p.numel() for p in _unique(model.parameters()) if id(p) not in claimed)
    counts["total"] = sum(p.numel() for p in _unique(model.parameters()))
    return counts


# --------------------------------------------------------------------------- #
# save / load
# --------------------------------------------------------------------------- #
def save(model: nn.Module, directory: str | Path) -> Path:
    """``config.json`` (the family's config, ``L'`` layers), ``mpobert.json`` and
    ``model.safetensors`` (each shared tensor stored once)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(directory)
    record = {"architecture": type(model).__name__, "base_layers": model.mpobert_base_layers,
              "gates": [float(m.gate.detach()) for m in _layers(model)], "config": dataclasses.asdict(model.mpobert_config)}
    (directory / CONFIG_FILE).write_text(json.dumps(record, indent=2) + "\n")
    save_weights(model, directory / WEIGHTS_FILE)
    return directory


def load(directory: str | Path) -> nn.Module:
    """Inverse of :func:`save` (strict: every tensor present, nothing extra; the saved
    floating dtype is kept, see :func:`~lmdecomp.mpo.match_saved_dtype`)."""
    import transformers

    directory = Path(directory)
    record = json.loads((directory / CONFIG_FILE).read_text())
    cfg = MPOBertConfig(**record["config"])
    model = getattr(transformers, record["architecture"])(transformers.AutoConfig.from_pretrained(directory))
    _install(model, cfg, record["gates"])
    match_saved_dtype(model, directory / WEIGHTS_FILE)
    load_weights(model, directory / WEIGHTS_FILE)
    model.mpobert_config = cfg
    model.mpobert_base_layers = record["base_layers"]
    return model.eval()


def is_mpobert(directory: str | Path) -> bool:
    return (Path(directory) / CONFIG_FILE).exists()


# --------------------------------------------------------------------------- #
# diagnostics
# --------------------------------------------------------------------------- #
@torch.no_grad()
def activation_norms(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> list[float]:
    """RMS of the residual stream entering every LayerNorm inside the layers (the
    post-LN sum ``h + f(h)``), maximised per layer, on real (unpadded) positions.

    With ``sharing="layer"`` the same LayerNorm modules run at every depth, so a hook on
    a LayerNorm cannot tell the depths apart. Each depth's own entry of the layer list
    (the per-depth :class:`GatedLayer`, or the plain layer of a base model) therefore
    sets the current depth on entry, and each distinct LayerNorm is hooked once and
    records into that depth."""
    layers = _layers(model)
    per_layer = [0.0] * len(layers)
    keep = attention_mask.bool()
    current: list[int | None] = [None]
    hooks = []

    def enter(k):
        def pre_hook(_m, _args):
            current[0] = k
        return pre_hook

    def leave(_m, _args, _out):
        current[0] = None

    def record(_m, args, _out):
        if current[0] is not None:
            x = args[0][keep]
            per_layer[current[0]] = max(per_layer[current[0]], float(x.pow(2).mean().sqrt()))

    norms = {}
    for k, layer in enumerate(layers):
        hooks.append(layer.register_forward_pre_hook(enter(k)))
        hooks.append(layer.register_forward_hook(leave))
        norms.update({id(m): m for m in layer.modules() if isinstance(m, nn.LayerNorm)})
    hooks.extend(m.register_forward_hook(record) for m in norms.values())
    was_training = model.training
    model.eval()
    try:
        model(input_ids=input_ids, attention_mask=attention_mask)
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    return per_layer
