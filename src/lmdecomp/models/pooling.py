"""Pooling: the hidden states of a text's tokens → one vector per row (a text, or a word of it).

Of the hidden states h_1..h_n of the n real tokens of a text (special tokens included):

* ``mean``        (1/n) Σ_t h_t                       — the default
* ``padded_mean`` (1/L) Σ_t h_t with L = ``max_length``, the padded length; the paper's
  code averaged over a batch padded to a fixed length this way
* ``cls``         h_1
* ``last``        h_n, the state of the last real token: a decoder LLM's sentence vector, as
  under causal attention it is the one token that has seen the whole text

With ``granularity: word`` a row is a word w instead: (1/|T_w|) Σ_{t ∈ T_w} h_t over the set T_w
of the word's subword tokens (:func:`lmdecomp.data.words.token_word_pairs`).

A text longer than ``max_length`` reaches the model as several pieces (windows, see
:mod:`lmdecomp.models.embed`). :func:`pool_parts` gives each piece a (numerator, denominator)
pair and :class:`SequencePooler` divides their sums over the text's pieces, which for ``mean``
is the mean over the tokens of all its windows; the other poolings take one piece only
(``overflow: truncate``): ``cls`` and ``last`` are per-piece values, and for ``last`` a window
restarts a decoder's context, so its last token has not seen the text before it. A new pooling
is a name in :data:`POOLINGS`, a branch of :func:`pool_parts`, and an entry of the
``embed.pooling`` enum in ``workflow/schemas/params.schema.yaml``.
"""

from __future__ import annotations

import numpy as np
import torch

from lmdecomp.data import words

POOLINGS = ("mean", "padded_mean", "cls", "last")


def pool_parts(hidden: torch.Tensor, mask: torch.Tensor, pooling: str, max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(numerator, denominator) per row of (batch, tokens, dim) ``hidden``, over the tokens where
    ``mask`` is 1; a text's pooled vector is Σ numerators / Σ denominators over its windows."""
    ones = torch.ones(hidden.shape[0], dtype=hidden.dtype, device=hidden.device)
    if pooling == "cls":
        return hidden[:, 0], ones
    if pooling == "last":
        # the last position where mask is 1, whichever side the padding is on
        positions = torch.arange(mask.shape[1], device=mask.device)
        last = torch.where(mask.bool(), positions, -1).amax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last], ones
    m = mask.unsqueeze(-1).to(hidden.dtype)
    summed = (hidden * m).sum(dim=1)
    if pooling == "mean":
        return summed, m.sum(dim=(1, 2))
    if pooling == "padded_mean":
        return summed / max_length, ones
    # embed checks embed.pooling first and raises its EmbedError (a ValueError) with the key's name
    raise ValueError(f"unknown pooling {pooling!r}; choose one of {POOLINGS}")


class SequencePooler:
    """One row per text: Σ numerator / Σ denominator of :func:`pool_parts` over its pieces."""

    def __init__(self, n_texts: int, stored: tuple[int, ...], pooling: str, max_length: int, device: torch.device):
        self.n_texts, self.stored, self.pooling, self.max_length, self.device = n_texts, stored, pooling, max_length, device
        self.numerators: dict[int, torch.Tensor] = {}
        self.denominators = torch.zeros(n_texts, device=device)

    def add(self, pieces: np.ndarray, texts: np.ndarray, hidden: tuple[torch.Tensor, ...], mask: torch.Tensor) -> None:
        """Pool one batch: row j is piece ``pieces[j]`` of text ``texts[j]``."""
        text_of_row = torch.as_tensor(texts, device=self.device)
        for k in self.stored:
            numerator, denominator = pool_parts(hidden[k].float(), mask, self.pooling, self.max_length)
            if k not in self.numerators:
                self.numerators[k] = torch.zeros(self.n_texts, numerator.shape[1], device=self.device)
            self.numerators[k].index_add_(0, text_of_row, numerator)
        # the denominator is the same for every stored layer: add it once
        self.denominators.index_add_(0, text_of_row, denominator)

    def finish(self) -> tuple[dict[int, np.ndarray], np.ndarray, None]:
        """({hidden-state index: (texts, dim)}, rows per text, no word indices)."""
        scale = self.denominators.clamp(min=1).unsqueeze(1)
        return ({k: (v / scale).cpu().numpy() for k, v in self.numerators.items()},
                np.ones(self.n_texts, dtype=np.int64), None)


class WordPooler:
    """One row per covered word of each text: the mean of the states of the word's tokens, over
    all the text's pieces (a word cut by a window boundary collects tokens from both windows)."""

    def __init__(self, spans: list[np.ndarray], offsets: list, cut: list[int | None], stored: tuple[int, ...],
                 device: torch.device):
        self.spans, self.offsets, self.cut, self.stored, self.device = spans, offsets, cut, stored, device
        self.sums: list[dict[int, torch.Tensor]] = [{} for _ in spans]
        self.counts = [np.zeros(len(s), np.int64) for s in spans]

    def add(self, pieces: np.ndarray, texts: np.ndarray, hidden: tuple[torch.Tensor, ...], mask: torch.Tensor) -> None:
        """Pool one batch: row j is piece ``pieces[j]`` of text ``texts[j]`` (``mask`` is unused:
        padding belongs to no word)."""
        states = {k: hidden[k].float() for k in self.stored}
        for j, (piece, i) in enumerate(zip(pieces, texts)):
            word, token = words.token_word_pairs(self.spans[i], self.offsets[piece], self.cut[piece])
            word_t, token_t = torch.as_tensor(word, device=self.device), torch.as_tensor(token, device=self.device)
            for k in self.stored:
                if k not in self.sums[i]:
                    self.sums[i][k] = torch.zeros(len(self.spans[i]), states[k].shape[-1], device=self.device)
                self.sums[i][k].index_add_(0, word_t, states[k][j, token_t])
            self.counts[i] += np.bincount(word, minlength=len(self.spans[i]))

    def finish(self) -> tuple[dict[int, np.ndarray], np.ndarray, list[np.ndarray]]:
        """({hidden-state index: (words, dim)}, rows per text, covered word indices per text)."""
        word_ids = [np.flatnonzero(c) for c in self.counts]
        columns = {}
        for k in self.stored:
            parts = []
            for i, ids in enumerate(word_ids):  # every text has ≥ 1 piece, so sums[i] holds k
                counts = torch.as_tensor(self.counts[i][ids], device=self.device).unsqueeze(1)
                parts.append((self.sums[i][k][torch.as_tensor(ids, device=self.device)] / counts).cpu().numpy())
            columns[k] = np.concatenate(parts)
        return columns, np.array([len(w) for w in word_ids]), word_ids
