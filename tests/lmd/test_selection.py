"""lmdecomp.lmd.selection: greedy forward basis selection, against brute force over every
candidate of its first steps."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import moments_of, r2_direct, ridge_reference
from lmdecomp import lmd

SPLIT_NAMES = np.array(lmd.SPLITS, dtype=object)


def test_greedy_selection_picks_the_planted_models_first():
    rng = np.random.default_rng(15)
    n = 1500
    names = ["m0", "m1", "m2", "m3", "m4", "u"]
    xs = [rng.normal(size=(n, w)) + rng.normal(size=w) for w in (4, 6, 5, 3, 4)]
    u = xs[1] @ rng.normal(size=(6, 5)) + xs[3] @ rng.normal(size=(3, 5)) + 0.5 * rng.normal(size=(n, 5))
    split = rng.choice(SPLIT_NAMES, size=n, p=[0.6, 0.2, 0.2])
    m = moments_of([*xs, u], names, split)
    rows = lmd.greedy_selection(m, "u", 0.01)
    assert [r["k"] for r in rows] == [1, 2, 3, 4, 5]
    assert {rows[0]["added_model"], rows[1]["added_model"]} == {"m1", "m3"}
    assert sorted(r["added_model"] for r in rows) == ["m0", "m1", "m2", "m3", "m4"]
    assert 0 < rows[0]["val_r2"] < rows[1]["val_r2"]
    assert rows[1]["val_r2"] > 0.9 and rows[1]["test_r2"] > 0.9
    # Brute force of step 1 and step 2: every candidate scored with an explicit fit.
    basis: list[str] = []
    for row in rows[:2]:
        scores = {}
        for cand in names[:5]:
            if cand in basis:
                continue
            zi = np.hstack([xs[names.index(b)] for b in [*basis, cand]])
            w, b = ridge_reference(zi[split == "train"], u[split == "train"], 0.01,
                                [xs[names.index(b)].shape[1] for b in [*basis, cand]])
            scores[cand] = r2_direct(zi[split == "val"], u[split == "val"], w, b)
        assert row["added_model"] == max(scores, key=scores.get)
        assert row["val_r2"] == pytest.approx(scores[row["added_model"]], abs=1e-9)
        basis.append(row["added_model"])
    assert len(lmd.greedy_selection(m, "u", [0.01, 1.0], max_k=2)) == 2
