"""params.yaml validation: a broken config fails at once, naming the key."""

from __future__ import annotations

import os

import pytest
import yaml

from lmdecomp import params
from lmdecomp.params import ParamsError, UnlistedParam, bind_param_keys, load_params, merge_params, read_yaml, restrict_params, stage_param_keys


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


def test_merge_follows_snakemake_rules_except_that_an_overlay_replaces_the_models():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 2}
    assert merge_params(base, {"a": {"y": [3]}, "c": 4}) == {"a": {"x": 1, "y": [3]}, "b": 2, "c": 4}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 2}
    base = {"models": {"m1": {"path": "p"}, "m2": {"path": "q"}}, "mpo": {"models": ["m1"], "seed": 0}}
    assert merge_params(base, {"models": {"m3": {"path": "r"}}, "mpo": {"seed": 1}}) == {
        "models": {"m3": {"path": "r"}}, "mpo": {"models": ["m1"], "seed": 1}}
    # only at the top level: a nested key called models merges as usual
    assert merge_params({"x": {"models": {"a": 1}}}, {"x": {"models": {"b": 2}}}) == {"x": {"models": {"a": 1, "b": 2}}}


def test_a_model_named_twice_is_refused_and_yaml_merge_keys_may_override(repo_root, tmp_path):
    """PyYAML keeps the last of two equal keys silently, so a second model of the same name
    would replace the first; read_yaml refuses it. A key brought in by <<: may be overridden
    (params.yaml's zoo models are written so)."""
    twice = tmp_path / "twice.yaml"
    twice.write_text("models:\n  a: {path: p}\n  b: {path: q}\n  a: {path: r}\n")
    with pytest.raises(ParamsError, match="found the key 'a' twice"):
        load_params([repo_root / "params.yaml", twice], repo_root / "workflow/schemas/params.schema.yaml")
    merged = tmp_path / "merged.yaml"
    merged.write_text("base: &b {x: 1, y: 2}\nmodels:\n  a: {<<: *b, y: 3}\n")
    assert read_yaml(merged)["models"]["a"] == {"x": 1, "y": 3}


@pytest.mark.parametrize(
    "overlay,named",
    [
        ({"embed": {"pooling": "median"}}, "embed.pooling"),
        ({"corpus": {"seq_len": "long"}}, "corpus.seq_len"),
        ({"lmd": {"alpah": 1}}, "lmd: Additional properties are not allowed ('alpah' was unexpected)"),
        ({"models": {"a": {"ftp": "x"}, "b": {"path": "p"}}}, "models.a"),
        ({"models": {"a": {"hub": "bert-base-uncased"}, "b": {"path": "p"}}},
         "models.a: a hub: model needs revision: <commit sha>"),
        ({"models": {"a": {"path": "x", "package": "y"}, "b": {"path": "p"}}},
         "models.a: give exactly one source (package, path, hub with revision, parts or pretrain); got ['package', 'path']"),
        ({"models": {"a.b": {"path": "x"}, "c": {"path": "p"}}}, "models: 'a.b' does not match"),
        ({"models": [{"name": "a", "path": "x"}, {"name": "b", "path": "p"}]}, "write each `- {name: minilm, package: …}` as `minilm: {package: …}`"),
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
    full = {"lmd": {"threads": 2, "alpha": 0.1, "grid": {"lo": 1}}, "models": {"a": {"path": "p"}, "b": {"path": "q"}},
            "zoo": {"threads": 4}, "mpobert": {"base": "b"}}
    dvc = write(tmp_path, "dvc.yaml", {"stages": {
        "fit": {"cmd": "x", "params": ["models", "lmd.threads", "lmd.grid.lo", "lmd.absent"]},
        "each": {"foreach": "${models}", "do": {"cmd": "y", "params": ["models.${key}", "zoo"]}},
        "base": {"cmd": "z", "params": ["models.${mpobert.base}"]},
    }})
    assert stage_param_keys("fit", dvc) == ["models", "lmd.threads", "lmd.grid.lo", "lmd.absent"]
    assert stage_param_keys("each", dvc) == ["models.${key}", "zoo"]
    seen = restrict_params(full, stage_param_keys("fit", dvc), "fit")
    assert seen == {"models": {"a": {"path": "p"}, "b": {"path": "q"}}, "lmd": {"threads": 2, "grid": {"lo": 1}}}
    # a foreach job sees its own model only; ${…} of a params key is filled in as DVC does
    one = restrict_params(full, bind_param_keys(stage_param_keys("each", dvc), full, "each", key="a"), "each")
    assert one == {"models": {"a": {"path": "p"}}, "zoo": {"threads": 4}}
    with pytest.raises(UnlistedParam, match="'models.b'"):
        one["models"]["b"]
    assert bind_param_keys(stage_param_keys("base", dvc), full, "base") == ["models.b"]
    with pytest.raises(ParamsError, match=r"\$\{key\}, which is neither given for this job"):
        bind_param_keys(stage_param_keys("each", dvc), full, "each")
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
            assert f'load_stage_params(args.params, "{stage}"' in text, script
            assert "load_params(" not in text, script
    rules = "\n".join(p.read_text() for p in sorted((repo_root / "workflow/rules").glob("*.smk")))
    for block in re.split(r"\n\s*rule ", rules)[1:]:
        script = re.search(r"python (workflow/scripts/\w+\.py)", block)
        if script and "--params" in block:
            assert f'stage_params("{script_stage[script.group(1)]}"' in block, block.split(":")[0]


@pytest.mark.parametrize(
    "overlay,named",
    [
        ({"embed": {"pooling": "cls"}}, "set embed.overflow: truncate"),
        ({"embed": {"overflow": "truncate", "pooling": "cls", "granularity": "word"}}, "embed.granularity: word"),
        ({"finetune": {"splits": {"train": 0.5, "val": 0.1, "test": 0.1}}}, "finetune.splits must sum to 1"),
        ({"corpus": {"splits": {"train": 0.5, "val": 0.25, "test": 0.5}}}, "corpus.splits must sum to 1"),
        ({"mpo": {"models": ["nope"]}}, "mpo.models: ['nope'] not under models:"),
        ({"mpobert": {"base": "nope"}}, "mpobert.base: ['nope']"),
        ({"lmd": {"shards_per_job": 2}, "corpus": {"n_sequences": None}}, "lmd.shards_per_job needs a number"),
        # two specs of one name: Snakemake kept the last, the scripts the first (mpo weights recorded as dense)
        ({"finetune": {"variants": [{"name": "dense", "model": "dense"}, {"name": "dense", "model": "mpo"}]}},
         "finetune.variants: more than one entry is named 'dense'"),
        ({"finetune": {"tasks": [{"name": "t", "path": "a", "format": "csv", "text_column": "x", "label_column": "y"},
                                 {"name": "t", "path": "b", "format": "folders"}]}},
         "finetune.tasks: more than one entry is named 't'"),
        ({"finetune": {"variants": [{"name": "deep", "model": "mpobert"}, {"name": "x", "model": "albert"}]},
          "mpobert": {"variants": ["dense", "mpobert"]}}, "which mpobert.variants ['dense', 'mpobert'] does not build"),
        ({"finetune": {"variants": [{"name": "a", "model": "albert", "trainable": "auxiliary"}]}},
         "'a' has trainable: auxiliary, which freezes the shared central tensors that only the mpobert model has"),
    ],
)
def test_rules_across_keys_name_the_keys(repo_root, tmp_path, overlay, named):
    bad = write(tmp_path, "bad.yaml", overlay)
    with pytest.raises(ParamsError) as err:
        load_params([repo_root / "params.yaml", bad], repo_root / "workflow/schemas/params.schema.yaml")
    assert named in str(err.value)


def test_an_edited_dvc_yaml_is_read_again(tmp_path):
    """stage_param_keys keeps dvc.yaml's stages per version of the file: an edit is seen."""
    dvc = write(tmp_path, "dvc.yaml", {"stages": {"fit": {"cmd": "x", "params": ["lmd.threads"]}}})
    assert stage_param_keys("fit", dvc) == ["lmd.threads"]
    write(tmp_path, "dvc.yaml", {"stages": {"fit": {"cmd": "x", "params": ["lmd.alpha", "zoo"]}}})
    os.utime(dvc, ns=(dvc.stat().st_atime_ns, dvc.stat().st_mtime_ns + 1_000_000))  # a later edit, whatever the clock's grain
    assert stage_param_keys("fit", dvc) == ["lmd.alpha", "zoo"]


@pytest.mark.parametrize("rel", ["params.yaml", "dvc.yaml", "workflow/schemas/params.schema.yaml",
                                 "workflow/profiles/slurm/config.yaml"]
                         + [f"config/{name}.yaml" for name in ("smoke", "paper", "full", "real", "float32", "mpobert", "words")])
def test_read_yaml_reads_what_pyyamls_pure_python_safe_loader_reads(repo_root, rel):
    """read_yaml parses with libyaml (yaml.CSafeLoader) where PyYAML has it: the same data as the
    pure-Python SafeLoader on every YAML file the workflow reads."""
    assert yaml.__with_libyaml__  # PyYAML's wheels are built with it; without it read_yaml is the pure-Python path
    assert issubclass(params._UniqueKeyLoader, yaml.CSafeLoader)
    text = (repo_root / rel).read_text(encoding="utf-8")
    assert read_yaml(repo_root / rel) == yaml.load(text, Loader=yaml.SafeLoader)
