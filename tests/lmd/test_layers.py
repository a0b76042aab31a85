"""Layer-wise LMD: stored hidden states, relative-depth matching, fits against explicit numpy
ridge regressions, and per-depth bootstrap intervals against the all-columns bootstrap."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lmdecomp.models import embed, sources
from lmdecomp.lmd import layers
from lmdecomp import lmd
from lmdecomp.data import shards
from embed_reference import cfg as embed_cfg, reference_windows, sequences  # noqa: F401  (fixture)

SPLITS = np.array(["train", "val", "test"])


def test_stored_layers_accepts_lists_negative_indices_and_all():
    assert embed.stored_layers({"layer": -1}, 3, "m") == (2, [])
    assert embed.stored_layers({"layer": -1, "layers": [0, -1, 1]}, 3, "m") == (2, [0, 1])
    assert embed.stored_layers({"layer": 1, "layers": "all"}, 4, "m") == (1, [0, 2, 3])
    with pytest.raises(embed.EmbedError, match=r"embed.layers=5 but the model has 3 hidden states"):
        embed.stored_layers({"layer": -1, "layers": [5]}, 3, "m")
    with pytest.raises(embed.EmbedError, match="list of hidden-state indices or 'all'"):
        embed.stored_layers({"layer": -1, "layers": "some"}, 3, "m")


def test_every_stored_layer_equals_an_unbatched_forward_pass(tiny_model_dir, sequences, tmp_path):  # noqa: F811
    from embed_reference import TEXTS

    ref = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    manifest = embed.embed_model(ref, sequences, tmp_path / "e", embed_cfg(layers="all"), progress=False)
    assert manifest["layers"] == [0, 1, 2] and manifest["layer"] == 2 and manifest["num_hidden_layers"] == 2
    for k in (0, 1, 2):
        column = shards.layer_column(manifest, k)
        got = np.concatenate([p.columns[column] for p in shards.iter_shards(tmp_path / "e", columns=[column])])
        for i, text in enumerate(TEXTS):
            np.testing.assert_allclose(got[i], reference_windows(tiny_model_dir, text, k, 40), atol=2e-5)
    with pytest.raises(shards.ShardError, match="hidden state 7 was not embedded"):
        shards.layer_column(manifest, 7)


def column(model, layer, depth_layers):
    return layers.LayerColumn(model, layer, layer / depth_layers, Path("."), f"hidden_{layer}")


def test_bases_match_the_nearest_relative_depth_and_prefer_the_shallower_on_ties():
    cols = [column("a", k, 6) for k in range(7)] + [column("b", k, 2) for k in range(3)] + \
           [column("c", k, 4) for k in range(5)]
    got = layers.bases(cols)
    assert got["a@3"] == ["b@1", "c@2"]  # depth 1/2
    assert got["a@1"] == ["b@0", "c@1"]  # 1/6: b's 0 is nearer than 1/2; c's 1/4 nearer than 0
    assert got["a@2"] == ["b@1", "c@1"]  # 1/3: b's 1/2 (0.17 away) beats 0; c's 1/4 beats 1/2
    assert got["c@1"] == ["a@1", "b@0"]  # 1/4: a's 1/6 and 1/3 tie, b's 0 and 1/2 tie: the shallower
    assert got["b@2"] == ["a@6", "c@4"]


@pytest.fixture()
def layered(tmp_path):
    """Two models' shards with all hidden states stored: model x (3 layers) and y (1 layer),
    where y's states are noisy linear maps of x's states at the same relative depth."""
    rng = np.random.default_rng(3)
    n = 900
    split = rng.choice(SPLITS, size=n, p=[0.6, 0.2, 0.2])
    ids = np.arange(n, dtype=np.int64)
    x = [rng.normal(size=(n, 5)) for _ in range(4)]  # x hidden states 0..3
    y = {0: x[0] @ rng.normal(size=(5, 4)) + 0.5 * rng.normal(size=(n, 4)),
         1: x[3] @ rng.normal(size=(5, 4)) + 1.0 * rng.normal(size=(n, 4))}
    folders = {}
    for name, states, main in (("x", dict(enumerate(x)), 3), ("y", y, 1)):
        folder = tmp_path / name
        folder.mkdir()
        entries = []
        for i, lo in enumerate(range(0, n, 300)):
            sl = slice(lo, lo + 300)
            file = shards.shard_name(i)
            shards.write_shard(folder / file, ids[sl], list(split[sl]), states[main][sl], 64,
                               hidden={k: v[sl] for k, v in states.items() if k != main})
            entries.append(shards.shard_entry(folder, file, len(ids[sl])))
        shards.write_manifest(folder, {"schema_version": shards.SCHEMA_VERSION, "model": name, "dim": states[main].shape[1],
                                       "rows": n, "layer": main, "layers": sorted(states), "num_hidden_layers": main,
                                       "shards": entries})
        folders[name] = folder
    return folders, x, y, split


def test_layer_fits_equal_explicit_least_squares(layered):
    folders, x, y, split = layered
    cols = layers.layer_columns(folders)
    assert [c.name for c in cols] == ["x@0", "x@1", "x@2", "x@3", "y@0", "y@1"]
    moments = lmd.accumulate_moments(layers.sources(cols))
    rows = layers.fit_layers(moments, cols, 0.0)
    states = {f"x@{k}": v for k, v in enumerate(x)} | {f"y@{k}": v for k, v in y.items()}
    states = {k: v.astype(np.float32).astype(np.float64) for k, v in states.items()}  # as stored
    assert len(rows) == 6 * 3
    for row in rows:
        z, u = states[row["basis"]], states[row["target"]]
        tr, sc = split == "train", split == row["split"]
        design = np.hstack([z[tr], np.ones((tr.sum(), 1))])
        coef = np.linalg.lstsq(design, u[tr], rcond=None)[0]
        resid = u[sc] - np.hstack([z[sc], np.ones((sc.sum(), 1))]) @ coef
        expected = 1 - (resid**2).sum() / ((u[sc] - u[sc].mean(0)) ** 2).sum()
        assert row["r2"] == pytest.approx(expected, abs=1e-9)
    test = {r["target"]: r for r in rows if r["split"] == "test"}
    assert test["x@1"]["basis"] == "y@0" and test["x@2"]["basis"] == "y@1"  # 1/3 → 0, 2/3 → 1
    assert test["y@0"]["r2"] > 0.8 and test["y@1"]["r2"] > 0.5  # the planted maps
    assert test["x@1"]["r2"] < 0.05  # x@1 is independent of y


def test_passes_per_depth_equal_fits_and_bootstrap_over_all_columns(layered):
    folders, *_ = layered
    cols = layers.layer_columns(folders)
    moments = lmd.accumulate_moments(layers.sources(cols))
    rows = layers.fit_layers(moments, cols, [0.01, 1.0])
    assert [{k: v for k, v in r.items() if k != "r2"} for r in layers.layer_lmd(cols, [0.01, 1.0])] == \
        [{k: v for k, v in r.items() if k != "r2"} for r in rows]
    np.testing.assert_allclose([r["r2"] for r in layers.layer_lmd(cols, [0.01, 1.0])], [r["r2"] for r in rows],
                               rtol=0, atol=1e-12)
    got = layers.layer_lmd(cols, [0.01, 1.0], rows_per_block=45, n_boot=30, level=0.9, seed=4)
    every = lmd.accumulate_block_moments(layers.sources(cols), rows_per_block=45)
    expected = lmd.add_confidence_intervals(rows, every, n_boot=30, level=0.9, seed=4,
                                            basis_of=lambda r: layers.bases(cols)[r["target"]])
    assert len(every) == 20
    for g, e in zip(got, expected):
        assert g["target"] == e["target"] and g["split"] == e["split"] and g["alpha"] == e["alpha"]
        assert g["r2_lo"] == pytest.approx(e["r2_lo"], abs=1e-10)
        assert g["r2_hi"] == pytest.approx(e["r2_hi"], abs=1e-10)
        assert g["r2_lo"] <= g["r2"] <= g["r2_hi"]


def test_a_basis_is_carried_as_a_list_and_one_model_is_refused(layered):
    """A model name with a comma (one the config's pattern would refuse) still bootstraps the right
    basis: layer_lmd does not split the joined basis string back."""
    import dataclasses

    folders, *_ = layered
    cols = [dataclasses.replace(c, model="y,1") if c.model == "y" else c for c in layers.layer_columns(folders)]
    got = layers.layer_lmd(cols, 0.1, rows_per_block=90, n_boot=10, seed=1)
    every = lmd.accumulate_block_moments(layers.sources(cols), rows_per_block=90)
    by_target = {r["target"] + r["split"]: r for r in got}
    row = by_target["y,1@1test"]
    assert row["basis"] == "x@3"
    lo, hi = lmd.bootstrap_r2(every, ["x@3"], "y,1@1", 0.1, n_boot=10, seed=1, split="test")
    assert (row["r2_lo"], row["r2_hi"]) == pytest.approx((lo, hi), abs=1e-10)
    with pytest.raises(lmd.LMDError, match="contains ','"):
        layers.layer_columns({"y,1": folders["y"], "x": folders["x"]})
    with pytest.raises(lmd.LMDError, match="LMD needs at least two models"):
        layers.layer_lmd([c for c in cols if c.model == "x"], 0.1)


def test_layer_curves_name_each_models_depth_not_its_stored_layers(tmp_path, monkeypatch):
    """A 6-layer model with embed.layers [0, 3, 6] stores 3 rows: it is still 6 layers deep."""
    import polars as pl

    from lmdecomp import plots

    labels = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: labels.extend(
        t.get_text() for t in fig.axes[0].get_legend().get_texts()))
    rows = [{"model": "six", "layer": k, "relative_depth": k / 6, "split": "test", "r2": 0.5} for k in (0, 3, 6)]
    rows += [{"model": "two", "layer": k, "relative_depth": k / 2, "split": "test", "r2": 0.4} for k in (0, 1, 2)]
    plots.layer_curves(pl.DataFrame(rows), tmp_path / "layers.png")
    assert labels == ["six (6 layers)", "two (2 layers)"]
