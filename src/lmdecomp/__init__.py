"""lmdecomp: decompose language models across models (LMD) and within a model (MPO).

The public API, imported on first use (so ``import lmdecomp.atomic`` does not load torch):

* :func:`decompose` — LMD on arrays (:mod:`lmdecomp.api`);
* :class:`MPOLinear` — ``MPOLinear.from_linear(nn.Linear, max_bond=…)`` (:mod:`lmdecomp.mpo.layer`);
* :func:`build_mpobert` — a deeper model sharing central tensors, from a trained base
  (:func:`lmdecomp.mpo.mpobert.build`), with its :class:`MPOBertConfig`.

The two halves live in :mod:`lmdecomp.lmd` and :mod:`lmdecomp.mpo`, the data side in
:mod:`lmdecomp.data` and the model side in :mod:`lmdecomp.models` (docs/architecture.md).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_LAZY = {
    "decompose": ("lmdecomp.api", "decompose"),
    "Decomposition": ("lmdecomp.api", "Decomposition"),
    "MPOLinear": ("lmdecomp.mpo.layer", "MPOLinear"),
    "build_mpobert": ("lmdecomp.mpo.mpobert", "build"),
    "MPOBertConfig": ("lmdecomp.mpo.mpobert", "MPOBertConfig"),
}
__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'lmdecomp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
