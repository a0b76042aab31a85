"""Language Model Decomposition (LMD, arXiv 2210.10289) from streaming moments.

One pass over the embedding shards of all models accumulates, per split and in float64,
the joint sufficient statistics of the concatenated embeddings x = [x_1 | … | x_M]:

    n = Σ 1,   s = Σ x,   C = Σ x xᵀ           (:class:`Moments`)

Any fit of a target model u on a basis z (one model, or all others concatenated) is
then solved from blocks of those statistics without re-reading embeddings. With the
centred scatter S = C − n·μμᵀ (μ = s/n) on the train split:

    W = S_uz (S_zz + λ n I)⁻¹,   b = μ_u − W μ_z,   λ = α · tr(S_zz) / (n · p)

i.e. the paper's W = Cov(u,z)(Cov(z,z) + λI)⁻¹ with the ridge λ expressed relative to the
mean variance of the p basis dimensions, so one α suits models of any scale (α = 0 is
ordinary least squares). Goodness of fit on a split s, pooled over target dimensions, with
ū_s the mean of the split being scored:

    R² = 1 − Σ‖u − Wz − b‖² / Σ‖u − ū_s‖²
    Σ‖u − Wz − b‖² = tr S_uu − 2 tr(W S_zu) + tr(W S_zz Wᵀ) + n_s ‖μ_u − W μ_z − b‖²

(all statistics of split s; the cross terms vanish because centred sums are zero).
Moments are additive, so shards can be reduced in any order or in parallel jobs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from . import shards
from .atomic import atomic_path

SPLITS = ("train", "val", "test")


class LMDError(ValueError):
    """Embeddings or settings that cannot give a well-posed fit."""


def blas_threads(threads: int):
    """Pin the BLAS thread count: a reduction split over a different number of threads
    rounds differently, and artifacts must not depend on how many cores a job was given
    (Snakemake sets OMP_NUM_THREADS per job, DVC does not)."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=max(1, int(threads)), user_api="blas")


@dataclass
class Moments:
    """Joint float64 moments (count, sum, cross-product) of several models' embeddings per split."""

    names: list[str]
    dims: list[int]
    n: dict[str, int] = field(default_factory=dict)
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    cross: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        width = sum(self.dims)
        for split in SPLITS:
            self.n.setdefault(split, 0)
            self.sums.setdefault(split, np.zeros(width))
            self.cross.setdefault(split, np.zeros((width, width)))

    @property
    def width(self) -> int:
        return sum(self.dims)

    def columns(self, names: Iterable[str]) -> np.ndarray:
        """Column indices of the named models' blocks, in the order given."""
        starts = np.cumsum([0, *self.dims])
        index = {name: i for i, name in enumerate(self.names)}
        return np.concatenate([np.arange(starts[index[n]], starts[index[n] + 1]) for n in names])

    def update(self, split: str, x: np.ndarray) -> None:
        """Add rows ``x`` (rows × width) of one split."""
        x = np.asarray(x, dtype=np.float64)
        self.n[split] += x.shape[0]
        self.sums[split] += x.sum(axis=0)
        self.cross[split] += x.T @ x

    def merge(self, other: "Moments") -> "Moments":
        if other.names != self.names or other.dims != self.dims:
            raise LMDError("cannot merge moments of different model sets")
        for split in SPLITS:
            self.n[split] += other.n[split]
            self.sums[split] += other.sums[split]
            self.cross[split] += other.cross[split]
        return self

    def centred(self, split: str) -> tuple[int, np.ndarray, np.ndarray]:
        """(n, mean μ, scatter S = C − n μμᵀ) of one split."""
        n = self.n[split]
        if n == 0:
            raise LMDError(f"the {split} split is empty: no rows to fit or score")
        mean = self.sums[split] / n
        return n, mean, self.cross[split] - n * np.outer(mean, mean)

    def save(self, path: str | Path) -> None:
        from safetensors.numpy import save_file

        tensors = {}
        for split in SPLITS:
            tensors[f"{split}.n"] = np.array([self.n[split]], dtype=np.int64)
            tensors[f"{split}.sum"] = self.sums[split]
            tensors[f"{split}.cross"] = self.cross[split]
        # One metadata key only: safetensors keeps metadata in a hash map whose order varies
        # between processes, and the file bytes must not.
        meta = {"layout": json.dumps({"names": self.names, "dims": self.dims})}
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=meta)

    @classmethod
    def load(cls, path: str | Path) -> "Moments":
        from safetensors import safe_open

        with safe_open(str(path), framework="numpy") as fh:
            layout = json.loads(fh.metadata()["layout"])
            m = cls(layout["names"], layout["dims"])
            for split in SPLITS:
                m.n[split] = int(fh.get_tensor(f"{split}.n")[0])
                m.sums[split] = fh.get_tensor(f"{split}.sum")
                m.cross[split] = fh.get_tensor(f"{split}.cross")
        return m


def accumulate_moments(folders: Mapping[str, str | Path], progress: bool = False) -> Moments:
    """One streaming pass over the shards of all models, aligned on seq_id, into :class:`Moments`."""
    from tqdm.auto import tqdm

    names = list(folders)
    manifests = {name: shards.read_manifest(folders[name]) for name in names}
    layouts = {name: [e["rows"] for e in m["shards"]] for name, m in manifests.items()}
    first = names[0]
    for name in names[1:]:
        if layouts[name] != layouts[first]:
            raise LMDError(
                f"models {first!r} and {name!r} were embedded with different shard layouts "
                f"({len(layouts[first])} vs {len(layouts[name])} shards); embed both from the same "
                "sequences.parquet with the same embed.shard_rows"
            )
    moments = Moments(names, [int(manifests[n]["dim"]) for n in names])
    readers = [shards.iter_shards(folders[name]) for name in names]
    total = len(layouts[first])
    for parts in tqdm(zip(*readers), total=total, desc="moments", unit="shard", disable=not progress):
        ids = parts[0].seq_id
        for name, part in zip(names[1:], parts[1:]):
            if not np.array_equal(part.seq_id, ids):
                raise LMDError(
                    f"models {first!r} and {name!r} have different seq_id sets in the same shard; "
                    "re-embed both from the same sequences.parquet"
                )
        x = np.concatenate([p.embedding.astype(np.float64) for p in parts], axis=1)
        split = parts[0].split
        for s in SPLITS:
            mask = split == s
            if mask.any():
                moments.update(s, x[mask])
    return moments


@dataclass(frozen=True)
class RidgeFit:
    """u ≈ W z + b, fitted on the train split."""

    basis: tuple[str, ...]
    target: str
    alpha: float
    weight: np.ndarray  # (target dim, basis dim)
    bias: np.ndarray  # (target dim,)


def fit_ridge(moments: Moments, basis: Sequence[str], target: str, alpha: float) -> RidgeFit:
    """Closed-form ridge fit of ``target`` on the concatenated ``basis`` from train moments."""
    if target in basis:
        raise LMDError(f"target {target!r} cannot be part of its own basis")
    zi, ui = moments.columns(basis), moments.columns([target])
    n, mean, scatter = moments.centred("train")
    p = len(zi)
    if alpha == 0 and n <= p:
        raise LMDError(
            f"fit of {target!r} on {list(basis)}: {n} train rows for a basis {p} wide; ordinary least "
            "squares needs more rows than basis dimensions: add sequences or set lmd.alpha > 0"
        )
    s_zz = scatter[np.ix_(zi, zi)]
    s_zu = scatter[np.ix_(zi, ui)]
    ridge = alpha * np.trace(s_zz) / p
    try:
        weight_t = np.linalg.solve(s_zz + ridge * np.eye(p), s_zu)
    except np.linalg.LinAlgError as exc:
        raise LMDError(
            f"fit of {target!r} on {list(basis)}: the basis covariance is singular; set lmd.alpha > 0"
        ) from exc
    weight = weight_t.T
    bias = mean[ui] - weight @ mean[zi]
    return RidgeFit(tuple(basis), target, float(alpha), weight, bias)


def r_squared(moments: Moments, fit: RidgeFit, split: str) -> float:
    """Pooled R² of ``fit`` on ``split``, from that split's moments (formula in the module doc)."""
    zi, ui = moments.columns(fit.basis), moments.columns([fit.target])
    n, mean, scatter = moments.centred(split)
    s_uu = scatter[np.ix_(ui, ui)]
    s_zu = scatter[np.ix_(zi, ui)]
    s_zz = scatter[np.ix_(zi, zi)]
    w = fit.weight
    offset = mean[ui] - w @ mean[zi] - fit.bias
    sse = np.trace(s_uu) - 2.0 * np.sum(w * s_zu.T) + np.sum((w @ s_zz) * w) + n * offset @ offset
    sst = np.trace(s_uu)
    if sst <= 0:
        raise LMDError(f"target {fit.target!r} has zero variance on the {split} split")
    return float(1.0 - sse / sst)


def fit_pairwise(moments: Moments, alpha: float) -> list[dict]:
    """Every ordered pair (basis → target), fitted on train, scored on every split."""
    rows = []
    for target in moments.names:
        for basis in moments.names:
            if basis == target:
                continue
            fit = fit_ridge(moments, [basis], target, alpha)
            for split in SPLITS:
                rows.append({"basis": basis, "target": target, "split": split,
                             "r2": r_squared(moments, fit, split), "alpha": float(alpha)})
    return rows


def fit_leave_one_out(moments: Moments, alpha: float) -> list[dict]:
    """Each target on all other models concatenated, fitted on train, scored on every split."""
    rows = []
    for target in moments.names:
        basis = [n for n in moments.names if n != target]
        fit = fit_ridge(moments, basis, target, alpha)
        for split in SPLITS:
            rows.append({"target": target, "split": split,
                         "r2": r_squared(moments, fit, split), "alpha": float(alpha)})
    return rows


def summary_metrics(pairwise: list[dict], loo: list[dict]) -> dict:
    """The DVC metrics: mean and per-model leave-one-out test R², mean pairwise test R²."""
    loo_test = {r["target"]: r["r2"] for r in loo if r["split"] == "test"}
    pair_test = [r["r2"] for r in pairwise if r["split"] == "test"]
    return {
        "loo_test_r2_mean": float(np.mean(list(loo_test.values()))),
        "loo_test_r2": dict(sorted(loo_test.items())),
        "pairwise_test_r2_mean": float(np.mean(pair_test)) if pair_test else None,
    }
