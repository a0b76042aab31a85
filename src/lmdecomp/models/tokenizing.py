"""Tokenizers the zoo trains itself: WordPiece, byte-level BPE and Unigram, trained with the
``tokenizers`` library on the corpus' train split and wrapped as a
``transformers.PreTrainedTokenizerFast``, in a canonical form so the same texts give the same bytes."""

from __future__ import annotations

import json
from typing import Any, Iterable

TOKENIZER_KINDS = ("wordpiece", "bpe", "unigram")


# --------------------------------------------------------------------------- #
# tokenizers
# --------------------------------------------------------------------------- #
_SPECIALS = {
    # kind: (ordered special tokens -> ids 0..4, role mapping)
    "wordpiece": (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                  dict(pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")),
    "bpe": (["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
            dict(bos_token="<s>", eos_token="</s>", cls_token="<s>", sep_token="</s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")),
    "unigram": (["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"],
                dict(pad_token="<pad>", unk_token="<unk>", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")),
}


def _canonical_unigram(tok) -> Any:
    """Make a trained ``tokenizers`` Unigram model independent of hash order.

    The Rust Unigram trainer iterates hash maps: (a) the characters that must be
    in the vocabulary but were pruned are re-added with scores
    ``min_score + k * 1e-4`` in hash order, (b) float sums over sentences run in
    hash order (last-bit noise), (c) ties in the final sort keep hash order.
    The *set* of pieces is stable.  Here: the re-added characters are given the
    penalty scores in code-point order, all scores are rounded to 1e-8, and the
    pieces are sorted by (-score, piece) after the special tokens.
    """
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    model = data["model"]
    vocab: list[list[Any]] = model["vocab"]
    specials = [a["content"] for a in data.get("added_tokens", []) if a.get("special")]
    head = [v for v in vocab if v[0] in specials]
    head.sort(key=lambda v: specials.index(v[0]))
    rest = [v for v in vocab if v[0] not in specials]
    smin = min(s for _, s in rest)
    penalty = []
    for i, (p, s) in enumerate(rest):
        k = (s - smin) / 1e-4
        if len(p) == 1 and abs(k - round(k)) < 1e-5 and round(k) <= len(rest):
            penalty.append(i)
    scores = sorted(rest[i][1] for i in penalty)
    chars = sorted(rest[i][0] for i in penalty)
    for i, (c, s) in zip(penalty, zip(chars, scores)):
        rest[i] = [c, s]
    rest = [[p, round(float(s), 8)] for p, s in rest]
    rest.sort(key=lambda v: (-v[1], v[0]))
    model["vocab"] = head + rest
    names = [v[0] for v in model["vocab"]]
    unk = _SPECIALS["unigram"][1]["unk_token"]
    model["unk_id"] = names.index(unk)
    for a in data.get("added_tokens", []):
        a["id"] = names.index(a["content"])
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def _canonical_wordpiece(tok, specials: list[str]) -> Any:
    """Give a trained WordPiece vocabulary hash-order-independent ids.

    The WordPiece trainer assigns ids in hash order among equally frequent
    symbols/merges (the *set* of tokens is stable).  WordPiece encoding only
    looks tokens up by string, so renumbering is safe: the special tokens keep
    ids 0..k-1, all other tokens follow in sorted (code-point) order.
    """
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    vocab: dict[str, int] = data["model"]["vocab"]
    data["added_tokens"] = [a for a in data.get("added_tokens", []) if a["content"] in specials]
    rest = sorted(t for t in vocab if t not in specials)
    data["model"]["vocab"] = {t: i for i, t in enumerate(specials + rest)}
    for a in data.get("added_tokens", []):
        a["id"] = data["model"]["vocab"][a["content"]]
    return Tokenizer.from_str(json.dumps(data, ensure_ascii=False))


def train_tokenizer(
    kind: str,
    texts: Iterable[str],
    vocab_size: int,
    seed: int | None = None,
    *,
    model_max_length: int = 512,
    min_frequency: int = 2,
):
    """Train a tokenizer and wrap it as ``transformers.PreTrainedTokenizerFast``.

    kinds:
      * ``"wordpiece"``: BERT-uncased style -- ``BertNormalizer`` (lowercase,
        strip accents, clean text, CJK split), ``BertPreTokenizer``, ``##``
        continuation prefix; specials ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4``;
        ``[CLS] A [SEP]`` / ``[CLS] A [SEP] B [SEP]``.
      * ``"bpe"``: RoBERTa-style byte-level BPE (``add_prefix_space=True``, so a
        word is encoded the same at the start of a text as after a space; ``Ġ``
        marks a leading space); specials ``<s>=0 <pad>=1 </s>=2 <unk>=3
        <mask>=4``; ``<s> A </s>`` / ``<s> A </s></s> B </s>``; offsets trimmed
        (they exclude the leading space).
      * ``"unigram"``: SentencePiece-like -- NFKC, every whitespace run
        collapsed to one space, text stripped, ``Metaspace`` (the space before a
        word becomes ``▁`` and belongs to the word's first piece; ``▁`` is also
        prepended to the first word), case kept; specials ``<pad>=0 <unk>=1
        [CLS]=2 [SEP]=3 [MASK]=4`` (ALBERT layout).  Offsets of a word-initial
        piece *include* the preceding whitespace run (``"▁prices"`` -> ``" prices"``,
        a lone ``"▁"`` -> ``" "``), except for the first word; strip whitespace
        from the substring when aligning to words.

    All kinds return offsets into the original string
    (``return_offsets_mapping=True``) and save/load with
    ``save_pretrained``/``AutoTokenizer.from_pretrained``.  Training is
    deterministic for the same ``texts`` (the WordPiece ids and the Unigram
    model are canonicalized, see :func:`_canonical_wordpiece` and
    :func:`_canonical_unigram`); ``seed`` is accepted for API symmetry and
    is not needed (no trainer here is randomized).
    """
    from transformers import AddedToken, PreTrainedTokenizerFast

    del seed  # trainers are deterministic; kept for API symmetry
    texts = _training_texts(kind, texts)
    specials, roles = _SPECIALS[kind]
    tok = _TRAINERS[kind](texts, specials, vocab_size, min_frequency)
    _check_special_ids(tok, specials)

    # Wrap for transformers with each special token's role.  Byte-level BPE's <mask>
    # takes in the space before it (lstrip), as RoBERTa's does: its word tokens carry
    # their leading space ("Ġx"), so "a <mask>" stands for the whole " x".
    kw: dict[str, Any] = dict(roles)
    if kind == "bpe":
        kw["mask_token"] = AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length, padding_side="right", **kw)
    return fast


def _training_texts(kind: str, texts: Iterable[str]) -> list[str]:
    """Check ``kind`` and ``texts``; the non-blank texts, as a list."""
    if kind not in _SPECIALS:
        raise ValueError(f"tokenizer kind {kind!r}: must be one of {list(TOKENIZER_KINDS)}")
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of strings, not a single string")
    texts = [t for t in texts if t and not t.isspace()]
    if not texts:
        raise ValueError("no texts to train the tokenizer on")
    return texts


def _train_wordpiece(texts: list[str], specials: list[str], vocab_size: int, min_frequency: int):
    """A trained BERT-uncased-style WordPiece ``tokenizers.Tokenizer`` (see :func:`train_tokenizer`)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    # Determinism: the trainer numbers "##c" continuation symbols in hash
    # order and breaks ties between equally frequent merges by symbol id.
    # Registering every "##c" that the corpus needs up front (as extra
    # trainer "special tokens", sorted) fixes their ids; they are turned
    # back into ordinary vocabulary entries in _canonical_wordpiece.
    cont = _continuation_chars(tok, texts)
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency,
        special_tokens=specials + ["##" + c for c in sorted(cont)],
        continuing_subword_prefix="##", show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok = _canonical_wordpiece(tok, specials)
    _set_cls_sep_template(tok, specials)
    return tok


def _continuation_chars(tok, texts: list[str]) -> set[str]:
    """Every character that follows the first one of a word of ``texts``, as ``tok`` splits them."""
    cont: set[str] = set()
    for t in texts:
        for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(t)):
            cont.update(w[1:])
    return cont


def _train_bpe(texts: list[str], specials: list[str], vocab_size: int, min_frequency: int):
    """A trained RoBERTa-style byte-level BPE ``tokenizers.Tokenizer`` (see :func:`train_tokenizer`)."""
    from tokenizers import (
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True, trim_offsets=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok.post_processor = processors.RobertaProcessing(
        ("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")),
        trim_offsets=True, add_prefix_space=True,
    )
    return tok


def _train_unigram(texts: list[str], specials: list[str], vocab_size: int, min_frequency: int):
    """A trained SentencePiece-like Unigram ``tokenizers.Tokenizer`` (see :func:`train_tokenizer`).

    ``min_frequency`` is not used: the Unigram trainer has no such option."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()]
    )
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>", show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tok = _canonical_unigram(tok)
    _set_cls_sep_template(tok, specials)
    return tok


_TRAINERS = {"wordpiece": _train_wordpiece, "bpe": _train_bpe, "unigram": _train_unigram}


def _set_cls_sep_template(tok, specials: list[str]) -> None:
    """BERT's ``[CLS] A [SEP]`` / ``[CLS] A [SEP] B [SEP]`` framing (WordPiece and Unigram)."""
    from tokenizers import processors

    # The ids are looked up only now: canonicalization renumbers the vocabulary.
    ids = {t: tok.token_to_id(t) for t in specials}
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
    )


def _check_special_ids(tok, specials: list[str]) -> None:
    """The special tokens must have ids 0..k-1 in ``_SPECIALS`` order (the layouts of :func:`train_tokenizer`)."""
    for i, t in enumerate(specials):
        if tok.token_to_id(t) != i:
            raise RuntimeError(f"special token {t!r} got id {tok.token_to_id(t)}, expected {i}")
