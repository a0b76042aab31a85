"""Model zoo: recipe -> trained tokenizer + untrained masked-LM -> pretrained artifact.

Public API
----------
* :class:`Recipe` -- validated description of one zoo model.
* :func:`train_tokenizer` -- WordPiece / byte-level BPE / Unigram tokenizer
  trained with the ``tokenizers`` library, wrapped as a
  ``transformers.PreTrainedTokenizerFast``.
* :func:`build_model` -- the untrained ``*ForMaskedLM`` for a recipe.
* :func:`unigram_perplexity` -- add-one smoothed unigram baseline.
* :func:`pretrain` -- everything above + :func:`lmdecomp.train.train_mlm`,
  written atomically to ``out_dir``.

Artifacts in ``out_dir`` (byte-identical for the same recipe, texts, library
versions, hardware and thread count): ``config.json``, ``model.safetensors``,
``generation_config.json`` if transformers writes one, ``tokenizer.json``,
``tokenizer_config.json``, ``train_log.parquet`` (columns step:int64,
loss:float64, lr:float64), ``manifest.json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import torch

from .atomic import atomic_dir, sha256_file
from .train import (
    TrainConfig,
    TrainResult,
    _maskable,
    _special_ids,
    fixed_eval_mask,
    make_blocks,
    train_mlm_restarting,
)

__all__ = [
    "ARCHITECTURES",
    "TOKENIZER_KINDS",
    "Recipe",
    "train_tokenizer",
    "build_model",
    "unigram_perplexity",
    "train_config_from_recipe",
    "pretrain",
]

ARCHITECTURES = ("bert", "roberta", "albert", "deberta-v2", "electra", "modernbert", "roformer")
TOKENIZER_KINDS = ("wordpiece", "bpe", "unigram")
OBJECTIVES = ("mlm",)


# --------------------------------------------------------------------------- #
# Recipe
# --------------------------------------------------------------------------- #
@dataclass
class Recipe:
    """One zoo model.  ``intermediate_size`` defaults to ``4 * hidden_size``.

    ``dropout`` is the hidden and attention dropout probability of the model.
    ``name`` is a free label (copied to the manifest, no effect on training).
    """

    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    tokenizer: str
    vocab_size: int
    steps: int
    batch_size: int
    learning_rate: float
    intermediate_size: int | None = None
    max_length: int = 128
    objective: str = "mlm"
    mask_prob: float = 0.15
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    grad_clip: float | None = 1.0
    dropout: float = 0.1
    init_std: float | None = None
    seed: int = 0
    name: str | None = None

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"Recipe.{name}={getattr(self, name)!r}: {why}")

        def pos_int(name: str) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad(name, "must be a positive integer")

        def number(name: str) -> float:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(name, "must be a finite number")
            return float(v)

        if self.architecture not in ARCHITECTURES:
            raise bad("architecture", f"must be one of {list(ARCHITECTURES)}")
        if self.tokenizer not in TOKENIZER_KINDS:
            raise bad("tokenizer", f"must be one of {list(TOKENIZER_KINDS)}")
        if self.objective not in OBJECTIVES:
            raise bad("objective", f"must be one of {list(OBJECTIVES)}")
        for n in ("hidden_size", "num_layers", "num_heads", "vocab_size", "steps", "batch_size", "max_length"):
            pos_int(n)
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        pos_int("intermediate_size")
        if self.hidden_size % self.num_heads:
            raise bad("num_heads", f"must divide hidden_size={self.hidden_size}")
        if self.architecture in ("roformer", "modernbert") and (self.hidden_size // self.num_heads) % 2:
            raise bad("num_heads", f"gives an odd head size {self.hidden_size // self.num_heads}: rotary positions "
                                   "rotate pairs of dimensions, so hidden_size / num_heads must be even")
        if self.vocab_size < 300 and self.tokenizer == "bpe":
            raise bad("vocab_size", "byte-level BPE needs >= 300 (256 byte symbols + specials + merges)")
        if self.vocab_size < 50:
            raise bad("vocab_size", "must be >= 50")
        if self.max_length < 8:
            raise bad("max_length", "must be >= 8")
        if not 0.0 < number("mask_prob") < 1.0:
            raise bad("mask_prob", "must be in (0, 1)")
        if not 0.0 < number("learning_rate"):
            raise bad("learning_rate", "must be > 0")
        if not 0.0 <= number("warmup_ratio") < 1.0:
            raise bad("warmup_ratio", "must be in [0, 1)")
        if number("weight_decay") < 0:
            raise bad("weight_decay", "must be >= 0")
        if not 0.0 <= number("dropout") < 1.0:
            raise bad("dropout", "must be in [0, 1)")
        if self.init_std is not None and not number("init_std") > 0:
            raise bad("init_std", "must be > 0 or null")
        if self.grad_clip is not None and number("grad_clip") <= 0:
            raise bad("grad_clip", "must be > 0 or null")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise bad("seed", "must be an integer >= 0")
        if self.name is not None and not isinstance(self.name, str):
            raise bad("name", "must be a string or null")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Recipe":
        if not isinstance(d, Mapping):
            raise TypeError(f"Recipe.from_dict expects a mapping, got {type(d).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise ValueError(f"unknown Recipe field(s) {unknown}; known fields: {known}")
        missing = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING and f.name not in d]
        if missing:
            raise ValueError(f"missing Recipe field(s) {missing}")
        d = dict(d)
        for k in _FLOAT_FIELDS:  # YAML 1.1 reads "3e-3" (no dot) as a string
            if isinstance(d.get(k), str):
                try:
                    d[k] = float(d[k])
                except ValueError:
                    raise ValueError(f"Recipe.{k}={d[k]!r}: must be a number") from None
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FLOAT_FIELDS = ("learning_rate", "mask_prob", "warmup_ratio", "weight_decay", "grad_clip", "dropout", "init_std")


def train_config_from_recipe(recipe: Recipe, **overrides: Any) -> TrainConfig:
    kw: dict[str, Any] = dict(
        steps=recipe.steps,
        batch_size=recipe.batch_size,
        learning_rate=float(recipe.learning_rate),
        warmup_ratio=float(recipe.warmup_ratio),
        weight_decay=float(recipe.weight_decay),
        grad_clip=None if recipe.grad_clip is None else float(recipe.grad_clip),
        seed=recipe.seed,
        mask_prob=float(recipe.mask_prob),
        max_length=recipe.max_length,
    )
    kw.update(overrides)
    return TrainConfig(**kw)


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
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import AddedToken, PreTrainedTokenizerFast

    del seed  # trainers are deterministic; kept for API symmetry
    if kind not in _SPECIALS:
        raise ValueError(f"tokenizer kind {kind!r}: must be one of {list(TOKENIZER_KINDS)}")
    if isinstance(texts, str):
        raise TypeError("texts must be an iterable of strings, not a single string")
    texts = [t for t in texts if t and not t.isspace()]
    if not texts:
        raise ValueError("no texts to train the tokenizer on")
    specials, roles = _SPECIALS[kind]

    if kind == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        # Determinism: the trainer numbers "##c" continuation symbols in hash
        # order and breaks ties between equally frequent merges by symbol id.
        # Registering every "##c" that the corpus needs up front (as extra
        # trainer "special tokens", sorted) fixes their ids; they are turned
        # back into ordinary vocabulary entries in _canonical_wordpiece.
        cont: set[str] = set()
        for t in texts:
            for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(t)):
                cont.update(w[1:])
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency,
            special_tokens=specials + ["##" + c for c in sorted(cont)],
            continuing_subword_prefix="##", show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
        tok = _canonical_wordpiece(tok, specials)
        ids = {t: tok.token_to_id(t) for t in specials}
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
        )
    elif kind == "bpe":
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
    else:  # unigram
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
        ids = {t: tok.token_to_id(t) for t in specials}
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])],
        )

    for i, t in enumerate(specials):
        if tok.token_to_id(t) != i:
            raise RuntimeError(f"special token {t!r} got id {tok.token_to_id(t)}, expected {i}")

    kw: dict[str, Any] = dict(roles)
    if kind == "bpe":
        kw["mask_token"] = AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=model_max_length, padding_side="right", **kw)
    return fast


# --------------------------------------------------------------------------- #
# models
# --------------------------------------------------------------------------- #
def build_model(recipe: Recipe, tokenizer):
    """Untrained ``*ForMaskedLM`` for ``recipe`` sized to ``tokenizer``.

    Weights are initialized after ``torch.manual_seed(recipe.seed)`` (inside
    ``torch.random.fork_rng``, so the caller's global RNG is not disturbed).
    Position embeddings cover ``recipe.max_length`` tokens (RoBERTa: + pad id +
    1, its positions start after the pad id).  ALBERT uses an embedding size of
    ``min(hidden_size, 128)`` and shares one layer across ``num_layers``.
    """
    import transformers as tf

    if not isinstance(recipe, Recipe):
        raise TypeError("recipe must be a Recipe")
    vocab = len(tokenizer)
    pad = tokenizer.pad_token_id
    common = dict(
        vocab_size=vocab,
        hidden_size=recipe.hidden_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        intermediate_size=recipe.intermediate_size,
        hidden_dropout_prob=float(recipe.dropout),
        attention_probs_dropout_prob=float(recipe.dropout),
        pad_token_id=pad,
    )
    if recipe.init_std is not None:
        common["initializer_range"] = float(recipe.init_std)
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    arch = recipe.architecture
    if arch == "bert":
        config = tf.BertConfig(max_position_embeddings=recipe.max_length, type_vocab_size=2, **common)
        cls = tf.BertForMaskedLM
    elif arch == "roberta":
        config = tf.RobertaConfig(
            max_position_embeddings=recipe.max_length + int(pad) + 1, type_vocab_size=1,
            bos_token_id=bos, eos_token_id=eos, **common,
        )
        cls = tf.RobertaForMaskedLM
    elif arch == "albert":
        config = tf.AlbertConfig(
            embedding_size=min(recipe.hidden_size, 128), max_position_embeddings=recipe.max_length,
            type_vocab_size=2, num_hidden_groups=1, inner_group_num=1,
            bos_token_id=bos, eos_token_id=eos, classifier_dropout_prob=float(recipe.dropout), **common,
        )
        cls = tf.AlbertForMaskedLM
    elif arch == "deberta-v2":
        config = tf.DebertaV2Config(
            max_position_embeddings=recipe.max_length, type_vocab_size=0,
            relative_attention=True, max_relative_positions=-1, position_buckets=min(256, recipe.max_length),
            pos_att_type=["p2c", "c2p"], position_biased_input=False, norm_rel_ebd="layer_norm",
            share_att_key=True, hidden_act="gelu", **common,
        )
        cls = tf.DebertaV2ForMaskedLM
    elif arch == "electra":
        config = tf.ElectraConfig(
            embedding_size=recipe.hidden_size, max_position_embeddings=recipe.max_length, type_vocab_size=2, **common,
        )
        cls = tf.ElectraForMaskedLM
    elif arch == "modernbert":
        # Rotary positions, pre-LayerNorm, GeGLU; global attention in every layer at these lengths.
        config = tf.ModernBertConfig(
            vocab_size=vocab, hidden_size=recipe.hidden_size, num_hidden_layers=recipe.num_layers,
            num_attention_heads=recipe.num_heads, intermediate_size=recipe.intermediate_size,
            max_position_embeddings=recipe.max_length, attention_dropout=float(recipe.dropout),
            mlp_dropout=float(recipe.dropout), embedding_dropout=float(recipe.dropout),
            pad_token_id=pad, bos_token_id=bos, eos_token_id=eos,
            cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
            global_attn_every_n_layers=1, local_attention=recipe.max_length,
            **({"initializer_range": float(recipe.init_std)} if recipe.init_std is not None else {}),
        )
        cls = tf.ModernBertForMaskedLM
    elif arch == "roformer":
        # BERT with rotary position embeddings instead of learned absolute ones.
        config = tf.RoFormerConfig(
            embedding_size=recipe.hidden_size, max_position_embeddings=recipe.max_length, type_vocab_size=2, **common,
        )
        cls = tf.RoFormerForMaskedLM
    else:  # pragma: no cover - Recipe validates
        raise ValueError(f"Recipe.architecture={arch!r}: unsupported")
    for name in ("cls_token_id", "sep_token_id", "mask_token_id", "unk_token_id"):
        v = getattr(tokenizer, name, None)
        if v is not None:
            setattr(config, name, int(v))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe.seed)
        model = cls(config)
    model.train()
    return model


# --------------------------------------------------------------------------- #
# unigram baseline
# --------------------------------------------------------------------------- #
def unigram_perplexity(
    tokenizer,
    train_texts: Sequence[str],
    eval_texts: Sequence[str],
    *,
    max_length: int | None = None,
    mask_prob: float | None = None,
    mask_seed: int | None = None,
) -> float:
    """Perplexity of an add-one smoothed unigram token model.

    Fit: counts of the *maskable* tokens (not special, not padding) of the
    training blocks built exactly as :func:`lmdecomp.train.make_blocks` builds
    them; ``p(t) = (count(t) + 1) / (N + V)`` with ``V = len(tokenizer)`` (the
    full output vocabulary of the MLM, special tokens included).

    Evaluate: ``exp(-mean log p(t))`` over the tokens the masked-LM validation
    loss scores.  With ``mask_prob`` and ``mask_seed`` given (``pretrain``
    passes the recipe's ``mask_prob`` and the training config's ``val_seed``)
    these are exactly the positions of the fixed validation mask of
    :func:`lmdecomp.train.train_mlm`, so ``val_perplexity`` and this number are
    averages over the same tokens; without them, all maskable tokens of the eval
    blocks are used (the expectation of the former).
    """
    if max_length is None:
        ml = getattr(tokenizer, "model_max_length", 512)
        max_length = ml if isinstance(ml, int) and 8 <= ml <= 100_000 else 512
    special = torch.tensor(_special_ids(tokenizer), dtype=torch.long)
    tr_ids, tr_am = make_blocks(tokenizer, train_texts, max_length)
    counts = Counter(tr_ids[_maskable(tr_ids, tr_am, special)].tolist())
    n = sum(counts.values())
    v = len(tokenizer)
    ev_ids, ev_am = make_blocks(tokenizer, eval_texts, max_length)
    if mask_prob is not None:
        if mask_seed is None:
            raise ValueError("mask_prob given without mask_seed")
        _, labels = fixed_eval_mask(tokenizer, ev_ids, ev_am, mask_prob, mask_seed)
        scored = labels[labels != -100].tolist()
    else:
        scored = ev_ids[_maskable(ev_ids, ev_am, special)].tolist()
    if not scored:
        raise ValueError("no evaluation tokens")
    log_denom = math.log(n + v)
    nll = sum(log_denom - math.log(counts.get(t, 0) + 1) for t in scored) / len(scored)
    return math.exp(nll)


# --------------------------------------------------------------------------- #
# pretrain
# --------------------------------------------------------------------------- #
def _write_log_parquet(log: list[dict[str, float]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "step": pa.array([int(r["step"]) for r in log], type=pa.int64()),
            "loss": pa.array([float(r["loss"]) for r in log], type=pa.float64()),
            "lr": pa.array([float(r["lr"]) for r in log], type=pa.float64()),
        }
    )
    pq.write_table(table, path, compression="zstd", write_statistics=False)


def pretrain(
    recipe: Recipe | Mapping[str, Any],
    train_texts: Sequence[str],
    val_texts: Sequence[str],
    out_dir: str | os.PathLike,
    work_dir: str | os.PathLike | None = None,
    progress: bool = True,
    *,
    checkpoint_every: int | None = None,
    device: str = "auto",
    max_steps_this_run: int | None = None,
) -> dict[str, Any]:
    """Train tokenizer + model for ``recipe`` and write the artifact to ``out_dir``.

    ``work_dir`` (default ``<out_dir>.work`` next to ``out_dir``) holds the
    resumable training checkpoint (every ``checkpoint_every`` steps, default
    ``max(50, steps // 10)``); a re-run after a kill resumes from it, and it is
    deleted after success.  A checkpoint of a different recipe/data is discarded.
    ``out_dir`` is written into a temporary sibling directory and renamed into
    place (an existing ``out_dir`` is replaced), so it either is complete or
    does not exist.  ``max_steps_this_run`` (testing): stop early, keep the
    checkpoint, write nothing, return ``{"completed": False, ...}``.

    Returns the manifest (also written to ``out_dir/manifest.json``).
    """
    import tokenizers
    import transformers

    if not isinstance(recipe, Recipe):
        recipe = Recipe.from_dict(recipe)
    train_texts = list(train_texts)
    val_texts = list(val_texts)
    out_dir = Path(out_dir)
    work = Path(work_dir) if work_dir is not None else out_dir.with_name(out_dir.name + ".work")
    ckpt_dir = work / "checkpoint"

    tok = train_tokenizer(recipe.tokenizer, train_texts, recipe.vocab_size, recipe.seed, model_max_length=recipe.max_length)
    model = build_model(recipe, tok)
    cfg = train_config_from_recipe(
        recipe,
        checkpoint_every=checkpoint_every if checkpoint_every is not None else max(50, recipe.steps // 10),
        device=device,
    )
    # The whole recipe is part of the checkpoint's identity: a model field (heads,
    # dropout, init_std, ...) edited after a killed run must not resume the old weights.
    # ``name`` is only a label.
    run = {k: v for k, v in recipe.to_dict().items() if k != "name"}
    result: TrainResult = train_mlm_restarting(
        model, tok, train_texts, val_texts, cfg, ckpt_dir, progress, max_steps_this_run=max_steps_this_run, identity_extra=run,
    )
    if not result.completed:
        return {"completed": False, "steps_done": result.steps_done, "checkpoint_dir": str(ckpt_dir)}

    unigram_ppl = unigram_perplexity(
        tok, train_texts, val_texts, max_length=recipe.max_length, mask_prob=recipe.mask_prob, mask_seed=cfg.val_seed,
    )

    with atomic_dir(out_dir) as tmp:
        model.to("cpu")
        model.eval()
        from transformers.utils import logging as hf_logging

        bars_were_disabled = hf_logging.is_progress_bar_enabled() is False
        if not progress:
            hf_logging.disable_progress_bar()
        try:
            model.save_pretrained(tmp)
        finally:
            if not bars_were_disabled:
                hf_logging.enable_progress_bar()
        tok.save_pretrained(tmp)
        _write_log_parquet(result.log, tmp / "train_log.parquet")
        weights = tmp / "model.safetensors"
        manifest: dict[str, Any] = {
            "completed": True,
            "name": recipe.name,
            "recipe": recipe.to_dict(),
            "seed": recipe.seed,
            "model_class": type(model).__name__,
            "n_parameters": int(sum(p.numel() for p in model.parameters())),
            "tokenizer_vocab_size": len(tok),
            "n_train_texts": len(train_texts),
            "n_val_texts": len(val_texts),
            "n_train_tokens": result.n_train_tokens,
            "n_train_blocks": result.n_train_blocks,
            "n_val_tokens_scored": result.n_val_tokens_scored,
            "steps": result.steps_done,
            "initial_val_loss": result.initial_val_loss,
            "final_train_loss": result.final_train_loss,
            "final_train_loss_note": "mean training loss of the last min(10, steps) steps",
            "val_loss": result.val_loss,
            "val_perplexity": result.val_perplexity,
            "unigram_perplexity": unigram_ppl,
            "perplexity_note": (
                "val_perplexity = exp(token-mean masked-LM cross-entropy) and unigram_perplexity "
                "(add-one smoothed unigram fit on the training tokens) are both computed over the "
                "same positions: the fixed validation mask (mask_prob, val_seed) of the val blocks"
            ),
            "val_seed": cfg.val_seed,
            "model_sha256": sha256_file(weights),
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "tokenizers": tokenizers.__version__,
            },
        }
        with open(tmp / "manifest.json", "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=2, sort_keys=True, ensure_ascii=False)
            f.write("\n")
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    try:
        work.rmdir()  # only if empty (the caller may keep other files there)
    except OSError:
        pass
    return manifest
