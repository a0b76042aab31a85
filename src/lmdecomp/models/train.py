"""The masked-LM training loop shared by the zoo, the MPOBERT variants and healing."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import pickle
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from lmdecomp.atomic import atomic_path, remove_stale_temps
from lmdecomp.models.mlm_head import masked_lm_loss
from lmdecomp.models.masking import (
    _gen,
    _maskable,
    _replace_ids,
    _special_ids,
    derive_seed,
    fixed_eval_mask,
    make_blocks,
    mask_tokens,
)

CHECKPOINT_NAME = "checkpoint.pt"


_log = logging.getLogger(__name__)


_CKPT_FORMAT = 1


# --------------------------------------------------------------------------- #
# configuration / result
# --------------------------------------------------------------------------- #
@dataclass
class TrainConfig:
    """Hyper-parameters of :func:`train_mlm`.

    Fields that define the trajectory (everything except ``checkpoint_every``,
    ``device``, ``val_batch_size``) are stored in the checkpoint and a resume
    with different values is refused (:class:`CheckpointMismatch`).
    """

    steps: int
    batch_size: int
    learning_rate: float = 5e-4
    warmup_ratio: float = 0.06
    weight_decay: float = 0.01
    grad_clip: float | None = 1.0
    seed: int = 0
    mask_prob: float = 0.15
    max_length: int = 128
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    val_seed: int = 1234
    val_batch_size: int = 64
    checkpoint_every: int = 0  # 0: only when stopping early / at the end
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    eval_at_start: bool = True

    @classmethod
    def from_any(cls, config: "TrainConfig | Mapping[str, Any]") -> "TrainConfig":
        if isinstance(config, TrainConfig):
            return config
        if isinstance(config, Mapping):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(config) - known)
            if unknown:
                raise ValueError(f"unknown TrainConfig field(s): {unknown}")
            return cls(**dict(config))
        raise TypeError(f"config must be a TrainConfig or a mapping, got {type(config).__name__}")

    def __post_init__(self) -> None:
        def bad(name: str, why: str) -> ValueError:
            return ValueError(f"TrainConfig.{name}={getattr(self, name)!r}: {why}")

        for name in ("steps", "batch_size", "max_length", "val_batch_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise bad(name, "must be a positive integer")
        if self.max_length < 3:
            raise bad("max_length", "must be >= 3 (room for [CLS], [SEP] and one token)")
        for name in ("mask_prob", "warmup_ratio", "learning_rate", "weight_decay", "adam_eps",
                     *(["grad_clip"] if self.grad_clip is not None else [])):
            v = getattr(self, name)  # NaN passes every comparison below as False: refuse it first
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise bad(name, "must be a finite number")
        if not (0.0 < float(self.mask_prob) < 1.0):
            raise bad("mask_prob", "must be in (0, 1)")
        if not (0.0 <= float(self.warmup_ratio) < 1.0):
            raise bad("warmup_ratio", "must be in [0, 1)")
        if float(self.learning_rate) <= 0:
            raise bad("learning_rate", "must be > 0")
        if float(self.weight_decay) < 0:
            raise bad("weight_decay", "must be >= 0")
        if self.grad_clip is not None and float(self.grad_clip) <= 0:
            raise bad("grad_clip", "must be > 0 or None")
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 0:
            raise bad("checkpoint_every", "must be an integer >= 0")
        self.adam_betas = (float(self.adam_betas[0]), float(self.adam_betas[1]))

    def identity(self) -> dict[str, Any]:
        """The fields that determine the training trajectory."""
        d = dataclasses.asdict(self)
        for k in ("checkpoint_every", "device", "val_batch_size", "eval_at_start"):
            d.pop(k)
        d["adam_betas"] = list(d["adam_betas"])
        return d


@dataclass
class TrainResult:
    log: list[dict[str, float]]  # one row per step: {"step", "loss", "lr"}
    final_train_loss: float | None  # mean loss of the last min(10, steps) steps
    val_loss: float | None
    val_perplexity: float | None
    initial_val_loss: float | None  # val loss of the untrained model (step 0)
    steps_done: int
    completed: bool
    n_train_tokens: int  # non-special, non-pad tokens in the training blocks
    n_train_blocks: int
    n_val_tokens_scored: int
    resumed_from_step: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class CheckpointMismatch(RuntimeError):
    """The checkpoint in checkpoint_dir belongs to a different run."""


class _StopTraining(Exception):
    pass


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate_mlm(model: nn.Module, inputs: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor, batch_size: int = 64, device: torch.device | str | None = None) -> tuple[float | None, int]:
    """Token-weighted mean masked-LM loss over pre-masked ``inputs``/``labels``.

    Returns ``(loss, n_scored_tokens)``; loss is None when nothing is scored.
    :func:`~lmdecomp.models.mlm_head.masked_lm_loss` is the mean over non-ignored labels.
    """
    if device is None:
        device = next(model.parameters()).device
    device = torch.device(device)
    was_training = model.training
    model.eval()
    total, n_total = 0.0, 0
    try:
        for s in range(0, inputs.shape[0], batch_size):
            lab = labels[s : s + batch_size]
            n = int((lab != -100).sum())
            if n == 0:
                continue
            with _autocast(device):
                loss = masked_lm_loss(model, inputs[s : s + batch_size].to(device), attention_mask[s : s + batch_size].to(device),
                                      lab.to(device))
            total += float(loss.float()) * n
            n_total += n
    finally:
        model.train(was_training)
    if n_total == 0:
        return None, 0
    return total / n_total, n_total


def _param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    # model.named_parameters() deduplicates shared parameters (same nn.Parameter
    # object used by several modules), so each parameter is optimized once.
    decay, no_decay = [], []
    for _name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        # biases and LayerNorm weights/biases (all 0-/1-d tensors): no weight decay
        (no_decay if p.ndim < 2 else decay).append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": float(weight_decay)})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def _atomic_torch_save(obj: Any, path: Path) -> None:
    with atomic_path(path) as tmp:  # fsyncs the file before the rename
        with open(tmp, "wb") as f:
            torch.save(obj, f)


def _blocks_digest(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()


def _json_canonical(obj: Any, what: str) -> Any:
    """``obj`` as plain JSON data (sorted keys, tuples as lists), so that the identity
    saved in a checkpoint compares equal to the one rebuilt from the same inputs."""
    try:
        return json.loads(json.dumps(obj, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} must be JSON data (str, number, bool, None, list, dict): {exc}") from None


def _model_identity(model: nn.Module) -> dict[str, Any]:
    """What a checkpoint must share with ``model`` to be resumed into it.

    The tensor names, shapes and dtypes catch any change of shape, a digest of the
    weights any change of the starting point; the Hugging Face
    config (when there is one) catches what keeps the shapes but changes the
    trajectory: number of heads, dropout, initializer range, activation...  Keys with a
    leading underscore (``_name_or_path``: where the model was loaded from) are left
    out, they do not change the computation.
    """
    state = model.state_dict()
    weights = hashlib.sha256()
    for tensor in state.values():
        weights.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    out: dict[str, Any] = {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "tensors": [[k, list(v.shape), str(v.dtype)] for k, v in state.items()],
        # The starting weights: a model built from another base (an MPOBERT variant of a
        # retrained base) or initialised differently must not resume this trajectory.
        "initial_weights_sha256": weights.hexdigest(),
    }
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_json_string"):
        d = json.loads(config.to_json_string(use_diff=False))
        out["config"] = {k: v for k, v in d.items() if not k.startswith("_")}
    return out


@contextlib.contextmanager
def _deterministic(device: torch.device):
    prev = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    if device.type == "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(prev, warn_only=prev_warn)


# --------------------------------------------------------------------------- #
# the pieces of train_mlm
# --------------------------------------------------------------------------- #
@dataclass
class _MLMData:
    """The blocks and token sets of one run, built once before training."""

    train_ids: torch.Tensor
    train_am: torch.Tensor
    val_ids: torch.Tensor
    val_am: torch.Tensor
    val_inputs: torch.Tensor  # validation blocks with their fixed mask applied
    val_labels: torch.Tensor
    special: torch.Tensor
    vocab_size: int
    replace_ids: torch.Tensor
    n_train_tokens: int
    n_blocks: int


def _prepare_data(model: nn.Module, tokenizer, train_texts: Sequence[str], val_texts: Sequence[str], cfg: TrainConfig) -> _MLMData:
    """Check the tokenizer, cut the texts into blocks and mask the validation blocks once."""
    if tokenizer.mask_token_id is None:
        raise ValueError("tokenizer has no mask token; masked-LM training needs one")

    train_ids, train_am = make_blocks(tokenizer, train_texts, cfg.max_length)
    if train_ids.shape[0] == 0:
        raise ValueError("no training text")
    val_ids, val_am = make_blocks(tokenizer, val_texts, cfg.max_length)
    val_inputs, val_labels = fixed_eval_mask(tokenizer, val_ids, val_am, cfg.mask_prob, cfg.val_seed)

    special = torch.tensor(_special_ids(tokenizer), dtype=torch.long)
    vocab_size = len(tokenizer)
    try:  # never draw random replacement ids the model cannot embed
        vocab_size = min(vocab_size, int(model.get_input_embeddings().weight.shape[0]))
    except (AttributeError, NotImplementedError, TypeError):
        pass
    replace_ids = _replace_ids(tokenizer, vocab_size)
    n_train_tokens = int(_maskable(train_ids, train_am, special).sum())
    return _MLMData(
        train_ids=train_ids, train_am=train_am, val_ids=val_ids, val_am=val_am,
        val_inputs=val_inputs, val_labels=val_labels, special=special, vocab_size=vocab_size,
        replace_ids=replace_ids, n_train_tokens=n_train_tokens, n_blocks=train_ids.shape[0],
    )


def _build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device):
    """Move ``model`` to ``device`` in train mode; AdamW with linear warmup/decay.

    Returns ``(optimizer, scheduler, trainable parameters)``.
    """
    model.to(device)
    model.train()
    optimizer = torch.optim.AdamW(
        _param_groups(model, cfg.weight_decay),
        lr=cfg.learning_rate,
        betas=cfg.adam_betas,
        eps=cfg.adam_eps,
    )
    from transformers import get_linear_schedule_with_warmup

    warmup = int(round(cfg.warmup_ratio * cfg.steps))
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, cfg.steps)
    params = [p for p in model.parameters() if p.requires_grad]
    return optimizer, scheduler, params


def _run_identity(cfg: TrainConfig, data: _MLMData, tokenizer, model: nn.Module, identity_extra: Mapping[str, Any] | None) -> Any:
    """Everything that shapes the trajectory: a checkpoint is resumed only into the same run."""
    return _json_canonical(
        {
            "config": cfg.identity(),
            "train_blocks_sha256": _blocks_digest(data.train_ids),
            "val_blocks_sha256": _blocks_digest(data.val_ids),
            "tokenizer": {"special_ids": data.special.tolist(), "mask_token_id": int(tokenizer.mask_token_id), "vocab_size": data.vocab_size},
            "model": _model_identity(model),
            "extra": _json_canonical(identity_extra, "identity_extra"),
        },
        "the checkpoint identity",
    )


def _read_checkpoint(ckpt_path: Path, identity: Any) -> dict[str, Any]:
    """The checkpoint at ``ckpt_path``, refused (:class:`CheckpointMismatch`) unless it
    is readable, of this format and of the run ``identity``."""
    try:
        state = torch.load(ckpt_path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        raise CheckpointMismatch(f"{ckpt_path} cannot be read ({exc}); delete it to start over") from exc
    if not isinstance(state, dict) or state.get("format") != _CKPT_FORMAT:
        fmt = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise CheckpointMismatch(f"{ckpt_path}: unknown checkpoint format {fmt!r}; delete it to start over")
    saved = state.get("identity") if isinstance(state.get("identity"), dict) else {}
    if json.dumps(saved, sort_keys=True) != json.dumps(identity, sort_keys=True):
        differ = sorted(k for k in identity.keys() | saved.keys() if saved.get(k) != identity.get(k))
        raise CheckpointMismatch(
            f"{ckpt_path} was written by a different run ({', '.join(differ)} differ); delete it to start over"
        )
    return state


class _MLMRun:
    """The state of one :func:`train_mlm` call: model, optimiser, checkpoint and log."""

    def __init__(self, model: nn.Module, tokenizer, cfg: TrainConfig, device: torch.device, data: _MLMData,
                 checkpoint_dir: str | os.PathLike | None, identity_extra: Mapping[str, Any] | None) -> None:
        self.model, self.tokenizer, self.cfg, self.device, self.data = model, tokenizer, cfg, device, data
        self.optimizer, self.scheduler, self.params = _build_optimizer(model, cfg, device)
        self.identity = _run_identity(cfg, data, tokenizer, model, identity_extra)
        self.ckpt_path = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir is not None else None
        self.log: list[dict[str, float]] = []
        self.start_step = 0
        self.initial_val_loss: float | None = None
        self.resumed_from: int | None = None
        # seeded per-epoch block permutations, the latest few kept (steps only move forward)
        self._perms: dict[int, torch.Tensor] = {}

    # -- checkpoint ---------------------------------------------------------- #
    def resume(self) -> None:
        """Load the checkpoint in ``checkpoint_dir``, if any, into the model, optimiser and log."""
        if self.ckpt_path is None:
            return
        remove_stale_temps(self.ckpt_path)  # left behind by a run killed while saving
        if not self.ckpt_path.exists():
            return
        state = _read_checkpoint(self.ckpt_path, self.identity)
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        except (RuntimeError, ValueError, KeyError) as exc:
            # Same identity but a state that does not fit (e.g. other parameters set to
            # requires_grad, so other optimizer groups): not this run's checkpoint either.
            # load_state_dict may have copied some tensors already; the caller rebuilds.
            raise CheckpointMismatch(f"{self.ckpt_path} does not fit this model ({exc}); delete it to start over") from exc
        self.start_step = int(state["step"])
        self.log = list(state["log"])
        self.initial_val_loss = state["initial_val_loss"]
        self.resumed_from = self.start_step

    def save(self, step: int) -> None:
        """Write the state after ``step`` atomically (no-op without a checkpoint_dir)."""
        if self.ckpt_path is None:
            return
        _atomic_torch_save(
            {
                "format": _CKPT_FORMAT,
                "identity": self.identity,
                "step": step,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "log": self.log,
                "initial_val_loss": self.initial_val_loss,
                "cpu_rng_state": torch.get_rng_state(),
            },
            self.ckpt_path,
        )

    def save_final(self) -> None:
        # A run resumed from its finished checkpoint only re-evaluates: leave that file alone.
        if self.resumed_from is None or self.resumed_from < self.cfg.steps:
            self.save(self.cfg.steps)

    # -- evaluation ---------------------------------------------------------- #
    def evaluate(self) -> tuple[float | None, int]:
        d = self.data
        return evaluate_mlm(self.model, d.val_inputs, d.val_am, d.val_labels, self.cfg.val_batch_size, self.device)

    def evaluate_at_start(self) -> None:
        """Validation loss of the untrained model (a resumed run has it from its checkpoint)."""
        if self.start_step == 0 and self.cfg.eval_at_start and self.data.val_labels.numel():
            self.initial_val_loss, _ = self.evaluate()

    # -- training ------------------------------------------------------------ #
    def batch_indices(self, step: int) -> torch.Tensor:
        """The blocks of ``step``: epoch ``e`` visits them in the order of its own seeded
        permutation, so any step's batch is known without replaying the ones before."""
        cfg, n_blocks, perms = self.cfg, self.data.n_blocks, self._perms
        first = (step - 1) * cfg.batch_size
        out = []
        for i in range(first, first + cfg.batch_size):
            epoch, pos = divmod(i, n_blocks)
            if epoch not in perms:
                if len(perms) > 2:
                    perms.pop(min(perms))
                perms[epoch] = torch.randperm(n_blocks, generator=_gen(cfg.seed, "epoch", epoch))
            out.append(int(perms[epoch][pos]))
        return torch.tensor(out, dtype=torch.long)

    def optimisation_step(self, step: int) -> tuple[float, float]:
        """One masked-LM step; returns ``(loss, learning rate used)``.

        Every draw is seeded from ``(cfg.seed, step)``, which is what makes a resumed
        run bit-identical to an uninterrupted one.
        """
        cfg, d, device = self.cfg, self.data, self.device
        torch.manual_seed(derive_seed(cfg.seed, "dropout", step))
        idx = self.batch_indices(step)
        ids, am = d.train_ids[idx], d.train_am[idx]
        inputs, labels = mask_tokens(
            ids,
            am,
            special_ids=d.special,
            mask_token_id=int(self.tokenizer.mask_token_id),
            replace_ids=d.replace_ids,
            mask_prob=cfg.mask_prob,
            generator=_gen(cfg.seed, "mask", step),
        )
        lr = float(self.scheduler.get_last_lr()[0])
        with _autocast(device):
            loss = masked_lm_loss(self.model, inputs.to(device), am.to(device), labels.to(device))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, float(cfg.grad_clip))
        self.optimizer.step()
        self.scheduler.step()
        loss_v = float(loss.detach().float())
        if not math.isfinite(loss_v):
            raise FloatingPointError(f"non-finite training loss {loss_v} at step {step}")
        return loss_v, lr

    def train_steps(self, progress: bool, on_step: Callable[[int, float], None] | None,
                    max_steps_this_run: int | None) -> int | None:
        """Steps ``start_step+1 .. cfg.steps``; returns the step it stopped at when
        ``max_steps_this_run`` cut the run short (after saving), None when it finished."""
        cfg, device = self.cfg, self.device
        # Seeding dropout per step must not leak into the caller's global RNG streams.
        fork_devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=self.start_step, disable=not progress, desc="mlm", dynamic_ncols=True, mininterval=0.5)
        try:
            with torch.random.fork_rng(devices=fork_devices):
                for step in range(self.start_step + 1, cfg.steps + 1):
                    loss_v, lr = self.optimisation_step(step)
                    self.log.append({"step": step, "loss": loss_v, "lr": lr})
                    bar.update(1)
                    bar.set_postfix(loss=f"{loss_v:.3f}", refresh=False)
                    if cfg.checkpoint_every and step % cfg.checkpoint_every == 0 and step < cfg.steps:
                        self.save(step)
                    if on_step is not None:
                        on_step(step, loss_v)
                    if max_steps_this_run is not None and step - self.start_step >= max_steps_this_run and step < cfg.steps:
                        self.save(step)
                        raise _StopTraining(step)
        except _StopTraining as stop:
            bar.close()
            return int(stop.args[0])
        bar.close()
        return None

    # -- result -------------------------------------------------------------- #
    def result(self, *, steps_done: int, completed: bool, val_loss: float | None, n_val_tokens_scored: int) -> TrainResult:
        tail = [r["loss"] for r in self.log[-10:]]
        return TrainResult(
            log=self.log,
            final_train_loss=sum(tail) / len(tail) if tail else None,
            val_loss=val_loss,
            val_perplexity=math.exp(val_loss) if val_loss is not None else None,
            initial_val_loss=self.initial_val_loss,
            steps_done=steps_done,
            completed=completed,
            n_train_tokens=self.data.n_train_tokens,
            n_train_blocks=self.data.n_blocks,
            n_val_tokens_scored=n_val_tokens_scored,
            resumed_from_step=self.resumed_from,
        )


# --------------------------------------------------------------------------- #
# main entry point
# --------------------------------------------------------------------------- #
def train_mlm(
    model: nn.Module,
    tokenizer,
    train_texts: Sequence[str],
    val_texts: Sequence[str],
    config: TrainConfig | Mapping[str, Any],
    checkpoint_dir: str | os.PathLike | None = None,
    progress: bool = True,
    *,
    max_steps_this_run: int | None = None,
    on_step: Callable[[int, float], None] | None = None,
    identity_extra: Mapping[str, Any] | None = None,
) -> TrainResult:
    """Train ``model`` (in place) with the masked-LM objective.

    ``checkpoint_dir``: if given, the state is saved there atomically
    (``checkpoint.pt``) every ``config.checkpoint_every`` steps, when stopping
    early and at the end; if a checkpoint is already there the run resumes from
    it (a finished checkpoint makes this call only re-evaluate).  A checkpoint of
    a different run raises :class:`CheckpointMismatch` (the model may then hold
    part of the checkpoint's weights: rebuild it before training it again).  The
    run's identity is the trajectory fields of ``config``, the training and
    validation blocks, the tokenizer's special ids, the model (class, tensor
    shapes, Hugging Face config, a digest of its starting weights) and
    ``identity_extra`` (JSON data; e.g. the recipe the model was built from).
    :func:`train_mlm_restarting` discards such a checkpoint and starts over.

    ``max_steps_this_run``: stop (after saving a checkpoint) once this many steps
    have been done in this call; the result then has ``completed=False`` and no
    validation numbers.  ``on_step(step, loss)`` is called after every step
    (after any checkpoint of that step); an exception raised there propagates
    (used by the tests to simulate a kill).

    The model must be on CPU or be movable with ``.to(device)``; it is left on
    the training device, in train mode.
    """
    cfg = TrainConfig.from_any(config)
    device = _resolve_device(cfg.device)
    data = _prepare_data(model, tokenizer, train_texts, val_texts, cfg)
    run = _MLMRun(model, tokenizer, cfg, device, data, checkpoint_dir, identity_extra)
    run.resume()

    with _deterministic(device):
        run.evaluate_at_start()
        stopped_at = run.train_steps(progress, on_step, max_steps_this_run)
        if stopped_at is not None:  # cut short: no validation numbers
            return run.result(steps_done=stopped_at, completed=False, val_loss=None,
                              n_val_tokens_scored=int((data.val_labels != -100).sum()))
        run.save_final()

        val_loss, n_scored = (None, 0)
        if data.val_labels.numel():
            val_loss, n_scored = run.evaluate()

    return run.result(steps_done=cfg.steps, completed=True, val_loss=val_loss, n_val_tokens_scored=n_scored)


def train_mlm_restarting(model: nn.Module, tokenizer, train_texts: Sequence[str], val_texts: Sequence[str],
                         config: TrainConfig | Mapping[str, Any], checkpoint_dir: str | os.PathLike | None = None,
                         progress: bool = True, **kwargs: Any) -> TrainResult:
    """:func:`train_mlm`, except that a checkpoint of another run (:class:`CheckpointMismatch`:
    a killed run of other settings, of an edited recipe, of another base model) is discarded
    with a warning and training starts over from the model's starting weights."""
    start = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        return train_mlm(model, tokenizer, train_texts, val_texts, config, checkpoint_dir, progress, **kwargs)
    except CheckpointMismatch as exc:
        _log.warning("discarding the checkpoint of another run and starting over: %s", exc)
        shutil.rmtree(checkpoint_dir, ignore_errors=True)
        model.load_state_dict(start)  # the failed resume may have loaded some tensors
        return train_mlm(model, tokenizer, train_texts, val_texts, config, checkpoint_dir, progress, **kwargs)
