"""lmdecomp.models.train: TrainConfig checks, train_mlm on a generic module, exact resume from a
checkpoint and refused or half-written checkpoints, against an uninterrupted reference run.

Everything is tiny and runs on CPU with one torch thread (the machine is shared;
tiny matmuls are faster single-threaded and results are bit-reproducible for a
fixed thread count).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from lmdecomp.models.train import CheckpointMismatch, TrainConfig, train_mlm
from lmdecomp.models.zoo import build_model, train_config_from_recipe
from models_helpers import tiny_recipe
from models_helpers import _one_thread, corpus, tokenizers_500  # noqa: F401  (fixtures; _one_thread is autouse)


def test_train_config_refuses_non_finite_numbers():
    """NaN fails every comparison, so range checks alone let it through to a NaN loss."""
    for field in ("learning_rate", "weight_decay", "grad_clip", "warmup_ratio", "mask_prob", "adam_eps"):
        for value in (float("nan"), float("inf")):
            with pytest.raises(ValueError, match=f"TrainConfig.{field}=.*must be a finite number"):
                TrainConfig(steps=5, batch_size=8, **{field: value})
    assert TrainConfig(steps=5, batch_size=8, grad_clip=None).grad_clip is None


class _SharedToyMLM(nn.Module):
    """Toy MLM: one Linear shared by three layers, output tied to the embedding."""

    def __init__(self, vocab: int, dim: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.shared = nn.Linear(dim, dim)
        self.layers = nn.ModuleList([self.shared, self.shared, self.shared])
        self.norm = nn.LayerNorm(dim)

    def forward(self, input_ids, attention_mask=None, labels=None):
        h = self.emb(input_ids)
        ctx = h.mean(dim=1, keepdim=True)
        for layer in self.layers:
            h = h + torch.tanh(layer(h + ctx))
        logits = self.norm(h) @ self.emb.weight.T
        loss = nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)
        return SimpleNamespace(loss=loss, logits=logits)


def test_generic_module_with_shared_parameters(tokenizers_500, corpus):
    tok = tokenizers_500["wordpiece"]
    torch.manual_seed(0)
    model = _SharedToyMLM(len(tok))
    assert len(list(model.parameters())) == 5  # emb, shared w/b, norm w/b (deduplicated)
    w0 = model.shared.weight.detach().clone()
    cfg = TrainConfig(steps=5, batch_size=8, learning_rate=1e-2, max_length=32, warmup_ratio=0.0)
    res = train_mlm(model, tok, corpus.train[:30], corpus.val[:5], cfg, progress=False)
    assert res.completed and len(res.log) == 5
    assert not torch.equal(w0, model.shared.weight)
    assert model.layers[0].weight is model.layers[2].weight
    assert res.val_loss < res.initial_val_loss


def test_train_mlm_resume_exact_after_exception(tokenizers_500, corpus, tmp_path):
    tok = tokenizers_500["unigram"]
    r = tiny_recipe(architecture="albert", tokenizer="unigram", steps=12, batch_size=8, max_length=32, dropout=0.1)
    cfg = train_config_from_recipe(r, checkpoint_every=4)
    train, val = corpus.train[:60], corpus.val[:5]

    ref = build_model(r, tok)
    res_ref = train_mlm(ref, tok, train, val, cfg, progress=False)

    class Killed(Exception):
        pass

    def kill_at_9(step, loss):
        if step == 9:
            raise Killed

    ck = tmp_path / "ck"
    victim = build_model(r, tok)
    with pytest.raises(Killed):
        train_mlm(victim, tok, train, val, cfg, ck, progress=False, on_step=kill_at_9)
    assert (ck / "checkpoint.pt").exists()
    assert not [p for p in ck.iterdir() if p.name != "checkpoint.pt"]  # no temp files left
    fresh = build_model(r, tok)
    res = train_mlm(fresh, tok, train, val, cfg, ck, progress=False)
    assert res.resumed_from_step == 8
    assert res.log == res_ref.log
    assert res.val_loss == res_ref.val_loss and res.initial_val_loss == res_ref.initial_val_loss
    sd_ref, sd = ref.state_dict(), fresh.state_dict()
    assert sd.keys() == sd_ref.keys()
    for k in sd:
        assert torch.equal(sd[k], sd_ref[k]), k
    # a finished checkpoint only re-evaluates
    again = build_model(r, tok)
    res2 = train_mlm(again, tok, train, val, cfg, ck, progress=False)
    assert res2.resumed_from_step == 12 and res2.val_loss == res_ref.val_loss
    # a checkpoint of a different run is refused
    with pytest.raises(CheckpointMismatch):
        train_mlm(build_model(r, tok), tok, train, val, train_config_from_recipe(r, checkpoint_every=4, learning_rate=1e-3), ck, progress=False)
    # the caller's global RNG is untouched by training
    torch.manual_seed(123)
    expect = torch.rand(3)
    torch.manual_seed(123)
    train_mlm(build_model(r, tok), tok, train, val, train_config_from_recipe(r, steps=2), progress=False)
    assert torch.equal(torch.rand(3), expect)


def test_checkpoint_that_does_not_load_is_a_mismatch(tokenizers_500, corpus, tmp_path):
    """A checkpoint whose tensors do not fit the model (same identity) is refused with
    CheckpointMismatch, not a raw RuntimeError of load_state_dict, so pretrain discards it."""
    tok = tokenizers_500["wordpiece"]
    r = tiny_recipe(steps=4, batch_size=4, max_length=32)
    train, val = corpus.train[:20], corpus.val[:3]
    ck = tmp_path / "ck"

    class Killed(Exception):
        pass

    def kill_at_2(step, loss):
        if step == 2:
            raise Killed

    with pytest.raises(Killed):  # leaves the checkpoint of step 2
        train_mlm(build_model(r, tok), tok, train, val, train_config_from_recipe(r, checkpoint_every=2), ck,
                  progress=False, on_step=kill_at_2)
    state = torch.load(ck / "checkpoint.pt", weights_only=True)
    key = next(k for k in state["model"] if k.endswith("word_embeddings.weight"))
    state["model"][key] = state["model"][key][:-1]  # one row short
    torch.save(state, ck / "checkpoint.pt")
    with pytest.raises(CheckpointMismatch, match="does not fit this model"):
        train_mlm(build_model(r, tok), tok, train, val, train_config_from_recipe(r, checkpoint_every=2), ck, progress=False)


def test_leftover_temp_of_a_killed_save_is_removed(tokenizers_500, corpus, tmp_path):
    """SIGKILL inside the atomic save leaves '.checkpoint.pt.<random>.tmp'; the next run removes it."""
    from test_atomic import sigkill_inside_atomic_path

    ck = tmp_path / "ck"
    sigkill_inside_atomic_path(ck / "checkpoint.pt")
    left = [p.name for p in ck.iterdir()]
    assert len(left) == 1 and left[0].startswith(".checkpoint.pt.") and left[0].endswith(".tmp"), left
    (ck / ".other.pt.x.tmp").write_bytes(b"")  # someone else's temporary: kept
    tok = tokenizers_500["wordpiece"]
    r = tiny_recipe(steps=1, batch_size=4, max_length=32)
    train_mlm(build_model(r, tok), tok, corpus.train[:10], corpus.val[:2], train_config_from_recipe(r), ck, progress=False)
    assert sorted(p.name for p in ck.iterdir()) == [".other.pt.x.tmp", "checkpoint.pt"]
