"""Converting a Hugging Face model's linear layers to :class:`~lmdecomp.mpo.layer.MPOLinear`,
and saving / loading converted models (weights plus an MPO layout file)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import torch
from torch import Tensor, nn

from lmdecomp.mpo.decompose import factorize
from lmdecomp.mpo.layer import MPOLinear

# BERT's attention projections, attention output, and the two feed-forward layers.
DEFAULT_TARGETS = (
    "query",
    "key",
    "value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)


LAYOUT_FILE = "mpo_layout.json"


WEIGHTS_FILE = "model.safetensors"


_BLOCK_INDEX = re.compile(r"^\d+$")


def _target_matches(path: str, target: str) -> bool:
    """A dot-free target names a module (``query`` matches ``….self.query``); a dotted
    one must equal the path inside the repeated block (after the last numeric path
    component) or the whole path, so ``output.dense`` does not match
    ``….attention.output.dense``."""
    parts = path.split(".")
    if "." not in target:
        return parts[-1] == target
    last_index = max((k for k, p in enumerate(parts) if _BLOCK_INDEX.match(p)), default=-1)
    return target == ".".join(parts[last_index + 1 :]) or target == path


def find_linears(model: nn.Module, targets: Sequence[str] = DEFAULT_TARGETS) -> list[str]:
    """Paths of the ``nn.Linear`` modules of ``model`` matched by ``targets`` (see
    :func:`convert_linears`); raises ``ValueError`` when a target matches nothing."""
    paths, used = [], set()
    for path, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        hits = [t for t in targets if _target_matches(path, t)]
        if hits:
            paths.append(path)
            used.update(hits)
    missing = [t for t in targets if t not in used]
    if missing:
        raise ValueError(f"targets {missing} match no nn.Linear in {type(model).__name__}")
    return paths


def _replace(model: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent), name, module)


def convert_linears(
    model: nn.Module,
    targets: Sequence[str] = DEFAULT_TARGETS,
    *,
    max_bond: int | None = None,
    rel_err: float | None = None,
    shapes: Mapping[int, Sequence[int]] | None = None,
    n_cores: int = 5,
    canonical: str = "mixed",
) -> dict[str, dict]:
    """Replace the targeted ``nn.Linear`` layers of ``model`` in place by
    :meth:`MPOLinear.from_linear` (gauge ``canonical``, see
    :func:`~lmdecomp.mpo.decompose.mpo_decompose`) and return what was replaced, keyed by module path.

    Matching: a dot-free target (``"query"``) matches every Linear of that name; a
    dotted target must equal the module path inside its repeated block, i.e. after the
    last numeric component (``encoder.layer.3.attention.output.dense`` →
    ``attention.output.dense``), or the full path. So in BERT ``"output.dense"`` is the
    feed-forward output only, never ``attention.output.dense``. A target matching
    nothing raises ``ValueError``.

    ``shapes`` maps a dimension to its factors (e.g. ``{768: [4, 4, 4, 4, 3]}``);
    dimensions not in it use :func:`factorize` with ``n_cores`` factors. Each record
    holds the layout :func:`apply_layout` needs (``out_shape``, ``in_shape``,
    ``bond_dims``, ``bias``) plus ``params``, ``dense_params`` and ``rel_error`` =
    ``‖W − Ŵ‖_F / ‖W‖_F``.
    """
    shapes = dict(shapes or {})

    def factor(dim: int) -> list[int]:
        return list(shapes[dim]) if dim in shapes else factorize(dim, n_cores)

    records = {}
    for path in find_linears(model, targets):
        linear = model.get_submodule(path)
        out_f, in_f = linear.weight.shape
        layer = MPOLinear.from_linear(linear, (factor(out_f), factor(in_f)), max_bond, rel_err, canonical=canonical)
        with torch.no_grad():
            err = torch.linalg.norm(layer.weight().double() - linear.weight.double()) / torch.linalg.norm(linear.weight.double())
        records[path] = {
            "out_shape": list(layer.out_shape),
            "in_shape": list(layer.in_shape),
            "bond_dims": list(layer.bond_dims),
            "bias": layer.bias is not None,
            "params": layer.num_params,
            "dense_params": linear.weight.numel(),
            "rel_error": float(err),
        }
        _replace(model, path, layer)
    return records


def mpo_layout(model: nn.Module) -> dict[str, dict]:
    """``{path: {out_shape, in_shape, bond_dims, bias}}`` for every MPOLinear in ``model``."""
    return {
        path: {
            "out_shape": list(m.out_shape),
            "in_shape": list(m.in_shape),
            "bond_dims": list(m.bond_dims),
            "bias": m.bias is not None,
        }
        for path, m in model.named_modules()
        if isinstance(m, MPOLinear)
    }


def apply_layout(model: nn.Module, layout: Mapping[str, Mapping]) -> None:
    """Replace each module at a path of ``layout`` by a freshly initialised MPOLinear of
    the recorded shape (on the replaced module's device and dtype), ready for
    ``load_state_dict``."""
    for path, spec in layout.items():
        old = model.get_submodule(path)
        ref = next(old.parameters())
        layer = MPOLinear(spec["out_shape"], spec["in_shape"], spec["bond_dims"], bias=spec["bias"], device=ref.device, dtype=ref.dtype)
        _replace(model, path, layer)


ALIASES_KEY = "aliases"


def save_weights(model: nn.Module, path: str | Path) -> None:
    """Save ``model``'s state dict as safetensors, each shared tensor once, byte-reproducibly.

    A tensor reachable under several names (tied embeddings, a central tensor shared by
    layers) is stored under its first name in ``state_dict()`` order, and the other names
    are listed in the file's metadata. (safetensors' own ``save_model`` picks the kept name
    from a set, so the bytes would change with Python's string hash seed.)"""
    from safetensors.torch import save_file

    kept: dict[tuple, str] = {}
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tuple(tensor.stride()))
        if tensor.numel() and key in kept:
            aliases[name] = kept[key]
            continue
        kept[key] = name
        tensors[name] = tensor.detach().contiguous()
    save_file(tensors, str(path), metadata={ALIASES_KEY: json.dumps(aliases, sort_keys=True)})


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Inverse of :func:`save_weights`: every name of the state dict must be present (strict)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as f:
        aliases = json.loads((f.metadata() or {}).get(ALIASES_KEY, "{}"))
    state = load_file(str(path))
    state.update({alias: state[name] for alias, name in aliases.items()})
    model.load_state_dict(state, strict=True)


_FLOAT_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def match_saved_dtype(model: nn.Module, path: str | Path) -> nn.Module:
    """Cast ``model`` (in place) to the floating dtype of the tensors saved at ``path``,
    so a model saved in float64 or bfloat16 comes back in it rather than in the float32
    that building from a config gives. A file with several floating dtypes leaves the
    model as it is, with a warning (``load_state_dict`` then casts each tensor)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        names = {f.get_slice(k).get_dtype() for k in f.keys()}
    floats = {_FLOAT_DTYPES[n] for n in names if n in _FLOAT_DTYPES}
    if len(floats) == 1:
        model.to(floats.pop())  # parameters shared by several modules stay shared
    elif floats:
        warnings.warn(f"{path} holds tensors of several floating dtypes {sorted(map(str, floats))}; "
                      "they are loaded into the model's own dtypes", stacklevel=2)
    return model


def save_converted(model: nn.Module, directory: str | Path) -> Path:
    """Save a converted Hugging Face model as ``config.json`` (its config),
    ``mpo_layout.json`` (architecture class and :func:`mpo_layout`) and
    ``model.safetensors`` (state dict; tied weights are stored once)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(directory)
    layout = {"architecture": type(model).__name__, "layers": mpo_layout(model)}
    (directory / LAYOUT_FILE).write_text(json.dumps(layout, indent=2) + "\n")
    save_weights(model, directory / WEIGHTS_FILE)
    return directory


def load_converted(directory: str | Path, model_cls: type | None = None) -> nn.Module:
    """Inverse of :func:`save_converted`: build ``model_cls`` (default: the recorded
    ``transformers`` class) from the saved config, swap in MPOLinear layers per the
    layout, load the weights strictly (in the saved floating dtype, see
    :func:`match_saved_dtype`) and return the model in eval mode."""
    import transformers

    directory = Path(directory)
    layout = json.loads((directory / LAYOUT_FILE).read_text())
    cls = model_cls or getattr(transformers, layout["architecture"])
    model = cls(transformers.AutoConfig.from_pretrained(directory))
    apply_layout(model, layout["layers"])
    match_saved_dtype(model, directory / WEIGHTS_FILE)
    load_weights(model, directory / WEIGHTS_FILE)
    return model.eval()
