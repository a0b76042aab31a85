"""GGUF model files (llama.cpp's format, how decoder LLMs ship quantised) turned once into a
plain ``save_pretrained`` folder that every later stage reads like any other model.

A ``models:`` entry names a GGUF file through the usual sources: ``package:`` or ``path:``
ending in ``.gguf``, or ``parts:`` whose distributions each ship one ``*.gguf.partNN`` file
(concatenated in the order given, checked against ``sha256:``). The ``model`` stage
(:func:`lmdecomp.models.sources.prepare_model`) then calls :func:`convert`:

1. transformers' GGUF loader dequantises every tensor to float32
   (``AutoModel.from_pretrained(folder, gguf_file=…)``) and rebuilds the tokenizer;
2. a model loaded that way is marked quantised and cannot be saved, so the same architecture
   is built from its config without ``quantization_config`` and given the loaded state dict;
3. model and tokenizer are saved as safetensors + tokenizer.json.

The base model is kept (``AutoModel``: hidden states, no LM head), as the embed stage loads it.
``model.json`` records the GGUF file, its sha256 and its quantisation type (:func:`describe`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmdecomp.atomic import sha256_file

SUFFIX = ".gguf"
PART_MARK = ".gguf.part"


class GGUFError(ValueError):
    """A GGUF file is missing or not a model transformers can read."""


def quantisation(path: Path) -> str:
    """The file's quantisation type as llama.cpp names it (``MOSTLY_Q4_1``, ``MOSTLY_Q4_K_M``…)."""
    from gguf import GGUFReader, LlamaFileType

    field = GGUFReader(path).fields.get("general.file_type")
    if field is None:
        return "unknown"
    value = int(field.parts[field.data[0]][0])
    try:
        return LlamaFileType(value).name
    except ValueError:
        return f"file_type {value}"


def describe(path: Path, sha256: str | None = None) -> dict[str, Any]:
    """The ``gguf`` entry of ``model.json``: file name, sha256 and quantisation type."""
    return {"file": path.name, "sha256": sha256 or sha256_file(path), "quantization": quantisation(path)}


def convert(path: Path, out_dir: Path) -> None:
    """Write the GGUF model at ``path`` into ``out_dir`` as a plain float32 folder (module docstring)."""
    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModel.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise GGUFError(f"{path} is not a GGUF model transformers can read: {exc}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved folder holds plain float32 weights
    torch.manual_seed(0)  # buffers a state dict lacks are the same every time
    plain = type(loaded)(config).to(torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if not k.endswith("inv_freq")]:
        raise GGUFError(f"{path}: the dequantised weights do not fit {type(plain).__name__} "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    plain.eval().save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
