"""lmdecomp.models.masking: blocks of concatenated texts and MLM masking, against token counts
and the 15 % / 80-10-10 masking statistics.

Everything is tiny and runs on CPU with one torch thread (the machine is shared;
tiny matmuls are faster single-threaded and results are bit-reproducible for a
fixed thread count).
"""

from __future__ import annotations

import torch

from lmdecomp.models.masking import make_blocks, mask_tokens
from models_helpers import _one_thread, corpus, tokenizers_500  # noqa: F401  (fixtures; _one_thread is autouse)


def test_make_blocks_concatenates_everything(tokenizers_500, corpus):
    tok = tokenizers_500["wordpiece"]
    texts = corpus.train[:20]
    ids, am = make_blocks(tok, texts, 32)
    assert ids.shape[1] == 32 and ids.shape == am.shape
    content = sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)
    n_sep_between = len(texts) - 1
    n_real = int(am.sum())
    assert n_real == content + n_sep_between + 2 * ids.shape[0]
    assert bool((ids[:, 0] == tok.cls_token_id).all())
    assert bool(am[:-1].all())  # only the last block is padded
    assert int(am[-1].sum()) < 32 or ids.shape[0] * 30 == content + n_sep_between


def test_mask_tokens_statistics():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (200, 128), generator=g)
    ids[:, 0] = 2
    am = torch.ones_like(ids)
    am[:, 100:] = 0
    special = torch.tensor([0, 1, 2, 3, 4])
    inp, lab = mask_tokens(ids, am, special_ids=special, mask_token_id=4, replace_ids=torch.arange(5, 1000),
                           mask_prob=0.15, generator=torch.Generator().manual_seed(1))
    sel = lab != -100
    assert not bool(sel[:, 0].any()) and not bool(sel[:, 100:].any())
    frac = sel.sum().item() / (200 * 99)
    assert abs(frac - 0.15) < 0.01
    masked = (inp == 4) & sel
    same = (inp == ids) & sel
    assert abs(masked.sum().item() / sel.sum().item() - 0.8) < 0.02
    assert abs(same.sum().item() / sel.sum().item() - 0.1) < 0.02  # ~10% kept (+ rare random hits)
    assert bool((inp[~sel] == ids[~sel]).all())
    assert bool((lab[sel] == ids[sel]).all())
    inp2, lab2 = mask_tokens(ids, am, special_ids=special, mask_token_id=4, replace_ids=torch.arange(5, 1000),
                             mask_prob=0.15, generator=torch.Generator().manual_seed(1))
    assert torch.equal(inp, inp2) and torch.equal(lab, lab2)
