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
import os

# numpy and scipy each bundle their own OpenBLAS, and after every call each library's idle threads
# spin for 2^28 cycles (~0.07 s here) before they sleep. The LMD fits alternate between the two (scipy's
# Cholesky and dsyrk, and until 2026-12-07 dtrmm; numpy's matmul), so every call ran beside the
# other library's spinning threads on the same cores. 2^20 cycles (~0.3 ms) still covers back-to-back calls; measured
# 2026-12-06 (AMD EPYC, 2 threads, 12 models × 768): pairwise fits 5.6 → 4.3 s, leave-one-out
# 26.9 → 24.7 s, the same bits (docs/performance.md). OpenBLAS reads it when it loads: scipy's
# loads after this import in every entry point, numpy's only where lmdecomp is imported first
# (and in every Snakemake job, whose scripts inherit the variable from the snakemake process).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "20")

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
