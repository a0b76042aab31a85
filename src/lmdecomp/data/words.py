"""Words shared by every tokenizer: word spans of a text and the subword tokens inside them.

Word-level LMD needs rows that mean the same thing for every model. A *word* is a span of
the sequence's own characters cut by one fixed pre-tokenizer, whatever the model: BERT's
(``tokenizers.pre_tokenizers.BertPreTokenizer``: split on whitespace, every punctuation
character its own word). Word ``w`` of sequence ``s`` is the row (s, w) for all models.

A model's token t, with character span [a_t, b_t) from its fast tokenizer's offset mapping,
belongs to every word [s_w, e_w) it overlaps: max(a_t, s_w) < min(b_t, e_w). This handles
WordPiece (``##`` pieces), byte-level BPE (a leading-space token ``Ġthe`` spans " the" and
overlaps only "the") and Unigram (``▁the``) alike; a token that crosses a word boundary (BPE's
``'t`` over "'" and "t", or ``...`` over three "." words) counts for each word it touches.
Special tokens have empty spans and belong to no word. The word's vector is the mean of its
tokens' states.

A word is *covered* by a model when it has at least one token and, if the tokenizer cut the
sequence at ``max_length``, it ends at or before the character where the first token cut off
starts: a word whose tail was truncated away is dropped, not averaged over a part of it. (Not
the last kept token's end: byte-level BPE gives both bytes of "ï" the character's span, so a cut
between them keeps a token that ends where the word does.)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from tokenizers.pre_tokenizers import BertPreTokenizer

_PRE_TOKENIZER = BertPreTokenizer()


def word_spans(text: str) -> np.ndarray:
    """(words, 2) int64 character spans [start, end) of the words of ``text``, in order."""
    spans = [span for _, span in _PRE_TOKENIZER.pre_tokenize_str(text)]
    return np.asarray(spans, dtype=np.int64).reshape(-1, 2)


def cut_point(cut_offsets: Sequence[tuple[int, int]]) -> int:
    """The character where truncation cut a text: the start of the first real (non-special)
    token among the ``cut_offsets`` of the tokens it cut off."""
    return next(int(a) for a, b in cut_offsets if b > a)


def words_cut_off(spans: np.ndarray, cut_at: int | None) -> np.ndarray:
    """Which words truncation at character ``cut_at`` (None: not truncated) cut into or off."""
    return np.zeros(len(spans), bool) if cut_at is None else spans[:, 1] > cut_at


def token_word_pairs(
    spans: np.ndarray, offsets: Sequence[tuple[int, int]], cut_at: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """(word index, token index) pairs of the covered words of one sequence (see module doc).

    ``offsets`` are the tokenizer's (start, end) character spans of the kept tokens, special
    tokens included with empty spans; ``cut_at`` is the :func:`cut_point` of a truncated text
    and None for a whole one. Pairs are sorted by word, then token.
    """
    off = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    real = off[:, 1] > off[:, 0]
    if not len(spans) or not real.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.maximum(spans[:, None, 0], off[None, :, 0])
    ends = np.minimum(spans[:, None, 1], off[None, :, 1])
    overlap = (starts < ends) & real[None, :]
    covered = overlap.any(axis=1) & ~words_cut_off(spans, cut_at)
    overlap &= covered[:, None]
    word, token = np.nonzero(overlap)
    return word.astype(np.int64), token.astype(np.int64)
