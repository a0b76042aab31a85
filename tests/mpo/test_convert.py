"""lmdecomp.mpo.convert: converting a model's linears to MPOLinear and saving / loading it, against
the unconverted model's outputs."""

from __future__ import annotations

import copy

import pytest
import torch

from lmdecomp.mpo.convert import convert_linears, load_converted, save_converted
from lmdecomp.mpo.decompose import factorize
from lmdecomp.mpo.layer import MPOLinear


@pytest.fixture(scope="module")
def tiny_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256, vocab_size=100
    )
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    inputs = {
        "input_ids": torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(1)),
        "attention_mask": torch.ones(2, 12, dtype=torch.long),
    }
    return model, inputs


def outputs(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).last_hidden_state


def test_convert_full_rank_matches_original(tiny_bert):
    model, inputs = tiny_bert
    converted = copy.deepcopy(model)
    records = convert_linears(converted)
    expected_paths = {
        f"encoder.layer.{i}.{p}"
        for i in range(2)
        for p in (
            "attention.self.query",
            "attention.self.key",
            "attention.self.value",
            "attention.output.dense",
            "intermediate.dense",
            "output.dense",
        )
    }
    assert set(records) == expected_paths
    assert isinstance(converted.encoder.layer[1].output.dense, MPOLinear)
    assert not isinstance(converted.pooler.dense, MPOLinear)
    assert records["encoder.layer.0.intermediate.dense"]["out_shape"] == factorize(256)
    assert all(r["rel_error"] < 1e-6 for r in records.values())
    assert (outputs(converted, inputs) - outputs(model, inputs)).abs().max().item() <= 1e-4


def test_suffix_targets_match_precisely(tiny_bert):
    model, _ = tiny_bert
    ffn_out = convert_linears(copy.deepcopy(model), targets=("output.dense",))
    assert set(ffn_out) == {"encoder.layer.0.output.dense", "encoder.layer.1.output.dense"}
    attn_out = convert_linears(copy.deepcopy(model), targets=("attention.output.dense",))
    assert set(attn_out) == {"encoder.layer.0.attention.output.dense", "encoder.layer.1.attention.output.dense"}
    with pytest.raises(ValueError, match="match no nn.Linear"):
        convert_linears(copy.deepcopy(model), targets=("dense.output",))


def test_save_load_round_trip(tiny_bert, tmp_path):
    model, inputs = tiny_bert
    converted = copy.deepcopy(model)
    records = convert_linears(converted, max_bond=4, shapes={64: [4, 4, 4]}, n_cores=3)
    assert records["encoder.layer.0.attention.self.query"]["bond_dims"] == [1, 4, 4, 1]
    save_converted(converted, tmp_path / "mpo_bert")
    loaded = load_converted(tmp_path / "mpo_bert")
    assert type(loaded) is type(model)
    for path, record in records.items():
        assert list(loaded.get_submodule(path).bond_dims) == record["bond_dims"]
    assert torch.equal(outputs(loaded, inputs), outputs(converted, inputs))


def test_save_load_keeps_the_saved_dtype(tiny_bert, tmp_path):
    model, inputs = tiny_bert
    converted = copy.deepcopy(model).double()
    convert_linears(converted, max_bond=4, shapes={64: [4, 4, 4]}, n_cores=3)
    save_converted(converted, tmp_path / "f64")
    loaded = load_converted(tmp_path / "f64")
    assert {p.dtype for p in loaded.parameters()} == {torch.float64}
    assert torch.equal(outputs(loaded, inputs), outputs(converted, inputs))


def test_match_saved_dtype_warns_on_mixed_floating_dtypes(tmp_path):
    from safetensors.torch import save_file

    from lmdecomp.mpo.convert import match_saved_dtype

    module = torch.nn.Linear(2, 2)
    save_file({"weight": torch.zeros(2, 2, dtype=torch.float64), "bias": torch.zeros(2, dtype=torch.float16)}, str(tmp_path / "mixed.safetensors"))
    with pytest.warns(UserWarning, match="several floating dtypes"):
        match_saved_dtype(module, tmp_path / "mixed.safetensors")
    assert module.weight.dtype == torch.float32
    save_file({"weight": torch.zeros(2, 2, dtype=torch.bfloat16), "steps": torch.zeros(1, dtype=torch.int64)}, str(tmp_path / "bf16.safetensors"))
    match_saved_dtype(module, tmp_path / "bf16.safetensors")
    assert module.weight.dtype == module.bias.dtype == torch.bfloat16
