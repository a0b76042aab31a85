"""Model zoo: recipe -> trained tokenizer + untrained masked-LM -> pretrained artifact.

Public API
----------
* :class:`Recipe` -- validated description of one zoo model.
* :func:`build_model` -- the untrained ``*ForMaskedLM`` for a recipe (one config builder per
  architecture family).
* :func:`unigram_perplexity` -- add-one smoothed unigram baseline.
* :func:`pretrain` -- a tokenizer (:func:`lmdecomp.models.tokenizing.train_tokenizer`), the model
  above and :func:`lmdecomp.models.train.train_mlm`, written atomically to ``out_dir``.

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
from typing import Any, Mapping, Sequence

import torch

from lmdecomp.atomic import atomic_dir, sha256_file
from lmdecomp.models.masking import (
    _maskable,
    _special_ids,
    fixed_eval_mask,
    make_blocks,
)
from lmdecomp.models.tokenizing import TOKENIZER_KINDS, train_tokenizer
from lmdecomp.models.train import TrainConfig, TrainResult, train_mlm_restarting

ARCHITECTURES = ("bert", "roberta", "albert", "deberta-v2", "electra", "modernbert", "roformer")


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
    config, cls = _architecture_config(tf, recipe, tokenizer)
    _copy_special_token_ids(config, tokenizer)
    return _seeded_model(cls, config, recipe.seed)


def _architecture_config(tf, recipe: Recipe, tokenizer) -> tuple[Any, type]:
    """The ``(config, *ForMaskedLM class)`` of ``recipe.architecture``, sized to ``tokenizer``."""
    common = _common_config_kwargs(recipe, tokenizer)
    # Tokenizers without <s>/</s> (WordPiece, Unigram) use [CLS]/[SEP] as begin/end tokens.
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.cls_token_id
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    arch = recipe.architecture
    if arch not in _ARCHITECTURE_CONFIGS:  # pragma: no cover - Recipe validates
        raise ValueError(f"Recipe.architecture={arch!r}: unsupported")
    return _ARCHITECTURE_CONFIGS[arch](tf, recipe, tokenizer, common, bos, eos)


def _common_config_kwargs(recipe: Recipe, tokenizer) -> dict[str, Any]:
    """Config kwargs that every BERT-style config spells the same way (all but ModernBERT)."""
    common = dict(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        intermediate_size=recipe.intermediate_size,
        hidden_dropout_prob=float(recipe.dropout),
        attention_probs_dropout_prob=float(recipe.dropout),
        pad_token_id=tokenizer.pad_token_id,
    )
    if recipe.init_std is not None:
        common["initializer_range"] = float(recipe.init_std)
    return common


# One builder per architecture: (tf, recipe, tokenizer, common kwargs, bos id, eos id) -> (config, model class).
def _bert_config(tf, recipe, tokenizer, common, bos, eos):
    config = tf.BertConfig(max_position_embeddings=recipe.max_length, type_vocab_size=2, **common)
    return config, tf.BertForMaskedLM


def _roberta_config(tf, recipe, tokenizer, common, bos, eos):
    # RoBERTa's positions start after the pad id, hence the extra pad id + 1 embeddings.
    config = tf.RobertaConfig(
        max_position_embeddings=recipe.max_length + int(common["pad_token_id"]) + 1, type_vocab_size=1,
        bos_token_id=bos, eos_token_id=eos, **common,
    )
    return config, tf.RobertaForMaskedLM


def _albert_config(tf, recipe, tokenizer, common, bos, eos):
    # A factorized embedding (at most 128 wide) and one layer shared across all num_layers.
    config = tf.AlbertConfig(
        embedding_size=min(recipe.hidden_size, 128), max_position_embeddings=recipe.max_length,
        type_vocab_size=2, num_hidden_groups=1, inner_group_num=1,
        bos_token_id=bos, eos_token_id=eos, classifier_dropout_prob=float(recipe.dropout), **common,
    )
    return config, tf.AlbertForMaskedLM


def _deberta_v2_config(tf, recipe, tokenizer, common, bos, eos):
    config = tf.DebertaV2Config(
        max_position_embeddings=recipe.max_length, type_vocab_size=0,
        relative_attention=True, max_relative_positions=-1, position_buckets=min(256, recipe.max_length),
        pos_att_type=["p2c", "c2p"], position_biased_input=False, norm_rel_ebd="layer_norm",
        share_att_key=True, hidden_act="gelu", **common,
    )
    return config, tf.DebertaV2ForMaskedLM


def _electra_config(tf, recipe, tokenizer, common, bos, eos):
    config = tf.ElectraConfig(
        embedding_size=recipe.hidden_size, max_position_embeddings=recipe.max_length, type_vocab_size=2, **common,
    )
    return config, tf.ElectraForMaskedLM


def _modernbert_config(tf, recipe, tokenizer, common, bos, eos):
    # Rotary positions, pre-LayerNorm, GeGLU; global attention in every layer at these lengths.
    # ModernBertConfig names its sizes and dropouts differently, so ``common`` is not splatted.
    config = tf.ModernBertConfig(
        vocab_size=common["vocab_size"], hidden_size=recipe.hidden_size, num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads, intermediate_size=recipe.intermediate_size,
        max_position_embeddings=recipe.max_length, attention_dropout=float(recipe.dropout),
        mlp_dropout=float(recipe.dropout), embedding_dropout=float(recipe.dropout),
        pad_token_id=common["pad_token_id"], bos_token_id=bos, eos_token_id=eos,
        cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
        global_attn_every_n_layers=1, local_attention=recipe.max_length,
        **({"initializer_range": float(recipe.init_std)} if recipe.init_std is not None else {}),
    )
    return config, tf.ModernBertForMaskedLM


def _roformer_config(tf, recipe, tokenizer, common, bos, eos):
    # BERT with rotary position embeddings instead of learned absolute ones.
    config = tf.RoFormerConfig(
        embedding_size=recipe.hidden_size, max_position_embeddings=recipe.max_length, type_vocab_size=2, **common,
    )
    return config, tf.RoFormerForMaskedLM


_ARCHITECTURE_CONFIGS = {
    "bert": _bert_config,
    "roberta": _roberta_config,
    "albert": _albert_config,
    "deberta-v2": _deberta_v2_config,
    "electra": _electra_config,
    "modernbert": _modernbert_config,
    "roformer": _roformer_config,
}


def _copy_special_token_ids(config, tokenizer) -> None:
    """Record the tokenizer's special-token ids in the config (saved with the model)."""
    for name in ("cls_token_id", "sep_token_id", "mask_token_id", "unk_token_id"):
        v = getattr(tokenizer, name, None)
        if v is not None:
            setattr(config, name, int(v))


def _seeded_model(cls, config, seed: int):
    """``cls(config)`` with weights drawn after ``torch.manual_seed(seed)``, in training mode."""
    # fork_rng: seeding here must not disturb the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
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
    training blocks built exactly as :func:`lmdecomp.models.masking.make_blocks` builds
    them; ``p(t) = (count(t) + 1) / (N + V)`` with ``V = len(tokenizer)`` (the
    full output vocabulary of the MLM, special tokens included).

    Evaluate: ``exp(-mean log p(t))`` over the tokens the masked-LM validation
    loss scores.  With ``mask_prob`` and ``mask_seed`` given (``pretrain``
    passes the recipe's ``mask_prob`` and the training config's ``val_seed``)
    these are exactly the positions of the fixed validation mask of
    :func:`lmdecomp.models.train.train_mlm`, so ``val_perplexity`` and this number are
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
    result = _train_resumably(recipe, model, tok, train_texts, val_texts, cfg, ckpt_dir, progress, max_steps_this_run)
    if not result.completed:
        return {"completed": False, "steps_done": result.steps_done, "checkpoint_dir": str(ckpt_dir)}

    unigram_ppl = unigram_perplexity(
        tok, train_texts, val_texts, max_length=recipe.max_length, mask_prob=recipe.mask_prob, mask_seed=cfg.val_seed,
    )

    with atomic_dir(out_dir) as tmp:
        _save_model_and_tokenizer(model, tok, tmp, progress)
        _write_log_parquet(result.log, tmp / "train_log.parquet")
        manifest = _manifest(
            recipe, model, tok, result, cfg, n_train_texts=len(train_texts), n_val_texts=len(val_texts),
            unigram_ppl=unigram_ppl, weights=tmp / "model.safetensors",
            versions={"torch": torch.__version__, "transformers": transformers.__version__,
                      "tokenizers": tokenizers.__version__},
        )
        _write_manifest(manifest, tmp / "manifest.json")
    _remove_checkpoint(ckpt_dir, work)
    return manifest


def _train_resumably(recipe: Recipe, model, tok, train_texts: list[str], val_texts: list[str], cfg: TrainConfig,
                     ckpt_dir: Path, progress: bool, max_steps_this_run: int | None) -> TrainResult:
    """Train ``model``, resuming from (and checkpointing to) ``ckpt_dir``."""
    # The whole recipe is part of the checkpoint's identity: a model field (heads,
    # dropout, init_std, ...) edited after a killed run must not resume the old weights.
    # ``name`` is only a label.
    run = {k: v for k, v in recipe.to_dict().items() if k != "name"}
    return train_mlm_restarting(
        model, tok, train_texts, val_texts, cfg, ckpt_dir, progress, max_steps_this_run=max_steps_this_run, identity_extra=run,
    )


def _save_model_and_tokenizer(model, tok, folder: Path, progress: bool) -> None:
    """Save the model (on the CPU, in eval mode) and the tokenizer into ``folder``."""
    model.to("cpu")
    model.eval()
    from transformers.utils import logging as hf_logging

    # Silence save_pretrained's progress bars when asked to, and restore the
    # caller's setting afterwards (unless the caller had them off already).
    bars_were_disabled = hf_logging.is_progress_bar_enabled() is False
    if not progress:
        hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(folder)
    finally:
        if not bars_were_disabled:
            hf_logging.enable_progress_bar()
    tok.save_pretrained(folder)


def _manifest(recipe: Recipe, model, tok, result: TrainResult, cfg: TrainConfig, *, n_train_texts: int,
              n_val_texts: int, unigram_ppl: float, weights: Path, versions: dict[str, str]) -> dict[str, Any]:
    """The manifest of a completed run; ``weights`` (the saved model file) is hashed into it."""
    return {
        "completed": True,
        "name": recipe.name,
        "recipe": recipe.to_dict(),
        "seed": recipe.seed,
        "model_class": type(model).__name__,
        "n_parameters": int(sum(p.numel() for p in model.parameters())),
        "tokenizer_vocab_size": len(tok),
        "n_train_texts": n_train_texts,
        "n_val_texts": n_val_texts,
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
        "versions": versions,
    }


def _write_manifest(manifest: dict[str, Any], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def _remove_checkpoint(ckpt_dir: Path, work: Path) -> None:
    """Delete the training checkpoint of a finished run, and ``work`` if that leaves it empty."""
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    try:
        work.rmdir()  # only if empty (the caller may keep other files there)
    except OSError:
        pass
