"""Reading params.yaml: the one configuration shared by Snakemake and DVC.

Snakemake loads ``params.yaml`` and deep-merges every ``--configfile`` on top of it;
:func:`load_params` applies the same rule so a script called by either engine sees the
same configuration.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml


class ParamsError(ValueError):
    """params.yaml (or a config merged on top of it) is malformed."""


# Top-level keys that a later config file replaces whole instead of merging into: an overlay
# lists exactly the models it runs (config/smoke.yaml runs three, not params.yaml's eight plus three).
REPLACED_WHOLE = ("models",)


def merge_params(base: Mapping[str, Any], update: Mapping[str, Any], top: bool = True) -> dict[str, Any]:
    """Deep-merge ``update`` into a copy of ``base``: mappings merge key by key, anything
    else (lists included) is replaced, as Snakemake's ``update_config`` does; the top-level
    keys in :data:`REPLACED_WHOLE` are replaced whole."""
    merged = copy.deepcopy(dict(base))
    for key, value in update.items():
        whole = top and key in REPLACED_WHOLE
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping) and not whole:
            merged[key] = merge_params(merged[key], value, top=False)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """A SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently: a second model of the same name would replace the first). Keys brought in by a
    ``<<:`` merge may be overridden, as YAML intends.

    It parses with libyaml where PyYAML was built with it (its wheels are), about 10 × faster than
    the pure-Python parser: every Snakemake call reads dvc.yaml, params.yaml and the schema."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found the key {key!r} twice (first {seen[key]}); every key of a mapping must be unique",
                        key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"config file {path} does not exist")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        raise ParamsError(f"config file {path} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ParamsError(f"config file {path} must hold a mapping at the top level")
    return data


def validate_params(params: Mapping[str, Any], schema_path: str | os.PathLike) -> None:
    """Validate against the JSON schema, naming the offending key in the error."""
    import jsonschema

    schema = read_yaml(schema_path)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(params), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for err in errors:
            where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
            lines.append(f"  {where}: {_model_source_hint(err) or err.message}")
        raise ParamsError(
            "params do not match workflow/schemas/params.schema.yaml:\n" + "\n".join(lines)
        )


def _model_source_hint(err) -> str | None:
    """A model spec that fits none of the source shapes gets jsonschema's "is not valid under
    any of the given schemas"; say which keys a source needs instead."""
    path = list(err.absolute_path)
    if err.validator != "oneOf" or len(path) != 2 or path[0] != "models" or not isinstance(err.instance, Mapping):
        return None
    if "hub" in err.instance and "revision" not in err.instance:
        return "a hub: model needs revision: <commit sha> (40 hex digits), so that it cannot change under you"
    sources = sorted(k for k in ("package", "path", "hub", "parts", "pretrain") if k in err.instance)
    return (f"give exactly one source (package, path, hub with revision, parts or pretrain); "
            f"got {sources or 'none'}")


# Both engines run the scripts from the workflow's root folder.
SCHEMA_PATH = Path("workflow/schemas/params.schema.yaml")


def load_params(
    paths: Sequence[str | os.PathLike], schema_path: str | os.PathLike = SCHEMA_PATH
) -> dict[str, Any]:
    """Merge the config files in order (later ones win) and validate the result."""
    if not paths:
        raise ParamsError("no config file given")
    params: dict[str, Any] = {}
    for path in paths:
        params = merge_params(params, read_yaml(path))
    if not Path(schema_path).is_file():
        raise ParamsError(f"schema {schema_path} not found: run from the workflow's root folder")
    if isinstance(params.get("models"), list):  # the format before models became a mapping
        raise ParamsError("models: is a mapping from model name to source; write each "
                          "`- {name: minilm, package: …}` as `minilm: {package: …}`")
    validate_params(params, schema_path)
    check_params(params)
    return params


def repeated_names(specs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ``name`` values (as reprs, sorted) that more than one of ``specs`` carries."""
    names = [spec.get("name") for spec in specs]
    return sorted({repr(n) for n in names if names.count(n) > 1})


def check_params(params: Mapping[str, Any]) -> None:
    """Rules across keys that the JSON schema does not express; every broken one is named."""
    problems = []
    names = list(params.get("models", {}))
    # A document is keyed (and its split seeded) by (source name, doc id); lmdecomp.data.corpus
    # checks this too when it runs.
    twice = repeated_names(params.get("corpus", {}).get("sources", []))
    if twice:
        problems.append(f"corpus.sources: more than one source is named {', '.join(twice)}; give every source its own name")
    finetune, built = params.get("finetune", {}), params.get("mpobert", {}).get("variants", [])
    for key in ("tasks", "variants"):
        # a name is a results/ folder and a DVC stage: two specs of one name would write one place
        twice = repeated_names(finetune.get(key, []))
        if twice:
            problems.append(f"finetune.{key}: more than one entry is named {', '.join(twice)}; give each its own name")
    for spec in finetune.get("variants", []):
        if built and spec.get("model") not in built:
            problems.append(f"finetune.variants: {spec.get('name')!r} fine-tunes the model {spec.get('model')!r}, "
                            f"which mpobert.variants {list(built)} does not build; add it there")
        if spec.get("trainable", "all") == "auxiliary" and spec.get("model") != "mpobert":
            problems.append(f"finetune.variants: {spec.get('name')!r} has trainable: auxiliary, which freezes the "
                            f"shared central tensors that only the mpobert model has (model: {spec.get('model')!r})")
    for key, wanted in (("mpo.models", params.get("mpo", {}).get("models", [])),
                        ("mpobert.base", [params.get("mpobert", {}).get("base")] if "mpobert" in params else [])):
        unknown = [w for w in wanted if w not in names]
        if unknown:
            problems.append(f"{key}: {unknown} not under models: (known: {names})")
    embed = params.get("embed", {})
    pooling = embed.get("pooling", "mean")
    if embed.get("overflow") == "windows" and pooling != "mean":
        problems.append(f"embed.overflow: windows averages over a long text's windows, which needs "
                        f"embed.pooling: mean (got {pooling}); set embed.overflow: truncate")
    if embed.get("granularity") == "word" and pooling != "mean":
        problems.append(f"embed.granularity: word averages each word's tokens, which needs embed.pooling: mean (got {pooling})")
    for key in ("corpus", "finetune"):
        fractions = params.get(key, {}).get("splits")
        if fractions and abs(sum(fractions.values()) - 1.0) > 1e-9:
            problems.append(f"{key}.splits must sum to 1, got {dict(fractions)} (sum {sum(fractions.values()):g})")
    if params.get("lmd", {}).get("shards_per_job") and params.get("corpus", {}).get("n_sequences") is None:
        problems.append("lmd.shards_per_job needs a number in corpus.n_sequences: the moments jobs are "
                        "planned before the corpus exists (or set lmd.shards_per_job: null)")
    if problems:
        raise ParamsError("params break these rules:\n" + "\n".join(f"  {p}" for p in problems))


# Both engines run the scripts from the workflow's root folder, where dvc.yaml lists the params
# each stage reads.
DVC_PATH = Path("dvc.yaml")


def stage_param_keys(stage: str, dvc_path: str | os.PathLike = DVC_PATH) -> list[str]:
    """The params.yaml keys (dotted paths) that dvc.yaml lists for ``stage``, as written there:
    a foreach stage may list ``models.${key}`` (:func:`bind_param_keys` fills it in)."""
    stages = dvc_stages(dvc_path)
    if stage not in stages:
        raise ParamsError(f"{dvc_path} has no stage {stage!r}; stages: {sorted(stages)}")
    spec = stages[stage].get("do", stages[stage])
    return [k for entry in spec.get("params") or [] for k in ([entry] if isinstance(entry, str) else entry)]


def dvc_stages(dvc_path: str | os.PathLike = DVC_PATH) -> dict[str, Any]:
    """dvc.yaml's stages, read once per version of the file: the Snakefile asks for every stage's
    keys and code, and the modification time makes an edited file be read again. Callers must
    not change what it returns."""
    path = Path(dvc_path).resolve()
    return _read_stages(path, path.stat().st_mtime_ns if path.is_file() else None)


@functools.lru_cache(maxsize=4)
def _read_stages(path: Path, mtime_ns: int | None) -> dict[str, Any]:
    return read_yaml(path).get("stages", {})


_INTERPOLATION = re.compile(r"\$\{([^}]+)\}")


def bind_param_keys(keys: Sequence[str], params: Mapping[str, Any], stage: str, **bindings: str) -> list[str]:
    """``keys`` with DVC's ``${...}`` filled in as DVC fills them for one job: ``${key}`` or
    ``${item}`` from ``bindings`` (the foreach element the job runs, e.g. key="minilm"), any
    other ``${a.b}`` from ``params``."""
    def value(match):
        name = match.group(1)
        if name in bindings:
            return str(bindings[name])
        node: Any = params
        for part in name.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise ParamsError(f"dvc.yaml stage {stage!r} lists a params key with ${{{name}}}, which is neither "
                                  f"given for this job ({sorted(bindings)}) nor a key of the params")
            node = node[part]
        return str(node)

    return [_INTERPOLATION.sub(value, key) for key in keys]


class UnlistedParam(ParamsError, KeyError):
    """A job script read a params key its dvc.yaml stage does not list."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0])


class StageParams(dict):
    """The part of the params a stage lists in dvc.yaml, as nested dicts.

    Reading a key that exists in the full params but is not listed raises
    :class:`UnlistedParam`: the engines would not rerun the job when that key changes
    (DVC tracks the listed keys, the Snakemake rules take theirs from the same list), so a
    script must not see it. Missing keys that are absent from the full params behave as in
    a plain dict.
    """

    def __init__(self, listed: Mapping[str, Any], full: Mapping[str, Any], stage: str, prefix: str = ""):
        super().__init__(
            (k, StageParams(v, full[k], stage, f"{prefix}{k}.") if isinstance(v, dict) else v)
            for k, v in listed.items()
        )
        self._full, self._stage, self._prefix = full, stage, prefix

    def _unlisted(self, key: str) -> UnlistedParam:
        return UnlistedParam(
            f"stage {self._stage!r} reads params key '{self._prefix}{key}', which dvc.yaml does not "
            f"list under its params: add it there, or the stage will not rerun when it changes"
        )

    def __missing__(self, key: str) -> Any:
        if key in self._full:
            raise self._unlisted(key)
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self and key in self._full:
            raise self._unlisted(key)
        return super().get(key, default)


def restrict_params(params: Mapping[str, Any], keys: Sequence[str], stage: str) -> StageParams:
    """The listed dotted ``keys`` of ``params`` (a listed key that is absent stays absent)."""
    listed: dict[str, Any] = {}
    for key in keys:
        *parents, leaf = key.split(".")
        source, target = params, listed
        for part in parents:
            source = source.get(part, {}) if isinstance(source, Mapping) else {}
            target = target.setdefault(part, {})
        if isinstance(source, Mapping) and leaf in source:
            target[leaf] = copy.deepcopy(source[leaf])
    return StageParams(listed, params, stage)


def load_stage_params(paths: Sequence[str | os.PathLike], stage: str, **bindings: str) -> StageParams:
    """:func:`load_params`, restricted to the keys dvc.yaml lists for ``stage``; ``bindings``
    name the foreach element of a job (``key="minilm"`` for ``models.${key}``)."""
    params = load_params(paths)
    return restrict_params(params, bind_param_keys(stage_param_keys(stage), params, stage, **bindings), stage)


def model_names(params: Mapping[str, Any]) -> list[str]:
    """The models in config order (the column order of the joint LMD moments)."""
    return list(params["models"])


def model_spec(params: Mapping[str, Any], name: str) -> dict[str, Any]:
    """One model's source spec, with its ``name``."""
    if name not in params["models"]:
        raise ParamsError(f"model {name!r} is not listed under models: in the config; known: {model_names(params)}")
    return {"name": name, **params["models"][name]}
