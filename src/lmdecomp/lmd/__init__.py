"""Language Model Decomposition (LMD, arXiv 2210.10289): each model's embeddings as a
closed-form ridge regression on other models' embeddings, from streaming moments.

One concept per module, in the order the pipeline uses them:

* :mod:`~lmdecomp.lmd.moments` — joint count, sum and cross-product per split (:class:`Moments`);
* :mod:`~lmdecomp.lmd.stream` — the pass over all models' shards, aligned row by row;
* :mod:`~lmdecomp.lmd.fits` — ridge and pairwise fits, R² on held-out splits;
* :mod:`~lmdecomp.lmd.alpha` — one α or a grid chosen on val;
* :mod:`~lmdecomp.lmd.loo` — leave-one-out fits from one joint inverse;
* :mod:`~lmdecomp.lmd.blocks` and :mod:`~lmdecomp.lmd.memory` — moments per block of sequences;
* :mod:`~lmdecomp.lmd.bootstrap` — block-bootstrap intervals;
* :mod:`~lmdecomp.lmd.selection` — greedy forward basis selection;
* :mod:`~lmdecomp.lmd.layers` (layer-wise LMD) and :mod:`~lmdecomp.lmd.similarity` (CKA, mutual
  k-NN) build on those and are imported from their modules.

The names below are the subpackage's public API (``from lmdecomp import lmd; lmd.fit_pairwise``).
"""

from lmdecomp.lmd.alpha import warn_if_alpha_at_grid_edge
from lmdecomp.lmd.blocks import (
    BlockMoments,
    accumulate_block_moments,
    reduce_block_moments,
    rows_per_block,
)
from lmdecomp.lmd.bootstrap import (
    BootstrapCache,
    add_confidence_intervals,
    add_selection_intervals,
    bootstrap_r2,
    bootstrap_r2_samples,
    bootstrap_weights,
    centred_interval,
)
from lmdecomp.lmd.errors import AlphaGridEdgeWarning, LMDError
from lmdecomp.lmd.fits import (
    RidgeFit,
    fit_pairwise,
    fit_ridge,
    fit_targets,
    fit_with_alpha,
    r_squared,
    ridge_penalty,
    select_alpha,
)
from lmdecomp.lmd.loo import fit_leave_one_out, summary_metrics
from lmdecomp.lmd.memory import available_memory_bytes, check_block_memory
from lmdecomp.lmd.moments import SPLITS, Moments, blas_threads, reduce_moments
from lmdecomp.lmd.selection import greedy_selection
from lmdecomp.lmd.stream import (
    AlignedShards,
    ShardGroup,
    accumulate_moments,
    aligned_shards,
)

__all__ = [
    "SPLITS", "AlignedShards", "AlphaGridEdgeWarning", "BlockMoments", "BootstrapCache", "LMDError", "Moments",
    "RidgeFit", "ShardGroup", "accumulate_block_moments", "accumulate_moments", "add_confidence_intervals",
    "add_selection_intervals", "aligned_shards", "available_memory_bytes", "blas_threads", "bootstrap_r2",
    "bootstrap_r2_samples", "bootstrap_weights", "centred_interval", "check_block_memory", "fit_leave_one_out",
    "fit_pairwise", "fit_ridge", "fit_targets", "fit_with_alpha", "greedy_selection", "r_squared",
    "reduce_block_moments", "reduce_moments", "ridge_penalty", "rows_per_block", "select_alpha", "summary_metrics",
    "warn_if_alpha_at_grid_edge",
]
