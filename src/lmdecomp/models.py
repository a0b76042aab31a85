"""Model sources: where a model named in params.yaml comes from, and how it is loaded.

Every model is named once under ``models:`` with exactly one source key:

``package: importname/sub/folder``
    a ``save_pretrained`` folder shipped inside an installed Python package, located by
    the package's path without importing it (importing some packages has side effects).
``path: some/folder``
    a local ``save_pretrained`` folder.
``hub: org/name`` with ``revision: <commit sha>``
    a Hugging Face hub model at a pinned revision, loaded through the standard cache
    (``HF_HOME`` / ``HF_HUB_CACHE``), so it works offline once the cache holds it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

SOURCE_KEYS = ("package", "path", "hub")
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
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        # Base-model loads of *ForMaskedLM checkpoints list the unused head weights;
        # that report is expected here and only hides real problems in the log.
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
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
        folder = _package_folder(name, spec["package"])
        check_model_folder(name, folder)
        version = package_version(spec["package"].partition("/")[0])
        if version is not None:
            source["version"] = version
        return ModelRef(name, source, str(folder))
    if kind == "path":
        folder = Path(spec["path"])
        check_model_folder(name, folder)
        return ModelRef(name, source, str(folder))
    revision = spec.get("revision")
    if not revision:
        raise ModelSourceError(
            f"model {name!r}: hub source {spec['hub']!r} needs a pinned revision (a commit sha) under revision:"
        )
    return ModelRef(name, source, spec["hub"], revision=str(revision))


def weights_sha256(model) -> str:
    """sha256 over the model's tensors (names, dtypes, shapes, bytes), whatever file format held them."""
    import torch

    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().contiguous().cpu()
        digest.update(f"{key}:{t.dtype}:{tuple(t.shape)}\n".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
