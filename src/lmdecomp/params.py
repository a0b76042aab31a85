"""Reading params.yaml: the one configuration shared by Snakemake and DVC.

Snakemake loads ``params.yaml`` and deep-merges every ``--configfile`` on top of it;
:func:`load_params` applies the same rule so a script called by either engine sees the
same configuration.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml


class ParamsError(ValueError):
    """params.yaml (or a config merged on top of it) is malformed."""


def merge_params(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``update`` into a copy of ``base``: mappings merge key by key, anything
    else (lists included) is replaced. This is Snakemake's ``update_config`` rule."""
    merged = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_params(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
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
            lines.append(f"  {where}: {err.message}")
        raise ParamsError(
            "params do not match workflow/schemas/params.schema.yaml:\n" + "\n".join(lines)
        )


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
    validate_params(params, schema_path)
    return params


def model_names(params: Mapping[str, Any]) -> list[str]:
    return [m["name"] for m in params["models"]]


def model_spec(params: Mapping[str, Any], name: str) -> dict[str, Any]:
    for spec in params["models"]:
        if spec["name"] == name:
            return dict(spec)
    raise ParamsError(f"model {name!r} is not listed under models: in the config; known: {model_names(params)}")
