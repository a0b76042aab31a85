"""Layer-wise LMD: how well each layer of each model is explained by the other models.

Models differ in depth (MiniLM has 6 layers, the zoo 2), so layers are matched by *relative
depth* δ = k / L (hidden state k of a model with L layers; 0 = the embedding output, 1 = the
last layer). The leave-one-out fit of layer k of model m uses as basis, for every other model
m′, its stored hidden state nearest to the same relative depth:

    basis(m, k) = [ (m′, argmin_j |j/L_m′ − k/L_m|)  for m′ ≠ m ]    (ties: the shallower j)

Every (model, layer) column is one "model" of :class:`lmdecomp.Moments`; α is chosen on
val per fit as in the main LMD. Moments grow with the square of their width, and all layers of
the paper's 12 models are 12 × 13 × 768 ≈ 120k columns, so :func:`layer_lmd` streams the
shards once per relative depth, with only the columns that the fits at that depth use
(≈ one layer per model: 9,216 columns there), and bootstraps those fits from the same pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from lmdecomp.data import shards
from lmdecomp.lmd import (
    SPLITS,
    LMDError,
    Moments,
    accumulate_block_moments,
    accumulate_moments,
    add_confidence_intervals,
    fit_with_alpha,
    r_squared,
    warn_if_alpha_at_grid_edge,
)


@dataclass(frozen=True)
class LayerColumn:
    """One stored hidden state of one model."""

    model: str
    layer: int  # hidden-state index, 0 = embeddings
    depth: float  # layer / num_hidden_layers
    folder: Path
    column: str

    @property
    def name(self) -> str:
        return f"{self.model}@{self.layer}"


def layer_columns(folders: Mapping[str, str | Path]) -> list[LayerColumn]:
    """Every stored hidden state of every model (``embed.layers``), in model then layer order."""
    out = []
    for model, folder in folders.items():
        if "," in model:  # fit rows store a basis comma-joined (the schema's name pattern forbids it too)
            raise LMDError(f"model name {model!r} contains ','; rename it under models: in the config")
        manifest = shards.read_manifest(folder)
        depth = manifest.get("num_hidden_layers")
        if not depth:
            raise LMDError(f"{folder}: the manifest has no num_hidden_layers; re-embed {model!r}")
        for k in manifest.get("layers", [manifest["layer"]]):
            out.append(LayerColumn(model, k, k / depth, Path(folder), shards.layer_column(manifest, k)))
    return out


def nearest(columns: Sequence[LayerColumn], model: str, depth: float) -> LayerColumn:
    """The stored layer of ``model`` nearest to relative depth ``depth`` (the shallower on ties)."""
    own = [c for c in columns if c.model == model]
    return min(own, key=lambda c: (round(abs(c.depth - depth), 12), c.layer))


def bases(columns: Sequence[LayerColumn]) -> dict[str, list[str]]:
    """Leave-one-out basis of every layer column: the other models at the nearest relative depth."""
    models = list(dict.fromkeys(c.model for c in columns))
    if len(models) < 2:
        raise LMDError(f"LMD needs at least two models for layer-wise fits; the layer columns are all of "
                           f"{models}: list two or more models under models: in the config")
    return {c.name: [nearest(columns, m, c.depth).name for m in models if m != c.model] for c in columns}


def sources(columns: Sequence[LayerColumn]) -> dict[str, tuple[Path, str]]:
    """The (folder, column) of each layer column, as :func:`lmdecomp.lmd.aligned_shards` takes them."""
    return {c.name: (c.folder, c.column) for c in columns}


def fit_layers(moments: Moments, columns: Sequence[LayerColumn], alpha,
               targets: Sequence[str] | None = None) -> list[dict]:
    """Leave-one-out fit of every layer column (or of the named ``targets``) on its
    :func:`bases`, from ``moments`` that hold those columns; R² on every split.

    Rows: model, layer, relative_depth, target, basis (comma-joined column names, for the table
    only: code takes a basis from :func:`bases`, never by splitting it), split, r2, alpha."""
    rows = []
    chosen: dict[str, float] = {}
    basis_of = bases(columns)
    for c in columns:
        if targets is not None and c.name not in targets:
            continue
        fit = fit_with_alpha(moments, basis_of[c.name], c.name, alpha, warn_edge=False)  # warned below
        chosen[c.name] = fit.alpha
        for split in SPLITS:
            rows.append({"model": c.model, "layer": c.layer, "relative_depth": c.depth, "target": c.name,
                         "basis": ",".join(basis_of[c.name]), "split": split,
                         "r2": r_squared(moments, fit, split), "alpha": fit.alpha})
    warn_if_alpha_at_grid_edge(alpha, chosen, "layer-wise fits")
    return rows


def layer_lmd(
    columns: Sequence[LayerColumn], alpha, rows_per_block: int | None = None, n_boot: int = 0,
    level: float = 0.9, seed: int = 0, progress: bool = False,
) -> list[dict]:
    """:func:`fit_layers` rows for every layer column, one streaming pass per relative depth
    (module doc); with ``n_boot`` > 0 the pass keeps block moments of ``rows_per_block``
    sequences and every row gets its bootstrap interval ``r2_lo``/``r2_hi``
    (:func:`lmdecomp.add_confidence_intervals`). Rows in ``columns`` order."""
    basis_of = bases(columns)
    by_name = {c.name: c for c in columns}
    rows: dict[str, list[dict]] = {}
    for depth in sorted({round(c.depth, 12) for c in columns}):
        targets = [c.name for c in columns if round(c.depth, 12) == depth]
        needed = list(dict.fromkeys(n for t in targets for n in [t, *basis_of[t]]))
        srcs = {n: (by_name[n].folder, by_name[n].column) for n in needed}
        if n_boot > 0:
            blocks = accumulate_block_moments(srcs, rows_per_block=rows_per_block, progress=progress)
            moments = blocks.total()
        else:
            moments = accumulate_moments(srcs, progress=progress)
        at_depth = [by_name[n] for n in needed]
        fitted = fit_layers(moments, at_depth, alpha, targets=targets)
        if n_boot > 0:
            # each row's basis as a list, as fit_layers chose it (not split back from the joined string)
            fitted = add_confidence_intervals(fitted, blocks, n_boot=n_boot, level=level, seed=seed,
                                                  basis_of=lambda r, b=bases(at_depth): b[r["target"]])
        for row in fitted:
            rows.setdefault(row["target"], []).append(row)
    return [row for c in columns for row in rows[c.name]]
