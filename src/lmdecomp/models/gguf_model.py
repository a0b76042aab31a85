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
    from gguf import LlamaFileType

    value = _file_type(path)
    if value is None:
        return "unknown"
    try:
        return LlamaFileType(value).name
    except ValueError:
        return f"file_type {value}"


def _file_type(path: Path) -> int | None:
    """``general.file_type`` from the file's metadata.

    transformers' metadata reader steps over the vocabulary's strings without decoding them:
    0.1 s for Gemma-3's 262,144 tokens, where gguf's ``GGUFReader`` builds numpy views of
    every token first (about 24 s on one Zen 3 core). ``GGUFReader`` is the fallback for a
    transformers without that reader."""
    try:
        from transformers.integrations.gguf import read_gguf_metadata
    except ImportError:
        from gguf import GGUFReader

        field = GGUFReader(path).fields.get("general.file_type")
        return None if field is None else int(field.parts[field.data[0]][0])
    value = read_gguf_metadata(str(path))[0].get("general.file_type")
    return None if value is None else int(value)


def describe(path: Path, sha256: str | None = None) -> dict[str, Any]:
    """The ``gguf`` entry of ``model.json``: file name, sha256 and quantisation type."""
    return {"file": path.name, "sha256": sha256 or sha256_file(path), "quantization": quantisation(path)}


def _tokenizer_type(config) -> dict[str, str]:
    """``tokenizer_type=`` for AutoTokenizer where the model's type names a tokenizer class.

    Without it AutoTokenizer parses the whole file once more for a config (transformers'
    GGUFReader pass: about 24 s for Gemma-3 on one Zen 3 core); with it, it goes straight to
    the class the config would have chosen."""
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    return {"tokenizer_type": config.model_type} if TOKENIZER_MAPPING_NAMES.get(config.model_type) else {}


def convert(path: Path, out_dir: Path) -> None:
    """Write the GGUF model at ``path`` into ``out_dir`` as a plain float32 folder (module docstring)."""
    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        loaded = AutoModel.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, **_tokenizer_type(loaded.config))
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
