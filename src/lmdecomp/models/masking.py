"""Masked-LM data: a corpus packed into fixed-length blocks, and BERT's 80/10/10 masking,
drawn from seeded generators (a fixed mask for evaluation)."""

from __future__ import annotations

import hashlib
from typing import Any, Sequence

import torch


# --------------------------------------------------------------------------- #
# helpers
# --------------------------------------------------------------------------- #
def derive_seed(*parts: Any) -> int:
    """A 63-bit seed derived deterministically from ``parts`` (e.g. (seed, "mask", step))."""
    h = hashlib.sha256(repr(tuple(parts)).encode("utf-8")).digest()
    return int.from_bytes(h[:8], "little") & ((1 << 63) - 1)


def _gen(*parts: Any) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(derive_seed(*parts))
    return g


def _special_ids(tokenizer) -> list[int]:
    ids = set(int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None)
    for name in ("pad_token_id", "cls_token_id", "sep_token_id", "bos_token_id", "eos_token_id", "mask_token_id", "unk_token_id"):
        v = getattr(tokenizer, name, None)
        if v is not None:
            ids.add(int(v))
    return sorted(ids)


def _boundary_ids(tokenizer) -> tuple[int | None, int | None]:
    start = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    end = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    return start, end


def make_blocks(tokenizer, texts: Sequence[str], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokenize ``texts`` into fixed-length blocks by concatenation.

    Returns ``(input_ids, attention_mask)``, both ``LongTensor[n_blocks, max_length]``.
    See the module docstring for the exact layout.  Empty / whitespace-only texts are
    skipped.  An empty input gives tensors with 0 rows.
    """
    start, end = _boundary_ids(tokenizer)
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = end if end is not None else 0
    n_special = (start is not None) + (end is not None)
    chunk = max_length - n_special
    if chunk < 1:
        raise ValueError(f"max_length={max_length} leaves no room for content tokens")
    texts = [t for t in texts if t and not t.isspace()]
    stream: list[int] = []
    if texts:
        enc = tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"]
        for i, ids in enumerate(enc):
            if i and end is not None:
                stream.append(end)
            stream.extend(ids)
    rows: list[list[int]] = []
    masks: list[list[int]] = []
    for s in range(0, len(stream), chunk):
        body = stream[s : s + chunk]
        row = ([start] if start is not None else []) + body + ([end] if end is not None else [])
        m = [1] * len(row)
        if len(row) < max_length:
            fill = max_length - len(row)
            row = row + [pad] * fill
            m = m + [0] * fill
        rows.append(row)
        masks.append(m)
    if not rows:
        return torch.zeros((0, max_length), dtype=torch.long), torch.zeros((0, max_length), dtype=torch.long)
    return torch.tensor(rows, dtype=torch.long), torch.tensor(masks, dtype=torch.long)


def _maskable(input_ids: torch.Tensor, attention_mask: torch.Tensor, special_ids: torch.Tensor) -> torch.Tensor:
    return attention_mask.bool() & ~torch.isin(input_ids, special_ids)


def mask_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    special_ids: torch.Tensor,
    mask_token_id: int,
    replace_ids: torch.Tensor,
    mask_prob: float,
    generator: torch.Generator,
    keep_random: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking on CPU tensors, all randomness from ``generator``.

    Each maskable token (not special, not padding) is selected with probability
    ``mask_prob``; of the selected, 80% become ``mask_token_id``, 10% a random
    id from ``replace_ids`` and 10% stay unchanged (``keep_random=False``: 100%
    become the mask token).  At least one position is selected if any is
    maskable.  Returns ``(inputs, labels)`` with ``labels == -100`` where not
    selected.
    """
    maskable = _maskable(input_ids, attention_mask, special_ids)
    r = torch.rand(input_ids.shape, generator=generator)
    selected = (r < mask_prob) & maskable
    if not bool(selected.any()):
        if not bool(maskable.any()):
            raise ValueError("no maskable tokens in batch")
        first = int(torch.nonzero(maskable.flatten())[0])
        selected.view(-1)[first] = True
    labels = torch.where(selected, input_ids, torch.full_like(input_ids, -100))
    inputs = input_ids.clone()
    if keep_random:
        r2 = torch.rand(input_ids.shape, generator=generator)
        rnd = replace_ids[torch.randint(len(replace_ids), input_ids.shape, generator=generator)]
        inputs = torch.where(selected & (r2 < 0.8), torch.full_like(inputs, mask_token_id), inputs)
        inputs = torch.where(selected & (r2 >= 0.8) & (r2 < 0.9), rnd, inputs)
    else:
        inputs[selected] = mask_token_id
    return inputs, labels


def _replace_ids(tokenizer, vocab_size: int) -> torch.Tensor:
    special = set(_special_ids(tokenizer))
    ids = [i for i in range(vocab_size) if i not in special]
    return torch.tensor(ids, dtype=torch.long)


def fixed_eval_mask(tokenizer, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask_prob: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed validation mask: ``(masked_inputs, labels)`` for all blocks at once.

    Positions are chosen with a generator seeded by ``derive_seed(seed, "val-mask")``
    and all chosen positions are replaced by the mask token.
    """
    if tokenizer.mask_token_id is None:
        raise ValueError("tokenizer has no mask token")
    if input_ids.numel() == 0:
        return input_ids.clone(), input_ids.clone()
    special = torch.tensor(_special_ids(tokenizer), dtype=torch.long)
    return mask_tokens(
        input_ids,
        attention_mask,
        special_ids=special,
        mask_token_id=int(tokenizer.mask_token_id),
        replace_ids=special,  # unused
        mask_prob=mask_prob,
        generator=_gen(seed, "val-mask"),
        keep_random=False,
    )
