"""The public API: lmdecomp.decompose on arrays against explicit numpy fits, and the top-level
names (the comparison with the pipeline's own tables is in tests/workflow/test_workflow.py)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import polars as pl
import pytest

import lmdecomp
from conftest import r2_direct, ridge_reference
from lmdecomp.lmd import LMDError


def correlated_models(seed=0, n=600, widths=(3, 5, 4)):
    """Three models sharing a 3-d latent, with their own noise; splits in blocks of rows."""
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, 3))
    models = {f"m{i}": latent @ rng.normal(size=(3, w)) + 0.5 * rng.normal(size=(n, w)) for i, w in enumerate(widths)}
    split = np.array(["train"] * (n // 2) + ["val"] * (n // 4) + ["test"] * (n - n // 2 - n // 4))
    return models, split


def reference_r2(models, split, basis, target, alpha):
    """{split: R²} of ``target`` on the concatenated ``basis``, fitted on train in numpy float64."""
    z = np.concatenate([models[b] for b in basis], axis=1)
    train = split == "train"
    w, b = ridge_reference(z[train], models[target][train], alpha, [models[m].shape[1] for m in basis])
    return {s: r2_direct(z[split == s], models[target][split == s], w, b) for s in ("train", "val", "test")}


def test_pairwise_and_loo_equal_explicit_ridge_fits():
    models, split = correlated_models()
    result = lmdecomp.decompose(models, split, alpha=0.1)
    assert result.pairwise.columns == ["basis", "target", "split", "r2", "alpha"]
    assert result.loo.columns == ["target", "split", "r2", "alpha"]
    assert result.pairwise.height == 3 * 2 * 3 and result.loo.height == 3 * 3
    for row in result.pairwise.iter_rows(named=True):
        want = reference_r2(models, split, [row["basis"]], row["target"], 0.1)[row["split"]]
        assert row["r2"] == pytest.approx(want, abs=1e-10), row
    for row in result.loo.iter_rows(named=True):
        basis = [m for m in models if m != row["target"]]
        assert row["r2"] == pytest.approx(reference_r2(models, split, basis, row["target"], 0.1)[row["split"]], abs=1e-10)


def test_a_grid_keeps_the_alpha_with_the_best_val_r2():
    models, split = correlated_models(seed=1, n=300)
    grid = [0.0, 0.01, 1.0, 100.0]
    loo = lmdecomp.decompose(models, split, alpha=grid).loo
    for target in models:
        basis = [m for m in models if m != target]
        scores = {a: reference_r2(models, split, basis, target, a) for a in grid}
        best = max(grid, key=lambda a: scores[a]["val"])
        rows = loo.filter(pl.col("target") == target)
        assert set(rows["alpha"]) == {best}
        test = rows.filter(pl.col("split") == "test")["r2"][0]
        assert test == pytest.approx(scores[best]["test"], abs=1e-10)


def test_intervals_only_when_asked_for_and_they_bracket_the_estimate():
    models, split = correlated_models(seed=2, n=400)
    # rows in document order: interleave the splits so every block holds all three
    split = np.array(["train", "train", "val", "test"] * 100)
    result = lmdecomp.decompose(models, split, alpha=0.1, bootstrap=30, n_blocks=20, level=0.9, seed=3)
    assert result.pairwise.columns == ["basis", "target", "split", "r2", "alpha", "r2_lo", "r2_hi"]
    table = pl.concat([result.pairwise.drop("basis"), result.loo])
    assert (table["r2_lo"] <= table["r2"]).all() and (table["r2"] <= table["r2_hi"]).all()
    assert (table["r2_hi"] - table["r2_lo"] > 0).all()
    again = lmdecomp.decompose(models, split, alpha=0.1, bootstrap=30, n_blocks=20, level=0.9, seed=3)
    assert again.loo.equals(result.loo)  # seeded: the same intervals


def test_widths_may_differ_and_float32_input_is_accumulated_in_float64():
    models, split = correlated_models(seed=4, widths=(2, 7, 3))
    as32 = {k: v.astype(np.float32) for k, v in models.items()}
    got = lmdecomp.decompose(as32, split, alpha=0.01).loo
    exact = {k: v.astype(np.float64) for k, v in as32.items()}
    for row in got.iter_rows(named=True):
        basis = [m for m in models if m != row["target"]]
        assert row["r2"] == pytest.approx(reference_r2(exact, split, basis, row["target"], 0.01)[row["split"]], abs=1e-10)


@pytest.mark.parametrize("change, message", [
    (lambda m, s: ({"m0": m["m0"]}, s), "at least two model names"),
    (lambda m, s: ({**m, "m1": m["m1"][:-1]}, s), "same number of rows"),
    (lambda m, s: (m, np.where(s == "val", "dev", s)), r"'train', 'val' or 'test'.*dev"),
    (lambda m, s: ({**m, "m2": np.where(np.arange(len(s))[:, None] == 7, np.nan, m["m2"])}, s), r"m2.*NaN.*row 7"),
    (lambda m, s: ({**m, "m0": m["m0"][:, 0]}, s), r"m0.*2-D"),
])
def test_bad_input_is_a_clear_error(change, message):
    models, split = correlated_models(n=60)
    with pytest.raises(LMDError, match=message):
        lmdecomp.decompose(*change(models, split), alpha=0.1)


def test_top_level_names_are_the_library_objects_and_importing_lmdecomp_loads_no_torch():
    from lmdecomp.api import decompose
    from lmdecomp.mpo import mpobert
    from lmdecomp.mpo.layer import MPOLinear

    assert lmdecomp.decompose is decompose and lmdecomp.MPOLinear is MPOLinear
    assert lmdecomp.build_mpobert is mpobert.build and lmdecomp.MPOBertConfig is mpobert.MPOBertConfig
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        lmdecomp.nope  # noqa: B018
    code = "import sys, lmdecomp, lmdecomp.atomic, lmdecomp.params; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
