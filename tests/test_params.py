"""params.yaml validation: a broken config fails at once, naming the key."""

from __future__ import annotations

import pytest
import yaml

from lmdecomp.params import (
    ParamsError,
    UnlistedParam,
    load_params,
    merge_params,
    restrict_params,
    stage_param_keys,
)


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
        ({"corpus": {"sources": [{"name": "a", "path": "x"}, {"name": "a", "path": "y"}]}},
         "corpus.sources: more than one source is named 'a'"),
    ],
)
def test_broken_params_name_the_key(repo_root, tmp_path, overlay, named):
    bad = write(tmp_path, "bad.yaml", overlay)
    with pytest.raises(ParamsError) as err:
        load_params([repo_root / "params.yaml", bad], repo_root / "workflow/schemas/params.schema.yaml")
    assert named in str(err.value)


def test_a_stage_sees_exactly_the_keys_dvc_yaml_lists_for_it(tmp_path):
    full = {"lmd": {"threads": 2, "alpha": 0.1, "grid": {"lo": 1}}, "models": [{"name": "a"}], "zoo": {"threads": 4}}
    dvc = write(tmp_path, "dvc.yaml", {"stages": {
        "fit": {"cmd": "x", "params": ["models", "lmd.threads", "lmd.grid.lo", "lmd.absent"]},
        "each": {"foreach": [1], "do": {"cmd": "y", "params": ["zoo"]}},
    }})
    assert stage_param_keys("fit", dvc) == ["models", "lmd.threads", "lmd.grid.lo", "lmd.absent"]
    assert stage_param_keys("each", dvc) == ["zoo"]
    seen = restrict_params(full, stage_param_keys("fit", dvc), "fit")
    assert seen == {"models": [{"name": "a"}], "lmd": {"threads": 2, "grid": {"lo": 1}}}
    assert seen["lmd"].get("shards_per_job", 3) == 3  # absent from the full params too: a plain default
    for read in (lambda: seen["lmd"]["alpha"], lambda: seen["lmd"].get("alpha"), lambda: seen["zoo"]):
        with pytest.raises(UnlistedParam, match="dvc.yaml does not list"):
            read()
    with pytest.raises(KeyError):
        seen["lmd"]["absent"]
    with pytest.raises(ParamsError, match="no stage 'nope'"):
        stage_param_keys("nope", dvc)


def test_every_job_script_loads_only_its_stage_params_and_every_rule_tracks_them(repo_root):
    """Scripts read params through load_stage_params(…, "<stage>"), and each rule running a script
    takes its params from stage_params("<stage>"), the same dvc.yaml list."""
    import re

    stages = yaml.safe_load((repo_root / "dvc.yaml").read_text())["stages"]
    script_stage = {}
    for name, spec in stages.items():
        for dep in spec.get("do", spec)["deps"]:
            if dep.startswith("workflow/scripts/"):
                script_stage[dep] = name
    for script, stage in script_stage.items():
        text = (repo_root / script).read_text()
        if "--params" in text:
            assert f'load_stage_params(args.params, "{stage}")' in text, script
            assert "load_params(" not in text, script
    rules = "\n".join(p.read_text() for p in sorted((repo_root / "workflow/rules").glob("*.smk")))
    for block in re.split(r"\n\s*rule ", rules)[1:]:
        script = re.search(r"python (workflow/scripts/\w+\.py)", block)
        if script and "--params" in block:
            assert f'stage_params("{script_stage[script.group(1)]}"' in block, block.split(":")[0]


@pytest.mark.parametrize(
    "overlay,named",
    [
        ({"models": [{"name": "a", "path": "p"}, {"name": "a", "path": "q"}]}, "['a'] named more than once"),
        ({"embed": {"pooling": "cls"}}, "set embed.overflow: truncate"),
        ({"embed": {"overflow": "truncate", "pooling": "cls", "granularity": "word"}}, "embed.granularity: word"),
        ({"finetune": {"splits": {"train": 0.5, "val": 0.1, "test": 0.1}}}, "finetune.splits must sum to 1"),
        ({"corpus": {"splits": {"train": 0.5, "val": 0.25, "test": 0.5}}}, "corpus.splits must sum to 1"),
        ({"mpo": {"models": ["nope"]}}, "mpo.models: ['nope'] not under models:"),
        ({"mpobert": {"base": "nope"}}, "mpobert.base: ['nope']"),
        ({"lmd": {"shards_per_job": 2}, "corpus": {"n_sequences": None}}, "lmd.shards_per_job needs a number"),
    ],
)
def test_rules_across_keys_name_the_keys(repo_root, tmp_path, overlay, named):
    bad = write(tmp_path, "bad.yaml", overlay)
    with pytest.raises(ParamsError) as err:
        load_params([repo_root / "params.yaml", bad], repo_root / "workflow/schemas/params.schema.yaml")
    assert named in str(err.value)
