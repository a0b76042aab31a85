"""Figures. Each function reads a results table and writes one PNG (Agg backend, no timestamps)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

from lmdecomp.atomic import atomic_path  # noqa: E402

# Fixed metadata keeps PNG bytes identical across runs and machines.
PNG_METADATA = {"Software": "lmdecomp"}


def _save(fig, path: str | Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, metadata=PNG_METADATA, bbox_inches="tight")
    plt.close(fig)


def _heatmap(fig, ax, grid: np.ndarray, names: list[str], title: str, label: str) -> None:
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="#dddddd")  # NaN: no self-fit
    image = ax.imshow(grid, cmap=cmap, vmin=min(0.0, float(np.nanmin(grid))), vmax=1.0)
    for (i, j), value in np.ndenumerate(grid):
        text = "—" if np.isnan(value) else f"{value:.2f}"
        colour = "black" if np.isnan(value) or value >= 0.6 else "white"
        ax.text(j, i, text, ha="center", va="center", color=colour, fontsize=9)
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label=label, shrink=0.8)


def _pair_grid(rows: pl.DataFrame, row_key: str, col_key: str, value: str, names: list[str], symmetric=False):
    index = {n: i for i, n in enumerate(names)}
    grid = np.full((len(names), len(names)), np.nan)
    for r in rows.iter_rows(named=True):
        grid[index[r[row_key]], index[r[col_key]]] = r[value]
        if symmetric:
            grid[index[r[col_key]], index[r[row_key]]] = r[value]
    return grid


def pairwise_heatmap(pairwise: pl.DataFrame, path: str | Path, split: str = "test") -> None:
    """Heatmap of R² with the basis model on rows and the target model on columns."""
    rows = pairwise.filter(pl.col("split") == split)
    names = sorted(set(rows["basis"]) | set(rows["target"]))
    size = 1.2 + 0.9 * len(names)
    fig, ax = plt.subplots(figsize=(size + 1.5, size))
    _heatmap(fig, ax, _pair_grid(rows, "basis", "target", "r2", names), names, f"Pairwise LMD: {split} R²", "R²")
    ax.set_xlabel("target (explained)")
    ax.set_ylabel("basis (explaining)")
    _save(fig, path)


def loo_bars(loo: pl.DataFrame, path: str | Path, split: str = "test") -> None:
    """One bar per target: R² when explained by all other models together, with its bootstrap
    interval when the table has one; the mean dashed."""
    rows = loo.filter(pl.col("split") == split).sort("target")
    names, values = rows["target"].to_list(), rows["r2"].to_numpy()
    fig, ax = plt.subplots(figsize=(1.5 + 0.8 * len(names), 4))
    ax.bar(names, values, color="#4C72B0")
    if "r2_lo" in rows.columns:
        # Drawn as [lo, hi] segments: the interval need not be symmetric about the estimate.
        x = np.arange(len(names))
        ax.vlines(x, rows["r2_lo"].to_numpy(), rows["r2_hi"].to_numpy(), color="#222222", linewidth=2)
        ax.hlines(np.concatenate([rows["r2_lo"].to_numpy(), rows["r2_hi"].to_numpy()]),
                  np.tile(x - 0.12, 2), np.tile(x + 0.12, 2), color="#222222", linewidth=1.5)
    mean = float(np.mean(values))
    ax.axhline(mean, color="#C44E52", linestyle="--", label=f"mean {mean:.3f}")
    for i, v in enumerate(values):
        ax.text(i, v / 2, f"{v:.2f}", ha="center", va="center", color="white", fontsize=9)
    ax.set_ylim(min(0.0, float(values.min()) - 0.05), 1.05)
    ax.set_ylabel(f"{split} R²")
    title = "Leave-one-out LMD: each model from all others"
    if "r2_lo" in rows.columns:
        title += "\n(bars: bootstrap interval)"
    ax.set_title(title)
    ax.tick_params(axis="x", rotation=45)
    ax.legend(loc="upper right")
    _save(fig, path)


def selection_curves(selection: pl.DataFrame, path: str | Path) -> None:
    """Greedy forward selection: val R² (solid) and test R² (dashed) against basis size k."""
    targets = sorted(set(selection["target"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, target in enumerate(targets):
        rows = selection.filter(pl.col("target") == target).sort("k")
        colour = f"C{i % 10}"
        ax.plot(rows["k"], rows["val_r2"], marker="o", color=colour, label=target)
        ax.plot(rows["k"], rows["test_r2"], linestyle="--", color=colour, alpha=0.6)
        if "test_r2_lo" in rows.columns:
            ax.fill_between(rows["k"], rows["test_r2_lo"], rows["test_r2_hi"], color=colour, alpha=0.12, linewidth=0)
        first = rows.row(0, named=True)
        ax.annotate(first["added_model"], (1, first["val_r2"]), fontsize=7, xytext=(4, -3),
                    textcoords="offset points", color=colour)
    ax.set_xlabel("basis models selected (k)")
    ax.set_ylabel("R² (solid: val, dashed: test)")
    ax.set_title("Greedy basis selection per target"
                 + ("\n(bands: bootstrap interval of test R²)" if "test_r2_lo" in selection.columns else ""))
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8, title="target", loc="lower right")
    _save(fig, path)


def layer_curves(layers: pl.DataFrame, path: str | Path, split: str = "test") -> None:
    """Layer-wise leave-one-out R² against relative depth (0 = embeddings, 1 = last layer), one
    line per model, with the bootstrap interval as a band when the table has one."""
    rows = layers.filter(pl.col("split") == split)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, model in enumerate(sorted(set(rows["model"]))):
        r = rows.filter(pl.col("model") == model).sort("relative_depth")
        colour = f"C{i % 10}"
        x = r["relative_depth"].to_numpy()
        deepest = r.row(-1, named=True)  # depth = layer / layers, so layers = layer / depth
        depth = round(deepest["layer"] / deepest["relative_depth"]) if deepest["relative_depth"] > 0 else 0
        ax.plot(x, r["r2"].to_numpy(), marker="o", color=colour, label=f"{model} ({depth} layers)")
        if "r2_lo" in r.columns:
            ax.fill_between(x, r["r2_lo"].to_numpy(), r["r2_hi"].to_numpy(), color=colour, alpha=0.15, linewidth=0)
    ax.set_xlabel("relative depth (hidden state / layers; 0 = embedding output)")
    ax.set_ylabel(f"leave-one-out {split} R²")
    title = "Layer-wise LMD: each layer from the other models at the same relative depth"
    if "r2_lo" in rows.columns:
        title += "\n(bands: bootstrap interval)"
    ax.set_title(title, fontsize=10)
    ax.set_xlim(-0.03, 1.03)
    ax.legend(fontsize=8, loc="best")
    _save(fig, path)


def lmd_vs_similarity(pairwise: pl.DataFrame, similarity: pl.DataFrame, path: str | Path, split: str = "test") -> None:
    """Side by side: LMD pairwise R² (asymmetric: how much of the target the basis explains
    linearly), linear CKA (symmetric) and mutual k-NN alignment (symmetric, local structure)."""
    rows = pairwise.filter(pl.col("split") == split)
    names = sorted(set(rows["basis"]) | set(rows["target"]))
    size = 1.2 + 0.9 * len(names)
    fig, axes = plt.subplots(1, 3, figsize=(3 * (size + 1.4), size), layout="constrained")
    _heatmap(fig, axes[0], _pair_grid(rows, "basis", "target", "r2", names), names,
             "LMD R² (row explains column)", "R²")
    _heatmap(fig, axes[1], _pair_grid(similarity, "a", "b", "cka", names, symmetric=True), names,
             "linear CKA (biased HSIC)", "CKA")
    knn_k = int(similarity["knn_k"][0]) if similarity.height else 0
    _heatmap(fig, axes[2], _pair_grid(similarity, "a", "b", "mutual_knn", names, symmetric=True), names,
             f"mutual {knn_k}-NN alignment", "fraction shared")
    _save(fig, path)


def mpo_tradeoff(tables: dict[str, dict[str, pl.DataFrame]], path: str | Path) -> None:
    """Left: fraction of parameters kept against achieved reconstruction error, summed over the
    targeted layers of each model, one line per model (the budget ladder). Right: the same
    fraction against the val masked-LM loss of the whole truncated model."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
    for i, (name, t) in enumerate(sorted(tables.items())):
        colour = f"C{i % 10}"
        ladder = (t["ladder"].group_by("budget")
                  .agg(pl.col("params").sum(), pl.col("dense_params").sum(),
                       (pl.col("rel_error") ** 2 * pl.col("dense_params")).sum().alias("weighted_sq"))
                  .sort("budget"))
        kept = (ladder["params"] / ladder["dense_params"]).to_numpy()
        error = np.sqrt((ladder["weighted_sq"] / ladder["dense_params"]).to_numpy())
        left.plot(error, kept, marker="o", color=colour, label=name)
        for b, x, y in zip(ladder["budget"], error, kept):
            left.annotate(f"τ={b:g}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        loss = t["loss"].sort("budget")
        right.plot(loss["params"] / loss["dense_params"], loss["val_loss"], marker="s", color=colour, label=name)
    left.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    left.set_xlabel("relative reconstruction error (RMS over layers)")
    left.set_ylabel("parameters kept / dense")
    left.set_title("MPO truncation: parameters vs error")
    right.set_xlabel("parameters kept / dense (targeted layers)")
    right.set_ylabel("val masked-LM loss")
    right.set_title("MPO truncation: parameters vs val loss")
    for ax in (left, right):
        ax.legend(fontsize=8)
    _save(fig, path)


def _claim_title(task: str, claims: pl.DataFrame | None) -> str:
    title = task
    for c in ([] if claims is None else claims.filter(pl.col("task") == task).iter_rows(named=True)):
        title += (f"\n{c['variant']}: {c['points_vs_reference']:+.1f} pts [{c['points_lo']:+.1f}, {c['points_hi']:+.1f}], "
                  f"{c['parameters'] / c['reference_parameters']:.0%} of dense's parameters: {c['verdict']}")
        if c.get("points_vs_ceiling") is not None:
            title += f"; vs deep dense {c['points_vs_ceiling']:+.1f} [{c['ceiling_lo']:+.1f}, {c['ceiling_hi']:+.1f}]"
    return title


def finetune_tradeoff(table: pl.DataFrame, path: str | Path, claims: pl.DataFrame | None = None) -> None:
    """Each task's own test metric (×100, mean over seeds) against parameter count, one panel per
    task, one marker per variant with its bootstrap interval as error bar and the lowest and
    highest seed as small crosses; the dotted line is the dense base's score, the grey band 1 point
    below it. Each panel's title gives every deep variant's paired difference from dense with
    its interval and the verdict (holds / fails / inconclusive)."""
    tasks = sorted(table["task"].unique().to_list())
    fig, axes = plt.subplots(1, len(tasks), figsize=(6.5 * len(tasks), 4.8), layout="constrained", squeeze=False)
    variants = sorted(table["variant"].unique().to_list())
    for ax, task in zip(axes[0], tasks):
        rows = table.filter(pl.col("task") == task)
        dense = rows.filter(pl.col("variant") == "dense")
        if dense.height:
            score = float(dense["test_metric"][0]) * 100
            ax.axhline(score, color="grey", linestyle=":", linewidth=1)
            ax.axhspan(score - 1, score, color="grey", alpha=0.15, linewidth=0)
        for i, variant in enumerate(variants):
            r = rows.filter(pl.col("variant") == variant)
            if not r.height:
                continue
            x, y = float(r["parameters"][0]), 100 * float(r["test_metric"][0])
            err = [[y - 100 * float(r["test_metric_lo"][0])], [100 * float(r["test_metric_hi"][0]) - y]]
            ax.errorbar([x], [y], yerr=err, fmt="o", color=f"C{i % 10}", capsize=4, markersize=6,
                        label=f"{variant} ({r['layers'][0]} layers, {r['seeds'][0]} seeds)")
            ax.scatter([x, x], [100 * float(r["seed_min"][0]), 100 * float(r["seed_max"][0])], marker="x", s=22, color=f"C{i % 10}")
        ax.set_xlabel("parameters (encoder + head)")
        ax.set_ylabel(f"test {rows['metric'][0]} × 100 (mean over seeds)")
        ax.set_title(_claim_title(task, claims), fontsize=8)
        ax.legend(fontsize=8, title=f"bars: {rows['ci_level'][0]:.0%} bootstrap interval; x: lowest and highest seed", title_fontsize=8)
    _save(fig, path)
