"""params.yaml validation: a broken config fails at once, naming the key."""

from __future__ import annotations

import pytest
import yaml

from lmdecomp.params import ParamsError, load_params, merge_params


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_default_and_smoke_configs_are_valid(repo_root):
    schema = repo_root / "workflow/schemas/params.schema.yaml"
    base = load_params([repo_root / "params.yaml"], schema)
    smoke = load_params([repo_root / "params.yaml", repo_root / "config/smoke.yaml"], schema)
    assert smoke["corpus"]["seq_len"] < base["corpus"]["seq_len"]
    assert smoke["corpus"]["sources"] == base["corpus"]["sources"]  # merged, not replaced


def test_merge_follows_snakemake_rules():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 2}
    assert merge_params(base, {"a": {"y": [3]}, "c": 4}) == {"a": {"x": 1, "y": [3]}, "b": 2, "c": 4}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 2}


@pytest.mark.parametrize(
    "overlay,named",
    [
        ({"embed": {"pooling": "median"}}, "embed.pooling"),
        ({"corpus": {"seq_len": "long"}}, "corpus.seq_len"),
        ({"lmd": {"alpah": 1}}, "lmd: Additional properties are not allowed ('alpah' was unexpected)"),
        ({"models": [{"name": "a", "ftp": "x"}, {"name": "b", "path": "p"}]}, "models.0"),
    ],
)
def test_broken_params_name_the_key(repo_root, tmp_path, overlay, named):
    bad = write(tmp_path, "bad.yaml", overlay)
    with pytest.raises(ParamsError) as err:
        load_params([repo_root / "params.yaml", bad], repo_root / "workflow/schemas/params.schema.yaml")
    assert named in str(err.value)
