"""Word-level rows: word spans, subword-to-word alignment for WordPiece, byte-level BPE and
Unigram tokenizers on hand-made strings, and word embeddings aligned across two models with
different tokenizers, each against hand-listed expectations or an explicit loop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models as tok_models, normalizers, pre_tokenizers
from tokenizers.processors import TemplateProcessing

from conftest import write_sequences
from lmdecomp.models import embed
from lmdecomp import lmd
from lmdecomp.data import shards, words
from lmdecomp.models import sources as lmd_models

# Accents (ü, é, ï), an apostrophe, punctuation, and words cut into several pieces.
TEXT = "Zürich's unaffable café, naïvely!"
WORDS = ["Zürich", "'", "s", "unaffable", "café", ",", "naïvely", "!"]


def wordpiece() -> Tokenizer:
    vocab = ["[UNK]", "[CLS]", "[SEP]", "zurich", "'", "s", "un", "##aff", "##able", "cafe", ",", "na", "##ive",
             "##ly", "!"]
    tok = Tokenizer(tok_models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    return tok


def byte_bpe(specials: tuple[str, ...] = ()) -> Tokenizer:
    vocab = {c: i for i, c in enumerate([*specials, *sorted(pre_tokenizers.ByteLevel.alphabet())])}
    merges = [("Ġ", "u"), ("Ġu", "n"), ("a", "f"), ("af", "f"), ("'", "s"), ("Ã", "©")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    tok = Tokenizer(tok_models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return tok


def unigram() -> Tokenizer:
    pieces = [("<unk>", 0.0), ("▁", -3.0), ("▁Zürich", -2.0), ("'", -3.0), ("s", -3.0), ("▁un", -2.0), ("aff", -2.0),
              ("able", -2.0), ("▁caf", -2.0), ("é", -3.0), (",", -3.0), ("▁na", -2.0), ("ï", -3.0), ("ve", -2.0),
              ("ly", -2.0), ("!", -3.0)]
    tok = Tokenizer(tok_models.Unigram(pieces, unk_id=0, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


# Per word, the tokens that belong to it, written out by hand from each tokenizer's pieces.
EXPECTED = {
    "wordpiece": [["zurich"], ["'"], ["s"], ["un", "##aff", "##able"], ["cafe"], [","], ["na", "##ive", "##ly"], ["!"]],
    # byte-level: ü and ï are two byte tokens each with the same character span; "'s" is one
    # token over the words "'" and "s"; a lone "Ġ" (a space) belongs to no word.
    "bpe": [["Z", "Ã", "¼", "r", "i", "c", "h"], ["'s"], ["'s"], ["Ġun", "aff", "a", "b", "l", "e"],
            ["c", "af", "Ã©"], [","], ["n", "a", "Ã", "¯", "v", "e", "l", "y"], ["!"]],
    "unigram": [["▁Zürich"], ["'"], ["s"], ["▁un", "aff", "able"], ["▁caf", "é"], [","], ["▁na", "ï", "ve", "ly"],
                ["!"]],
}
TOKENIZERS = {"wordpiece": wordpiece, "bpe": byte_bpe, "unigram": unigram}


def groups(spans, encoding, keep: int | None = None):
    offsets = encoding.offsets[:keep]
    # truncation cut the text where the first token it dropped starts
    cut_at = None if keep is None else next(a for a, b in encoding.offsets[keep:] if b > a)
    word, token = words.token_word_pairs(spans, offsets, cut_at)
    out = [[] for _ in spans]
    for w, t in zip(word, token):
        out[w].append(encoding.tokens[t])
    return out


def test_word_spans_cut_whitespace_and_every_punctuation_mark():
    spans = words.word_spans(TEXT)
    assert [TEXT[a:b] for a, b in spans] == WORDS
    assert words.word_spans("  ").shape == (0, 2)
    assert [("a.b" + " ")[a:b] for a, b in words.word_spans("a.b ")] == ["a", ".", "b"]


@pytest.mark.parametrize("kind", sorted(TOKENIZERS))
def test_tokens_are_assigned_to_the_words_they_overlap(kind):
    spans = words.word_spans(TEXT)
    assert groups(spans, TOKENIZERS[kind]().encode(TEXT)) == EXPECTED[kind]


@pytest.mark.parametrize("kind,keep,covered", [
    # WordPiece cut after "##aff" ([CLS] zurich ' s un ##aff): "unaffable" lost its tail
    ("wordpiece", 6, 3),
    # BPE cut inside "café" (…, Ġ, c, af): café is dropped, unaffable is whole
    ("bpe", 17, 4),
    # Unigram cut after "▁na", "ï": naïvely is dropped
    ("unigram", 11, 6),
])
def test_words_a_truncation_cuts_are_dropped_whole(kind, keep, covered):
    spans = words.word_spans(TEXT)
    got = groups(spans, TOKENIZERS[kind]().encode(TEXT), keep=keep)
    assert got[:covered] == EXPECTED[kind][:covered]
    assert got[covered:] == [[] for _ in WORDS[covered:]]


def test_a_cut_between_the_bytes_of_a_words_last_character_drops_the_word():
    """Byte-level BPE gives both byte tokens of "ï" the character's span: cut between them, the
    kept "Ã" ends where "naï" ends, yet the word lost a token."""
    text = "naï is"
    encoding = byte_bpe().encode(text)
    assert encoding.tokens[:4] == ["n", "a", "Ã", "¯"] and encoding.offsets[2] == encoding.offsets[3] == (2, 3)
    spans = words.word_spans(text)
    assert groups(spans, encoding, keep=3) == [[], []]  # naï cut into; "is" cut off
    assert groups(spans, encoding, keep=4) == [["n", "a", "Ã", "¯"], []]


def test_special_tokens_and_empty_texts_give_no_pairs():
    word, token = words.token_word_pairs(words.word_spans("hi"), [(0, 0), (0, 0)], None)
    assert len(word) == len(token) == 0
    word, token = words.token_word_pairs(words.word_spans(""), [(0, 0)], None)
    assert len(word) == 0


# ------------------------------------------------------------------ embeddings per word

SENTENCES = [
    "Zürich's unaffable café, naïvely!",
    "Markets rose sharply on Tuesday after the central bank held rates.",
    "Ok.",
    "Punctuation!?; and (brackets) [too] -- with naïve accents: déjà vu.",
    "Numbers like 3.14159 and 2,718 appear in long, long, long, long sentences that get truncated.",
]


@pytest.fixture(scope="module")
def bpe_model_dir(tmp_path_factory):
    """A tiny RoBERTa with the byte-level BPE tokenizer above (a different tokenizer from the
    WordPiece of ``tiny_model_dir``)."""
    from transformers import PreTrainedTokenizerFast, RobertaConfig, RobertaModel

    folder = tmp_path_factory.mktemp("tiny-roberta")
    tok = byte_bpe(specials=("<s>", "<pad>", "</s>", "<unk>"))
    tok.post_processor = TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>")
    config = RobertaConfig(vocab_size=tok.get_vocab_size(), hidden_size=24, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=48, max_position_embeddings=160, pad_token_id=1)
    torch.manual_seed(7)
    RobertaModel(config).eval().save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


@pytest.fixture()
def sentences(tmp_path):
    return write_sequences(tmp_path / "sequences.parquet", SENTENCES, ["train", "val", "test", "train", "test"],
                           np.arange(len(SENTENCES)) * 3)


def reference_cut(folder, text: str, max_length: int) -> int | None:
    """The character where truncation at ``max_length`` cut ``text``: the start of the first
    real token that the untruncated tokenisation has beyond the truncated one's; None if whole."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    real = [[(a, b) for a, b in tok(text, truncation=cut, max_length=max_length,
                                     return_offsets_mapping=True)["offset_mapping"] if b > a] for cut in (False, True)]
    whole, kept = real
    return whole[len(kept)][0] if len(whole) > len(kept) else None


def reference_words(folder, text: str, layer: int, max_length: int) -> dict[int, np.ndarray]:
    """Word vectors of one sentence by an explicit loop: unbatched forward pass, then for every
    word the mean of the tokens whose character span overlaps it, if the word is complete."""
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    enc = tok(text, truncation=True, max_length=max_length, return_offsets_mapping=True, return_tensors="pt")
    offsets = enc.pop("offset_mapping")[0].tolist()
    cut_at = reference_cut(folder, text, max_length)
    with torch.no_grad():
        h = model(**enc, output_hidden_states=True).hidden_states[layer][0].double().numpy()
    out = {}
    for w, (start, end) in enumerate(words.word_spans(text).tolist()):
        if cut_at is not None and end > cut_at:
            continue
        members = [t for t, (a, b) in enumerate(offsets) if b > a and max(a, start) < min(b, end)]
        if members:
            out[w] = sum(h[t] for t in members) / len(members)
    return out


def test_word_rows_match_an_explicit_loop_and_align_across_tokenizers(tiny_model_dir, bpe_model_dir, sentences,
                                                                       tmp_path):
    cfg = {"layer": -1, "layers": [0], "granularity": "word", "pooling": "mean", "batch_tokens": 200,
           "shard_rows": 2, "threads": 1, "device": "cpu", "dtype": "float32", "overflow": "truncate"}
    limits = {"wordpiece": 16, "bpe": 60}
    folders = {"wordpiece": tiny_model_dir, "bpe": bpe_model_dir}
    expected_keys = {}
    for name, folder in folders.items():
        ref = lmd_models.resolve({"name": name, "path": str(folder)})
        manifest = embed.embed_model(ref, sentences, tmp_path / name, {**cfg, "max_length": limits[name]},
                                     progress=False)
        parts = list(shards.iter_shards(tmp_path / name, columns=["embedding", "hidden_0"]))
        assert [e["sequences"] for e in manifest["shards"]] == [2, 2, 1]
        keys = [(int(s), int(w)) for p in parts for s, w in zip(p.seq_id, p.word_idx)]
        assert keys == sorted(keys)
        got = {k: (e, h0) for p in parts for k, e, h0 in zip(
            zip(p.seq_id.tolist(), p.word_idx.tolist()), p.columns["embedding"], p.columns["hidden_0"])}
        expected_keys[name] = set()
        for i, text in enumerate(SENTENCES):
            last = reference_words(folder, text, -1, limits[name])
            first = reference_words(folder, text, 0, limits[name])
            for w, vec in last.items():
                expected_keys[name].add((3 * i, w))
                np.testing.assert_allclose(got[3 * i, w][0], vec, atol=3e-5)
                np.testing.assert_allclose(got[3 * i, w][1], first[w], atol=3e-5)
        assert set(got) == expected_keys[name]
        n_words = sum(len(words.word_spans(t)) for t in SENTENCES)
        assert manifest["words"] == n_words
        cuts = [reference_cut(folder, text, limits[name]) for text in SENTENCES]
        n_cut = sum(c is not None and int(end > c) for t, c in zip(SENTENCES, cuts) for _, end in words.word_spans(t))
        assert manifest["words_truncated"] == n_cut > 0
        assert manifest["words_without_tokens"] == n_words - len(expected_keys[name]) - n_cut
        assert manifest["layers"] == [0, 2] and manifest["granularity"] == "word"

    # LMD keeps the words both models have, and says how many it dropped.
    common = expected_keys["wordpiece"] & expected_keys["bpe"]
    assert common != expected_keys["wordpiece"] and common != expected_keys["bpe"]
    moments = lmd.accumulate_moments({n: tmp_path / n for n in folders})
    split_of = {3 * i: s for i, s in enumerate(["train", "val", "test", "train", "test"])}
    for split in lmd.SPLITS:
        assert moments.n[split] == sum(split_of[s] == split for s, _ in common)
    assert moments.info == {"granularity": "word", "words": n_words, "words_kept": len(common),
                            "words_dropped": n_words - len(common)}
    # ...and the cross-products are those of the aligned rows, in float64.
    rows = {n: {k: v for p in shards.iter_shards(tmp_path / n) for k, v in
                zip(zip(p.seq_id.tolist(), p.word_idx.tolist()), p.embedding)} for n in folders}
    train = sorted(k for k in common if split_of[k[0]] == "train")
    x = np.array([np.concatenate([rows["wordpiece"][k], rows["bpe"][k]]) for k in train], dtype=np.float64)
    np.testing.assert_allclose(moments.cross["train"], x.T @ x, rtol=1e-10, atol=1e-10)
    blocks = lmd.accumulate_block_moments({n: tmp_path / n for n in folders}, rows_per_block=2)
    assert len(blocks) == 3  # 5 sentences in blocks of 2 (a word row goes with its sentence)
    np.testing.assert_allclose(blocks.total().cross["train"], x.T @ x, rtol=1e-10, atol=1e-10)


def reference_window_words(folder, text: str, max_length: int) -> dict[int, np.ndarray]:
    """Word vectors when the text is cut by hand into windows of max_length − (special tokens)
    tokens, each run alone: a word's vector is the mean of its tokens over all windows."""
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    room = max_length - tok.num_special_tokens_to_add()
    states, offsets = [], []
    for start in range(0, len(enc["input_ids"]), room):
        ids = enc["input_ids"][start : start + room]
        window = torch.tensor([[tok.cls_token_id, *ids, tok.sep_token_id]])  # BERT's template
        with torch.no_grad():
            h = model(input_ids=window, output_hidden_states=True).hidden_states[-1][0].double().numpy()
        states += list(h[1 : 1 + len(ids)])
        offsets += enc["offset_mapping"][start : start + room]
    out = {}
    for w, (start, end) in enumerate(words.word_spans(text).tolist()):
        members = [t for t, (a, b) in enumerate(offsets) if b > a and max(a, start) < min(b, end)]
        out[w] = sum(states[t] for t in members) / len(members)
    return out


def test_windows_give_every_word_a_row_even_across_a_window_boundary(tiny_model_dir, sentences, tmp_path):
    ref = lmd_models.resolve({"name": "t", "path": str(tiny_model_dir)})
    # max_length 7: windows of 5 WordPiece tokens split "unaffable", "déjà", "14159" and "718"
    cfg = {"layer": -1, "granularity": "word", "pooling": "mean", "max_length": 7, "batch_tokens": 64,
           "shard_rows": 2, "threads": 1, "device": "cpu", "dtype": "float32"}
    manifest = embed.embed_model(ref, sentences, tmp_path / "w", cfg, progress=False)
    got = {(int(s), int(w)): e for p in shards.iter_shards(tmp_path / "w")
           for s, w, e in zip(p.seq_id, p.word_idx, p.embedding)}
    n_words = sum(len(words.word_spans(t)) for t in SENTENCES)
    assert len(got) == manifest["words"] == n_words and manifest["words_truncated"] == 0
    assert manifest["windowed_sequences"] > 0
    for i, text in enumerate(SENTENCES):
        for w, vec in reference_window_words(tiny_model_dir, text, 7).items():
            np.testing.assert_allclose(got[3 * i, w], vec, atol=3e-5)


def test_words_the_normaliser_deletes_are_counted_apart_from_truncated_ones(tiny_model_dir, tmp_path):
    """BERT's normaliser deletes a NUL and a zero-width space: the pre-tokenizer still makes
    words of them, no token covers them, and nothing was truncated."""
    ref = lmd_models.resolve({"name": "t", "path": str(tiny_model_dir)})
    text = "A \x00 B \u200b C"
    spans = words.word_spans(text)
    assert [text[a:b] for a, b in spans] == ["A", "\x00", "B", "\u200b", "C"]
    seqs = write_sequences(tmp_path / "s.parquet", [text], ["train"], np.arange(1))
    cfg = {"layer": -1, "granularity": "word", "pooling": "mean", "max_length": 64, "batch_tokens": 64,
           "shard_rows": 2, "threads": 1, "device": "cpu", "dtype": "float32", "overflow": "truncate"}
    manifest = embed.embed_model(ref, seqs, tmp_path / "w", cfg, progress=False)
    kept = [int(w) for p in shards.iter_shards(tmp_path / "w") for w in p.word_idx]
    assert kept == [0, 2, 4] and manifest["truncated_sequences"] == 0
    assert (manifest["words"], manifest["words_truncated"], manifest["words_without_tokens"]) == (5, 0, 2)


def test_word_granularity_needs_mean_pooling(tiny_model_dir, sentences, tmp_path):
    ref = lmd_models.resolve({"name": "t", "path": str(tiny_model_dir)})
    cfg = {"layer": -1, "granularity": "word", "pooling": "cls", "max_length": 16, "batch_tokens": 200,
           "shard_rows": 2, "threads": 1, "device": "cpu", "dtype": "float32"}
    with pytest.raises(embed.EmbedError, match="pooling must be mean"):
        embed.embed_model(ref, sentences, tmp_path / "out", cfg, progress=False)
    assert not (tmp_path / "out").exists()


def test_sequence_and_word_rows_do_not_mix(tiny_model_dir, sentences, tmp_path):
    ref = lmd_models.resolve({"name": "t", "path": str(tiny_model_dir)})
    base = {"layer": -1, "pooling": "mean", "max_length": 16, "batch_tokens": 200, "shard_rows": 2, "threads": 1,
            "device": "cpu", "dtype": "float32"}
    embed.embed_model(ref, sentences, tmp_path / "seq", base, progress=False)
    embed.embed_model(ref, sentences, tmp_path / "word", {**base, "granularity": "word"}, progress=False)
    with pytest.raises(lmd.LMDError, match="same embed.granularity"):
        lmd.accumulate_moments({"a": tmp_path / "seq", "b": tmp_path / "word"})
