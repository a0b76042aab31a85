"""Block-bootstrap intervals of LMD R²: a replicate is a multinomial-weighted sum of block
moments, refitted on its train split and scored on its held-out splits; intervals are
re-centred on the full-data estimate (:func:`centred_interval`)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from lmdecomp.lmd.alpha import _alpha_grid
from lmdecomp.lmd.blocks import BlockMoments
from lmdecomp.lmd.errors import LMDError
from lmdecomp.lmd.fits import (
    _check_basis,
    _check_basis_variance,
    fit_ridge,
    r_squared,
    ridge_penalty,
)
from lmdecomp.lmd.moments import SPLITS, Moments, _check_split, _sub
from lmdecomp.lmd import nested

# Bootstrap replicates are processed in chunks whose (chunk, w, w) float64 scatter is at most this
# many bytes; two such arrays are alive at once (see bootstrap_r2_samples). The chunk size does not
# change any replicate's numbers.
_BOOTSTRAP_ARRAY_BYTES = 128e6
# A selection path's chunk holds four such arrays (the train scatter, its factor and two held-out
# scatters) against bootstrap_r2_samples' two, so its arrays get half the bytes.
_PATH_ARRAY_BYTES = _BOOTSTRAP_ARRAY_BYTES / 2


def bootstrap_weights(n_blocks: int, n_boot: int, seed: int = 0) -> np.ndarray:
    """(n_boot, n_blocks) int multiplicities: each row draws n_blocks blocks with replacement."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_blocks, np.full(n_blocks, 1.0 / n_blocks), size=n_boot)


def bootstrap_r2_samples(
    blocks: "BlockMoments | Sequence[Moments]",
    basis: Sequence[str],
    target: str,
    alpha: float,
    n_boot: int = 200,
    seed: int = 0,
    split: "str | Sequence[str]" = "test",
) -> "np.ndarray | dict[str, np.ndarray]":
    """(n_boot,) bootstrap replicates of the ``split`` R² of the ridge fit of ``target`` on ``basis``
    (or, for a list of splits, {split: replicates}, sharing each replicate's train refit).

    Replicate r resamples blocks with replacement (multiplicities w_r from
    :func:`bootstrap_weights`, the same for every split, since a block is a unit of sequences),
    refits on the train moments Σ_b w_rb M_b^train and scores on Σ_b w_rb M_b^split — exactly
    the fit and R² of :func:`fit_ridge` / :func:`r_squared` on the resampled sequences.
    A replicate with an empty split or a singular fit is an error (use larger blocks or α > 0);
    at α = 0 so is one with no more distinct train rows than basis columns.

    Only the blocks a fit reads are gathered and weighted: C_zz, C_zu and the diagonal of C_uu
    (tr S_uu), not the whole (p + q)² cross-product.

    Memory, for w = p + q the basis + target width, B blocks and R = 16e6 / w² replicates per
    chunk (so that one (R, w, w) float64 array would be ≤ 128 MB, ``_BOOTSTRAP_ARRAY_BYTES``):
    the gathered blocks, B · (p² + pq + q) · 8 bytes per split used (train included), plus per
    chunk the train and one held-out split's S_zz and S_zu (each pair < one (R, w, w) array) and
    up to four (R, p, q) products (each ≤ ¼ of one, as pq ≤ w²/4): < 3 × 128 MB beyond the
    gathered blocks (tests/lmd/test_bootstrap.py holds the bound).
    """
    if _alpha_grid(alpha) is not None:
        raise LMDError("bootstrap_r2 takes one α; pass the α chosen on the full data (the fit row's alpha)")
    alpha = float(alpha)
    _check_basis(basis, [target])
    if not isinstance(blocks, BlockMoments):
        blocks = BlockMoments.from_moments(list(blocks))
    splits = [split] if isinstance(split, str) else list(split)
    for s in splits:
        _check_split(s)
    if n_boot < 1:
        raise LMDError(f"n_boot must be at least 1 (got {n_boot}); set lmd.bootstrap to 0 for no intervals")
    cols = np.concatenate([blocks.columns(basis), blocks.columns([target])])
    p, w = len(blocks.columns(basis)), len(cols)
    basis_dims = [blocks.dims[blocks.names.index(b)] for b in basis]
    _check_full_data_basis_variance(blocks, basis, basis_dims, cols[:p])
    weights = bootstrap_weights(len(blocks), n_boot, seed).astype(np.float64)
    stats = {s: _gathered_split(blocks, s, cols, p) for s in dict.fromkeys(["train", *splits])}

    out = {s: np.empty(n_boot) for s in splits}
    # the chunk bounds the (chunk, w, w) arrays alive at once; it changes no replicate's numbers
    chunk = max(1, int(_BOOTSTRAP_ARRAY_BYTES // (8 * w * w)))
    for lo in range(0, n_boot, chunk):
        r2 = _chunk_r2(stats, weights[lo:lo + chunk], splits, p, w, basis_dims, alpha, basis, target)
        for s in splits:
            out[s][lo:lo + chunk] = r2[s]
    _check_replicates_finite(out, basis, target, n_boot)
    return out[split] if isinstance(split, str) else out


def _check_full_data_basis_variance(blocks: BlockMoments, basis: Sequence[str], basis_dims: Sequence[int],
                                    zcols: np.ndarray) -> None:
    """Refuse a basis model that is constant on the full data's train split: it fails every
    replicate the same way, so it is refused once, up front (nothing to check if the train split
    is empty)."""
    n_all = blocks.n[:, 0].sum()
    if n_all > 0:
        sum_all = blocks.sums[:, 0][:, zcols].sum(axis=0)
        square_all = blocks.cross[:, 0][:, zcols, zcols].sum(axis=0)  # diagonal of Σ_b C_b
        _check_basis_variance(basis, basis_dims, square_all - sum_all**2 / n_all, square_all)


def _gather(cross_k: np.ndarray, rows: np.ndarray, columns: np.ndarray, n_blocks: int) -> np.ndarray:
    """(B, len(rows) · len(columns)) of cross_k (B, W, W), copied model block by model block."""
    return np.ascontiguousarray(_sub(cross_k, rows, columns, max_runs=np.inf)).reshape(n_blocks, -1)


def _gathered_split(blocks: BlockMoments, split: str, cols: np.ndarray, p: int) -> tuple[np.ndarray, ...]:
    """Per-block (n, s, C_zz, C_zu, diag C_uu) of ``split`` for the basis columns z = cols[:p] and the
    target's u = cols[p:]: only what a fit and its score use, not the whole (p + q)² cross-product
    (the gathered blocks are the bootstrap's largest memory)."""
    zcols, ucols = cols[:p], cols[p:]
    k = SPLITS.index(split)
    cross_k = blocks.cross[:, k]
    n_blocks = len(blocks)
    return (blocks.n[:, k].astype(np.float64), blocks.sums[:, k][:, cols], _gather(cross_k, zcols, zcols, n_blocks),
            _gather(cross_k, zcols, ucols, n_blocks), np.diagonal(cross_k, axis1=1, axis2=2)[:, ucols])


def _replicate_moments(stats: tuple[np.ndarray, ...], wts: np.ndarray, p: int, w: int) -> tuple[np.ndarray, ...]:
    """(n, μ, S_zz, S_zu, tr S_uu) of each replicate (rows of ``wts``): weighted sums of the
    gathered blocks ``stats`` of one split (:func:`_gathered_split`), centred."""
    zi, ui = np.arange(p), np.arange(p, w)
    n_b, s_b, zz_b, zu_b, uu_b = stats
    n = wts @ n_b
    with np.errstate(divide="ignore", invalid="ignore"):  # an empty split: its R² is NaN (_score_split)
        mean = (wts @ s_b) / n[:, None]
    n_mean = n[:, None] * mean
    s_zz = (wts @ zz_b).reshape(len(wts), p, p)
    s_zu = (wts @ zu_b).reshape(len(wts), p, w - p)
    for r in range(len(wts)):  # S = C − (n μ) μᵀ in place, one replicate at a time
        s_zz[r] -= np.multiply.outer(n_mean[r, zi], mean[r, zi])
        s_zu[r] -= np.multiply.outer(n_mean[r, zi], mean[r, ui])
    tr_uu = wts @ uu_b.sum(axis=1) - np.sum(n_mean[:, ui] * mean[:, ui], axis=1)
    return n, mean, s_zz, s_zu, tr_uu


def _chunk_r2(stats: dict[str, tuple[np.ndarray, ...]], wts: np.ndarray, splits: Sequence[str], p: int, w: int,
              basis_dims: Sequence[int], alpha: float, basis: Sequence[str], target: str) -> dict[str, np.ndarray]:
    """{split: (R,) R²} of the replicates of one chunk (rows of ``wts``): one train refit each,
    scored on every split; NaN marks a replicate that has no valid score."""
    train = _replicate_moments(stats["train"], wts, p, w)
    # least squares needs more distinct train rows than basis columns: a replicate repeats
    # blocks, so it holds fewer distinct rows than its weighted count n_t
    distinct_t = (wts > 0) @ stats["train"][0]
    weight_t, bias = _refit_train(train, p, basis_dims, alpha, basis, target)
    r2 = {}
    for s in splits:
        # a held-out split's scatter is built in the call, so it is freed before the next split's
        r2[s] = _score_split(train if s == "train" else _replicate_moments(stats[s], wts, p, w), weight_t, bias,
                             distinct_t, p, alpha)
    return r2


def _refit_train(train: tuple[np.ndarray, ...], p: int, basis_dims: Sequence[int], alpha: float,
                 basis: Sequence[str], target: str) -> tuple[np.ndarray, np.ndarray]:
    """(R, p, q) ridge weights and (R, q) intercepts of each replicate's train moments ``train``
    (:func:`_replicate_moments`), with the λ of :func:`ridge_penalty` on each replicate's own S_zz,
    by LU (:func:`_lu_refit`): for a single fit no faster by Cholesky here (numpy's batched
    factorisations; measured)."""
    _, mu_t, s_zz, s_zu, _ = train
    zi, ui = np.arange(p), np.arange(p, mu_t.shape[1])
    weight_t = _lu_refit(s_zz, s_zu, basis_dims, alpha, basis, target)
    bias = mu_t[:, ui] - (mu_t[:, None, zi] @ weight_t)[:, 0]
    return weight_t, bias


def _lu_refit(s_zz: np.ndarray, s_zu: np.ndarray, basis_dims: Sequence[int], alpha: float,
              basis: Sequence[str], target: str) -> np.ndarray:
    """(R, p, q) solutions of (S_zz + diag λ) W = S_zu by LU with pivoting."""
    regularised = s_zz.copy()
    diagonal = np.arange(s_zz.shape[-1])
    regularised[:, diagonal, diagonal] += ridge_penalty(np.diagonal(s_zz, axis1=1, axis2=2), basis_dims, alpha)
    try:
        return np.linalg.solve(regularised, s_zu)  # (R, p, q)
    except np.linalg.LinAlgError as exc:
        raise LMDError(f"bootstrap fit of {target!r} on {list(basis)}: a resampled basis covariance "
                       "is singular; set α > 0") from exc


def _score_split(moments_s: tuple[np.ndarray, ...], weight_t: np.ndarray, bias: np.ndarray, distinct_t: np.ndarray,
                 p: int, alpha: float) -> np.ndarray:
    """(R,) R² on one split's replicate moments ``moments_s`` of the train refits (``weight_t``,
    ``bias``), from the scatter alone: SSE = tr S_uu − 2 Σ W∘S_zu + Σ (S_zz W)∘W + n ‖offset‖²,
    the offset being the split's mean residual. NaN where the split is empty, its target has no
    variance, or (α = 0) the train refit had too few distinct rows."""
    n_s, mu_s, zz_s, zu_s, s_uu = moments_s
    zi, ui = np.arange(p), np.arange(p, mu_s.shape[1])
    offset = mu_s[:, ui] - (mu_s[:, None, zi] @ weight_t)[:, 0] - bias
    sse = (s_uu - 2.0 * np.sum(weight_t * zu_s, axis=(1, 2))
           + np.sum((zz_s @ weight_t) * weight_t, axis=(1, 2))
           + n_s * np.sum(offset**2, axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = 1.0 - sse / s_uu
    r2[(n_s == 0) | (s_uu <= 0) | ((alpha == 0) & (distinct_t <= p))] = np.nan
    return r2


def _check_replicates_finite(out: dict[str, np.ndarray], basis: Sequence[str], target: str, n_boot: int) -> None:
    """Refuse replicates without a valid score (NaN from :func:`_score_split`), naming the first
    split that has any."""
    for s, samples in out.items():
        bad = int((~np.isfinite(samples)).sum())
        if bad:
            raise LMDError(f"bootstrap of {target!r} on {list(basis)}: {bad} of {n_boot} replicates have an "
                           f"empty {s} or train split, or too few train rows; use fewer, larger blocks")


def path_r2_samples(blocks: BlockMoments, path: Sequence[str], target: str, alphas: Sequence[float], n_boot: int,
                    seed: int, splits: Sequence[str], last_splits: Sequence[str] = ()) -> list[dict[str, np.ndarray]]:
    """[{split: (n_boot,) replicates}] of the fit of ``target`` on ``path[:k]`` at ``alphas[k-1]``
    for k = 1 … len(alphas): step k's replicates are those of
    ``bootstrap_r2_samples(blocks, path[:k], target, alphas[k-1], n_boot, seed, splits)``, drawn
    with one factorisation per replicate and distinct α (:mod:`lmdecomp.lmd.nested`). The last
    step is also scored on ``last_splits`` (a selection's last step is the leave-one-out fit)."""
    if len(alphas) > len(path):
        raise LMDError(f"a path of {len(path)} models has no step {len(alphas)}")
    scored = {k: list(dict.fromkeys([*splits, *(last_splits if k == len(alphas) else ())]))
              for k in range(1, len(alphas) + 1)}
    out: list[dict[str, np.ndarray]] = [{} for _ in alphas]
    for alpha in dict.fromkeys(float(a) for a in alphas):
        steps = [k for k, a in enumerate(alphas, 1) if float(a) == alpha]
        drawn = _nested_samples(blocks, list(path[:max(steps)]), target, alpha, {k: scored[k] for k in steps},
                                n_boot, seed)
        for k in steps:
            out[k - 1] = drawn[k]
    return out


def _nested_samples(blocks: BlockMoments, basis: list[str], target: str, alpha: float,
                    steps: dict[int, list[str]], n_boot: int, seed: int) -> dict[int, dict[str, np.ndarray]]:
    """{k: {split: replicates}} of the fits on ``basis[:k]``, at ``alpha``, scored on the splits
    ``steps[k]``."""
    splits = list(dict.fromkeys(s for k in steps for s in steps[k]))
    _check_basis(basis, [target])
    cols = np.concatenate([blocks.columns(basis), blocks.columns([target])])
    dims = [blocks.dims[blocks.names.index(b)] for b in basis]
    p, w, widths = int(sum(dims)), len(cols), np.cumsum(dims)
    for k in steps:
        _check_full_data_basis_variance(blocks, basis[:k], dims[:k], cols[:widths[k - 1]])
    weights = bootstrap_weights(len(blocks), n_boot, seed).astype(np.float64)
    stats = {s: _gathered_split(blocks, s, cols, p) for s in dict.fromkeys(["train", *splits])}
    out = {k: {s: np.empty(n_boot) for s in steps[k]} for k in steps}
    chunk = max(1, int(_PATH_ARRAY_BYTES // (8 * w * w)))
    for lo in range(0, n_boot, chunk):
        wts = weights[lo:lo + chunk]
        train = _replicate_moments(stats["train"], wts, p, w)
        held = {s: train if s == "train" else _replicate_moments(stats[s], wts, p, w) for s in splits}
        distinct_t = (wts > 0) @ stats["train"][0]
        factor = nested.train_factor(train[2], dims, alpha)
        forward = None if factor is None else nested.forward_solve(factor, train[3])
        for k in steps:
            width = int(widths[k - 1])
            train_k = nested.prefix_moments(train, width, p)
            if factor is None:  # not positive definite: refit this step alone, as bootstrap_r2_samples does
                weight_t, bias = _refit_train(train_k, width, dims[:k], alpha, basis[:k], target)
            else:
                weight_t = nested.prefix_solve(factor, forward, width)
                bias = train_k[1][:, width:] - (train_k[1][:, None, :width] @ weight_t)[:, 0]
            # the weights differ from _refit_train's LU solve by rounding only: ≤ 1e-12 on the
            # intervals (tests/lmd/test_bootstrap.py; on the default run, docs/performance.md)
            for s in steps[k]:
                out[k][s][lo:lo + chunk] = _score_split(nested.prefix_moments(held[s], width, p), weight_t, bias,
                                                           distinct_t, width, alpha)
    for k in steps:
        _check_replicates_finite(out[k], basis[:k], target, n_boot)
    return out


def centred_interval(samples: np.ndarray, estimate: float, level: float) -> tuple[float, float]:
    """Bootstrap interval at ``level`` re-centred on the full-data ``estimate``:

        [R̂² − (m − q_lo),  R̂² + (q_hi − m)],   m the bootstrap median, q the (1∓level)/2 quantiles.

    Why not the plain percentile interval [q_lo, q_hi]: a replicate refits on resampled
    training blocks, where duplicated sequences act like ≈ 63% as many distinct rows, so it
    overfits more than the real fit and its held-out R² sits lower — by about one standard
    error when the basis is wide for the train split (measured in tests/lmd/test_bootstrap.py:
    percentile coverage ≈ 65% at a nominal 90%). The held-out R̂² itself is nearly unbiased, and
    the bootstrap spread matches its sampling spread, so the spread is kept and the location
    taken from R̂² (coverage ≈ 90% there). Efron's bias-corrected interval would move the
    wrong way: it assumes the estimator is biased like the replicates are."""
    if not 0 < level < 1:
        raise LMDError(f"level must be in (0, 1); got {level}")
    lo, mid, hi = np.quantile(samples, [(1 - level) / 2, 0.5, (1 + level) / 2])
    return float(estimate - (mid - lo)), float(estimate + (hi - mid))


def bootstrap_r2(
    blocks: "BlockMoments | Sequence[Moments]",
    basis: Sequence[str],
    target: str,
    alpha: float,
    n_boot: int = 200,
    seed: int = 0,
    level: float = 0.9,
    split: str = "test",
) -> tuple[float, float]:
    """Block-bootstrap interval (lo, hi) at ``level`` for the ``split`` R² of the fit of
    ``target`` on ``basis``: the replicates of :func:`bootstrap_r2_samples` re-centred on the
    full-data R² (:func:`centred_interval`). Cost: n_boot batched p×p solves, no embedding
    re-read. It covers train-sampling and test-sampling variability of a fixed-α fit, not α
    selection."""
    if not 0 < level < 1:
        raise LMDError(f"level must be in (0, 1); got {level}")
    if not isinstance(blocks, BlockMoments):
        blocks = BlockMoments.from_moments(list(blocks))
    samples = bootstrap_r2_samples(blocks, basis, target, alpha, n_boot=n_boot, seed=seed, split=split)
    total = blocks.total()
    estimate = r_squared(total, fit_ridge(total, basis, target, alpha), split)
    return centred_interval(samples, estimate, level)


class BootstrapCache:
    """Bootstrap replicates already drawn, per fit, for one :class:`BlockMoments`, ``n_boot`` and
    ``seed``: the fit tables of one stage share fits (a greedy selection's first step is a
    pairwise fit, its last the leave-one-out fit), and a fit's replicates are its largest cost.

    A fit is keyed by its basis as a set (the order of the basis columns does not change the
    fit; replicates of two orders agree to rounding), its target and its α. Splits missing for
    a fit already drawn are drawn together, sharing their train refits."""

    def __init__(self, blocks: BlockMoments, n_boot: int, seed: int) -> None:
        self.blocks, self.n_boot, self.seed = blocks, int(n_boot), int(seed)
        self._samples: dict[tuple, dict[str, np.ndarray]] = {}

    def samples(self, basis: Sequence[str], target: str, alpha: float, splits: Sequence[str]) -> dict[str, np.ndarray]:
        """{split: (n_boot,) replicates} of :func:`bootstrap_r2_samples` for the fit."""
        have = self._samples.setdefault((frozenset(basis), target, float(alpha)), {})
        missing = [s for s in dict.fromkeys(splits) if s not in have]
        if missing:
            have.update(bootstrap_r2_samples(self.blocks, basis, target, alpha, n_boot=self.n_boot, seed=self.seed,
                                             split=missing))
        return {s: have[s] for s in splits}

    def draw_path(self, path: Sequence[str], target: str, alphas: Sequence[float], splits: Sequence[str],
                  last_splits: Sequence[str] = ()) -> None:
        """Draw the replicates of every step of a selection path (basis ``path[:k]`` at ``alphas[k-1]``)
        that the cache lacks, sharing each replicate's factorisation across steps
        (:func:`path_r2_samples`)."""
        keys = [(frozenset(path[:k]), target, float(a)) for k, a in enumerate(alphas, 1)]
        wanted = {k: {*splits, *(last_splits if k == len(keys) else ())} for k in range(1, len(keys) + 1)}
        missing = [k for k, key in enumerate(keys, 1) if not wanted[k] <= set(self._samples.get(key, {}))]
        if not missing:
            return
        last = max(missing)  # steps up to it share the factors; steps already drawn are kept as they are
        drawn = path_r2_samples(self.blocks, path, target, list(alphas[:last]), self.n_boot, self.seed, splits,
                                last_splits if last == len(keys) else ())
        for k in missing:
            self._samples.setdefault(keys[k - 1], {}).update(drawn[k - 1])

    def __len__(self) -> int:
        """The number of fits drawn."""
        return len(self._samples)


def _cache_for(cache: "BootstrapCache | None", blocks: BlockMoments, n_boot: int, seed: int) -> BootstrapCache:
    """``cache``, checked to serve these blocks, n_boot and seed; a fresh one if None."""
    if cache is None:
        return BootstrapCache(blocks, n_boot, seed)
    if blocks is not cache.blocks or int(n_boot) != cache.n_boot or int(seed) != cache.seed:
        raise LMDError("a BootstrapCache serves one set of block moments, n_boot and seed; make one per set")
    return cache


def add_confidence_intervals(
    rows: list[dict], blocks: BlockMoments, n_boot: int, level: float, seed: int, basis_of=None,
    cache: BootstrapCache | None = None,
) -> list[dict]:
    """Give every fit row ``r2_lo``/``r2_hi``: its block-bootstrap interval at ``level``, re-centred
    on the row's ``r2`` (:func:`centred_interval`).

    A row's basis is ``basis_of(row)`` if given, else ``[row["basis"]]``, else (a leave-one-out
    row) every other model. The interval is for the row's own α (chosen on the full data when α
    came from a grid). Rows of one fit (same basis, target and α) share one bootstrap, and with
    a ``cache`` so do the fits of other tables drawn through it."""
    if not 0 < level < 1:
        raise LMDError(f"level must be in (0, 1); got {level}")
    cache = _cache_for(cache, blocks, n_boot, seed)

    def basis_for(row):
        if basis_of is not None:
            return list(basis_of(row))
        return [row["basis"]] if "basis" in row else [n for n in blocks.names if n != row["target"]]

    fits: dict[tuple, list[str]] = {}
    for row in rows:
        fits.setdefault((tuple(basis_for(row)), row["target"], row["alpha"]), []).append(row["split"])
    intervals = {}
    for (basis, target, alpha), splits in fits.items():
        samples = cache.samples(basis, target, alpha, splits)
        intervals.update({(basis, target, alpha, s): values for s, values in samples.items()})
    out = []
    for row in rows:
        samples = intervals[tuple(basis_for(row)), row["target"], row["alpha"], row["split"]]
        lo, hi = centred_interval(samples, row["r2"], level)
        out.append({**row, "r2_lo": lo, "r2_hi": hi})
    return out


def add_selection_intervals(
    selection: list[dict], blocks: BlockMoments, n_boot: int, level: float, seed: int,
    cache: BootstrapCache | None = None,
) -> list[dict]:
    """Give every :func:`greedy_selection` row ``val_r2_lo``/``val_r2_hi`` and
    ``test_r2_lo``/``test_r2_hi``: bootstrap intervals of the fit on the models selected up to
    its step (one bootstrap per row for both splits, centred as :func:`centred_interval`; with a
    ``cache``, shared with the same fit drawn for another table). The path itself is taken as
    fixed: the intervals do not cover the selection's own variability."""
    cache = _cache_for(cache, blocks, n_boot, seed)
    for target in dict.fromkeys(r["target"] for r in selection):
        steps = sorted((r for r in selection if r["target"] == target), key=lambda r: r["k"])
        if [r["k"] for r in steps] != list(range(1, len(steps) + 1)):
            continue  # not a whole path from step 1: each row's fit is drawn alone below
        # the last step on every split: it also serves the leave-one-out table's rows
        cache.draw_path([r["added_model"] for r in steps], target, [r["alpha"] for r in steps], ["val", "test"],
                        last_splits=SPLITS)
    out = []
    for row in selection:
        basis = [r["added_model"] for r in selection if r["target"] == row["target"] and r["k"] <= row["k"]]
        samples = cache.samples(basis, row["target"], row["alpha"], ["val", "test"])
        extra = {}
        for split in ("val", "test"):
            lo, hi = centred_interval(samples[split], row[f"{split}_r2"], level)
            extra.update({f"{split}_r2_lo": lo, f"{split}_r2_hi": hi})
        out.append({**row, **extra})
    return out
