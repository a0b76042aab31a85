"""Hugging Face datasets as corpus and task sources: a hub id at a pinned revision, or a local
folder in hub layout.

Both are read by one call, ``datasets.load_dataset(folder, config)``, on a local folder:

``dataset: path/to/folder``
    data files (Parquet or JSON Lines) and a ``README.md`` whose YAML header declares the
    configs (``configs:``, optionally ``dataset_info:`` with the features), as on the hub.
``dataset: org/name`` with ``revision: <40-hex commit sha>``
    the snapshot of that commit in the standard hub cache (``HF_HUB_CACHE``,
    ``datasets--org--name/snapshots/<sha>/``). With the hub reachable, huggingface_hub fills it
    with the README and the data files of the one config named; offline (``HF_HUB_OFFLINE=1``
    or ``HF_DATASETS_OFFLINE=1``) it is found there. The folder is named by the commit, so the
    revision cannot drift. (``load_dataset("org/name", revision=…)`` itself would, offline, fall
    back to the newest prepared copy of *any* revision in ``HF_DATASETS_CACHE``.)

``load_dataset`` prepares an Arrow copy in ``HF_DATASETS_CACHE`` once and memory-maps it; rows
are read a batch at a time (:func:`iter_columns`), never gathered into lists of the whole split.

:func:`inspect` checks a spec against the dataset's metadata (configs, splits, column names
and types) before any row is read; with ``download=False`` it touches no network and returns
None for a hub dataset whose README is not cached, so ``snakemake -n`` plans offline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

__all__ = ["DatasetSourceError", "DatasetMeta", "inspect", "iter_columns", "is_hub_id", "describe_feature"]

_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9][A-Za-z0-9_.-]*)?")
_SHA = re.compile(r"[0-9a-f]{40}")


class DatasetSourceError(ValueError):
    """A ``dataset:`` source names something that does not exist or does not fit its use."""


@dataclass(frozen=True)
class DatasetMeta:
    """What :func:`inspect` found: the folder ``load_dataset`` reads, and the config's splits and features."""

    where: str  # for messages: "dataset 'nyu-mll/glue' (config 'sst2')"
    folder: Path
    config: str | None
    splits: tuple[str, ...]
    features: Any  # datasets.Features

    @property
    def columns(self) -> list[str]:
        return list(self.features)


def is_hub_id(dataset: str) -> bool:
    """A hub id (``name`` or ``org/name``) unless a folder of that name exists here, as in ``load_dataset``."""
    return not Path(dataset).is_dir() and bool(_HUB_ID.fullmatch(dataset))


def _check_static(spec: Mapping[str, Any], owner: str) -> None:
    """The rules that need no data: a folder exists, or a hub id carries a full commit sha."""
    dataset, revision = str(spec["dataset"]), spec.get("revision")
    if not is_hub_id(dataset):
        if not Path(dataset).is_dir():
            raise DatasetSourceError(f"{owner}: dataset {dataset!r} is neither a folder nor a hub id (org/name)")
        if revision is not None:
            raise DatasetSourceError(f"{owner}: revision: pins a hub dataset; {dataset!r} is a local folder, drop revision:")
        return
    if revision is None:
        raise DatasetSourceError(
            f"{owner}: hub dataset {dataset!r} needs revision: <commit sha> (40 hex digits, from the dataset's "
            f"'Files and versions' page), so that it cannot change under you; a local folder of that name does not exist")
    if not _SHA.fullmatch(str(revision)):
        # a branch or tag moves, and a short sha is not found offline
        raise DatasetSourceError(f"{owner}: revision {revision!r} of {dataset!r} is not a full commit sha "
                                 f"(40 lowercase hex digits); pin the commit itself")


_folders: dict[tuple[str, str, str | None], Path] = {}  # hub snapshots resolved in this process


def _offline() -> bool:
    import datasets

    return bool(datasets.config.HF_HUB_OFFLINE)  # HF_HUB_OFFLINE or HF_DATASETS_OFFLINE


def _config_patterns(readme: Path, config: str | None) -> list[str] | None:
    """The data files the README's YAML header declares for ``config`` (None: it declares no
    configs, so every file may be data); [] when the config is not declared (``load_dataset``
    then names the configs that are)."""
    from huggingface_hub.repocard import metadata_load

    configs = (metadata_load(readme) or {}).get("configs") or []
    if not configs:
        return None
    if config is None:
        chosen = [c for c in configs if c.get("default")] or (configs if len(configs) == 1 else [])
    else:
        chosen = [c for c in configs if c.get("config_name") == config]
    patterns: list[str] = []
    for entry in chosen[:1]:
        if "data_dir" in entry:
            patterns.append(f"{entry['data_dir'].rstrip('/')}/*")
        patterns.extend(_paths(entry.get("data_files", [])))
    return patterns


def _paths(data_files: Any) -> list[str]:
    """``data_files:`` of a README config (a path, a list, or ``{split, path}`` entries) → its paths."""
    if isinstance(data_files, str):
        return [data_files]
    if isinstance(data_files, Mapping):
        return _paths(data_files.get("path", []))
    return [p for item in data_files for p in _paths(item)]


def _hub_snapshot(spec: Mapping[str, Any], owner: str, download: bool) -> Path | None:
    """The hub cache's snapshot folder of ``dataset@revision``, holding the README and the data
    files of ``config`` (fetched when ``download`` and the hub is reachable); None when
    ``download`` is False and the README is not cached."""
    from huggingface_hub import errors, hf_hub_download, snapshot_download, try_to_load_from_cache

    repo, revision, config = str(spec["dataset"]), str(spec["revision"]), spec.get("config")
    key = (repo, revision, config)
    if key in _folders:
        return _folders[key]
    if not download:
        cached = try_to_load_from_cache(repo, "README.md", revision=revision, repo_type="dataset")
        return Path(cached).parent if isinstance(cached, str) else None
    where = f"{owner}: dataset {repo!r} at revision {revision}"
    try:
        try:
            readme = hf_hub_download(repo, "README.md", repo_type="dataset", revision=revision,
                                     local_files_only=_offline())
            patterns = _config_patterns(Path(readme), config)
        except errors.LocalEntryNotFoundError:
            raise
        except errors.EntryNotFoundError:  # a repository without a README: every file may be data
            patterns = None
        folder = Path(snapshot_download(repo, repo_type="dataset", revision=revision, local_files_only=_offline(),
                                        allow_patterns=None if patterns is None else ["README.md", *patterns]))
    except errors.LocalEntryNotFoundError as err:  # offline (or unreachable) and not cached
        from huggingface_hub import constants

        raise DatasetSourceError(
            f"{where} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and the hub cannot be reached"
            f"{' (offline mode is on)' if _offline() else ''}: run once with network, or check the name ({err})") from None
    except errors.RevisionNotFoundError:
        raise DatasetSourceError(f"{where}: no such revision in the dataset's repository; pin an existing commit") from None
    except errors.RepositoryNotFoundError:  # also gated and private ones without a login
        raise DatasetSourceError(f"{owner}: dataset {repo!r} does not exist on the hub, or needs a login "
                                 f"(hf auth login); check the name") from None
    _folders[key] = folder
    return folder


def _metadata(folder: Path, config: str | None, where: str,
              missing_ok: bool = False) -> tuple[tuple[str, ...], Any] | None:
    """(splits, features) of ``config`` from the README and the data files' schemas; no rows read.
    None, when ``missing_ok``, if the config's data files are not there (a hub snapshot whose
    README alone is cached yet)."""
    import datasets

    try:
        if config is None and len(names := datasets.get_dataset_config_names(str(folder))) > 1:
            raise DatasetSourceError(f"{where} declares the configs {names}; name one with config:")
        info = datasets.get_dataset_config_info(str(folder), config)
    except DatasetSourceError:
        raise
    except ValueError as err:  # an unknown config name: datasets lists the ones there are
        raise DatasetSourceError(f"{where}: {err}") from None
    except FileNotFoundError as err:
        if missing_ok:
            return None
        raise DatasetSourceError(f"{where}: no data files for this config under {folder} ({err})") from None
    if info.features is None:
        raise DatasetSourceError(f"{where}: the data files declare no columns; use Parquet or JSON Lines files")
    return tuple(info.splits or ()), info.features


def inspect(spec: Mapping[str, Any], owner: str, *, download: bool = True, splits: Sequence[str] = (),
            text_columns: Sequence[str] = (), columns: Sequence[str] = ()) -> DatasetMeta | None:
    """Check ``spec`` (``dataset``, ``config``, ``revision``) and that the dataset has ``splits``,
    ``columns`` and string ``text_columns``; raise :class:`DatasetSourceError` naming what is
    wrong. With ``download=False`` nothing is fetched: None when a hub dataset is not cached yet
    (its README, or the config's data files)."""
    _check_static(spec, owner)
    config = spec.get("config")
    where = f"{owner}: dataset {spec['dataset']!r}" + (f" (config {config!r})" if config else "")
    if is_hub_id(str(spec["dataset"])):
        folder = _hub_snapshot(spec, owner, download)
        metadata = _metadata(folder, config, where, missing_ok=not download) if folder else None
    else:
        folder = Path(str(spec["dataset"])).resolve()
        metadata = _metadata(folder, config, where)
    if metadata is None:
        return None
    found, features = metadata
    meta = DatasetMeta(where, folder, config, found, features)
    missing = [s for s in splits if s not in found]
    if missing:
        raise DatasetSourceError(f"{where} has no split {missing[0]!r}; its splits: {list(found)}")
    for column in [*text_columns, *columns]:
        if column not in features:
            raise DatasetSourceError(f"{where} has no column {column!r}; its columns: {meta.columns}")
    for column in text_columns:
        if describe_feature(features[column]) != "string":
            raise DatasetSourceError(f"{where}: column {column!r} holds {features[column]}, not text; "
                                     f"name a string column (its columns: {meta.columns})")
    return meta


def describe_feature(feature: Any) -> str:
    """``class_label``, ``string``, ``float``, ``int``, ``bool`` or ``other`` for a datasets feature."""
    import datasets

    if isinstance(feature, datasets.ClassLabel):
        return "class_label"
    dtype = getattr(feature, "dtype", None) if isinstance(feature, datasets.Value) else None
    if dtype in ("string", "large_string"):
        return "string"
    if dtype in ("bool",):
        return "bool"
    for prefix, kind in (("float", "float"), ("int", "int"), ("uint", "int")):
        if dtype and dtype.startswith(prefix):
            return kind
    return "other"


def iter_columns(meta: DatasetMeta, split: str, columns: Sequence[str],
                 batch_size: int = 1024) -> Iterator[dict[str, list]]:
    """Batches ``{column: values}`` of one split, in the dataset's row order, from the memory-mapped
    Arrow copy that ``load_dataset`` prepares (once) in ``HF_DATASETS_CACHE``."""
    import datasets

    data = datasets.load_dataset(str(meta.folder), meta.config, split=split)
    yield from data.select_columns(list(columns)).iter(batch_size=batch_size)
