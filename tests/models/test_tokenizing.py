"""lmdecomp.models.tokenizing: trained tokenizers round-trip through save / load, map tokens to
their text spans and train deterministically, checked on hand-written and BBC sentences.

Everything is tiny and runs on CPU with one torch thread (the machine is shared;
tiny matmuls are faster single-threaded and results are bit-reproducible for a
fixed thread count).
"""

from __future__ import annotations

import pytest

from lmdecomp.models.tokenizing import TOKENIZER_KINDS, train_tokenizer
from models_helpers import _one_thread, corpus, tokenizers_500  # noqa: F401  (fixtures; _one_thread is autouse)


SENTENCES = [
    "Café prices rose 3.5% – naïve résumé!",
    "  Hello,   world:\tit's  (really) \"fine\"...\nOK? ",
    "Zoë's Ångström — 12,000 £ vs. €5 (U.S.-based).",
    "The firm's profits fell; shares dropped 7p to 233p.",
]


def _check_offsets(kind: str, tok, text: str, enc) -> None:
    ids, offs = enc["input_ids"], enc["offset_mapping"]
    toks = tok.convert_ids_to_tokens(ids)
    special = set(tok.all_special_ids) - {tok.unk_token_id}
    norm = tok.backend_tokenizer.normalizer
    content = [(i, t, o) for i, t, o in zip(ids, toks, offs) if i not in special]
    assert content, text
    # spans inside the text, in order, overlapping only when identical (bytes of one
    # character in byte-level BPE) -- or the text-initial lone "▁" of Unigram
    prev_end = 0
    for k, (i, t, (a, b)) in enumerate(content):
        assert 0 <= a <= b <= len(text)
        if (a, b) != tuple(content[k - 1][2]) if k else True:
            lone_initial_meta = kind == "unigram" and k == 0 and t == "▁"
            assert a >= prev_end or lone_initial_meta, (text, content)
            if not lone_initial_meta:
                prev_end = b
    # every non-whitespace character is covered, in order
    spans = []
    for i, t, o in content:
        if kind == "unigram" and t == "▁":
            continue
        if not spans or tuple(o) != spans[-1]:
            spans.append(tuple(o))
    covered = "".join(text[a:b] for a, b in spans)
    assert "".join(covered.split()) == "".join(text.split())
    # each token is the (normalized) substring it points to
    if kind == "bpe":
        groups: dict[tuple[int, int], list[int]] = {}
        for i, t, o in content:
            groups.setdefault(tuple(o), []).append(i)
        for (a, b), gids in groups.items():
            assert tok.decode(gids).strip() == text[a:b].strip()
    else:
        for k, (i, t, (a, b)) in enumerate(content):
            if i == tok.unk_token_id or (kind == "unigram" and k == 0 and t == "▁"):
                continue  # unknown piece / text-initial prepended "▁" (aligned to the first char)
            sub = norm.normalize_str(text[a:b])
            if kind == "wordpiece":
                assert t.removeprefix("##") == sub
            else:
                assert t.replace("▁", " ").strip() == sub.strip(), (t, text[a:b])


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_tokenizer_roundtrip_offsets_determinism(kind, tokenizers_500, corpus, tmp_path):
    from transformers import AutoTokenizer

    tok = tokenizers_500[kind]
    assert len(tok) == 500
    assert tok.model_max_length == 64
    for name in ("pad_token_id", "unk_token_id", "cls_token_id", "sep_token_id", "mask_token_id"):
        assert getattr(tok, name) is not None and 0 <= getattr(tok, name) < 5, name
    tok.save_pretrained(tmp_path)
    re = AutoTokenizer.from_pretrained(tmp_path)
    assert len(re) == len(tok) and re.mask_token_id == tok.mask_token_id and re.pad_token_id == tok.pad_token_id
    for text in SENTENCES + corpus.val[:3]:
        a = tok(text, return_offsets_mapping=True)
        b = re(text, return_offsets_mapping=True)
        assert a["input_ids"] == b["input_ids"]
        assert a["offset_mapping"] == b["offset_mapping"]
        assert a["input_ids"][0] == tok.cls_token_id and a["input_ids"][-1] == tok.sep_token_id
        _check_offsets(kind, tok, text, a)
    # batch + pair encoding through the post-processor
    pair = tok("first part", "second part")["input_ids"]
    assert pair[0] == tok.cls_token_id and pair.count(tok.sep_token_id) >= 2
    # deterministic training: same texts -> identical tokenizer.json
    again = train_tokenizer(kind, corpus.train, 500, model_max_length=64)
    assert again.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    # and a different corpus gives a different tokenizer (the check can fail)
    other = train_tokenizer(kind, corpus.val, 500, model_max_length=64)
    assert other.backend_tokenizer.to_str() != tok.backend_tokenizer.to_str()
