"""Figures. Each function reads a results table and writes one PNG (Agg backend, no timestamps)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from .atomic import atomic_path  # noqa: E402

# Fixed metadata keeps PNG bytes identical across runs and machines.
PNG_METADATA = {"Software": "lmdecomp"}


def _save(fig, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, metadata=PNG_METADATA, bbox_inches="tight")
    plt.close(fig)


def pairwise_heatmap(pairwise: pl.DataFrame, path: str | Path, split: str = "test") -> None:
    """Heatmap of R² with the basis model on rows and the target model on columns."""
    rows = pairwise.filter(pl.col("split") == split)
    names = sorted(set(rows["basis"]) | set(rows["target"]))
    index = {n: i for i, n in enumerate(names)}
    grid = np.full((len(names), len(names)), np.nan)
    for r in rows.iter_rows(named=True):
        grid[index[r["basis"]], index[r["target"]]] = r["r2"]
    size = 1.2 + 0.9 * len(names)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")  # the diagonal: no self-fit
    image = ax.imshow(grid, cmap=cmap, vmin=min(0.0, np.nanmin(grid)), vmax=1.0)
    for (i, j), value in np.ndenumerate(grid):
        text = "—" if np.isnan(value) else f"{value:.2f}"
        colour = "black" if np.isnan(value) or value >= 0.6 else "white"
        ax.text(j, i, text, ha="center", va="center", color=colour, fontsize=9)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("target (explained)")
    ax.set_ylabel("basis (explaining)")
    ax.set_title(f"Pairwise LMD: {split} R²")
    fig.colorbar(image, ax=ax, label="R²")
    _save(fig, path)


def loo_bars(loo: pl.DataFrame, path: str | Path, split: str = "test") -> None:
    """One bar per target: R² when explained by all other models together; the mean dashed."""
    rows = loo.filter(pl.col("split") == split).sort("target")
    names, values = rows["target"].to_list(), rows["r2"].to_numpy()
    fig, ax = plt.subplots(figsize=(1.5 + 0.8 * len(names), 4))
    ax.bar(names, values, color="#4C72B0")
    mean = float(np.mean(values))
    ax.axhline(mean, color="#C44E52", linestyle="--", label=f"mean {mean:.3f}")
    for i, v in enumerate(values):
        ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=9)
    ax.set_ylim(min(0.0, float(values.min()) - 0.05), 1.05)
    ax.set_ylabel(f"{split} R²")
    ax.set_title("Leave-one-out LMD: each model from all others")
    ax.tick_params(axis="x", rotation=45)
    ax.legend(loc="upper right")
    _save(fig, path)
