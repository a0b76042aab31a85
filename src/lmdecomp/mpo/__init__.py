"""Matrix Product Operators (MPO) and MPOBERT (arXiv 2303.16753): weight matrices as chains of
small cores, and deeper models that share a central tensor across layers.

* :mod:`~lmdecomp.mpo.decompose` — the decomposition of one matrix (:func:`mpo_decompose`);
* :mod:`~lmdecomp.mpo.layer` — the trainable layer (:class:`MPOLinear`);
* :mod:`~lmdecomp.mpo.convert` — a Hugging Face model's linear layers converted, saved, loaded;
* :mod:`~lmdecomp.mpo.compression` — the error / parameter / loss ladder of a model;
* :mod:`~lmdecomp.mpo.mpobert` — the MPOBERT builder (:func:`~lmdecomp.mpo.mpobert.build`);
* :mod:`~lmdecomp.mpo.variants` — the models fine-tuning compares (dense, MPO, MPOBERT, ALBERT);
* :mod:`~lmdecomp.mpo.finetune` — fine-tuning a variant on a labelled task.

The names below are the decomposition's public API (``from lmdecomp import mpo``); the
modules after it are imported from their modules.
"""

from lmdecomp.mpo.convert import (
    ALIASES_KEY,
    DEFAULT_TARGETS,
    LAYOUT_FILE,
    WEIGHTS_FILE,
    apply_layout,
    convert_linears,
    find_linears,
    load_converted,
    load_weights,
    match_saved_dtype,
    mpo_layout,
    save_converted,
    save_weights,
)
from lmdecomp.mpo.decompose import MPO, contract_cores, factorize, mpo_decompose
from lmdecomp.mpo.layer import MPOLinear

__all__ = [
    "ALIASES_KEY", "DEFAULT_TARGETS", "LAYOUT_FILE", "MPO", "MPOLinear", "WEIGHTS_FILE", "apply_layout",
    "contract_cores", "convert_linears", "factorize", "find_linears", "load_converted", "load_weights",
    "match_saved_dtype", "mpo_decompose", "mpo_layout", "save_converted", "save_weights",
]
