"""The linear probe against an independent logistic regression (scipy's L-BFGS on numpy
float64 features pooled by an explicit unbatched loop), and ridge against numpy's lstsq."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize
from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

from lmdecomp.mpo import finetune, probe
from conftest import package_folder
from mpo_helpers import one_thread  # noqa: F401  (autouse fixture)


WORDS = {0: "goal match team league striker", 1: "market shares profit bank growth", 2: "film actor award music stage"}


def topic_data(n: int, seed: int) -> finetune.Examples:
    """Texts mixing words of one topic with shared filler, so the classes overlap a little."""
    rng = np.random.default_rng(seed)
    filler = "the of and a in to it is was for on".split()
    texts, labels = [], []
    for i in range(n):
        y = int(rng.integers(0, 3))
        own = WORDS[y].split()
        other = WORDS[int(rng.integers(0, 3))].split()
        words = list(rng.choice(own, 2)) + list(rng.choice(other, 2)) + list(rng.choice(filler, 6))
        texts.append(" ".join(rng.permutation(words)))
        labels.append(y)
    return finetune.Examples(texts, labels)


@pytest.fixture(scope="module")
def encoder_and_data():
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(package_folder("cognition/model"))
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    encoder = BertForMaskedLM(config).eval().base_model
    data = {"train": topic_data(240, 0), "val": topic_data(60, 1), "test": topic_data(200, 2)}
    return encoder, tokenizer, data


def loop_features(encoder, tokenizer, texts) -> np.ndarray:
    """Mean of the last hidden states over the tokens, one text at a time (no padding)."""
    rows = []
    with torch.no_grad():
        for text in texts:
            ids = torch.tensor([tokenizer(text, truncation=True, max_length=32)["input_ids"]])
            h = encoder(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
            rows.append(h.double().mean(0).numpy())
    return np.stack(rows)


def scipy_logistic(x: np.ndarray, y: np.ndarray, k: int, l2: float) -> tuple[np.ndarray, np.ndarray]:
    n, d = x.shape
    onehot = np.eye(k)[y]

    def objective(theta):
        w, b = theta[: d * k].reshape(d, k), theta[d * k :]
        z = x @ w + b
        z -= z.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        loss = -np.mean(np.log(p[np.arange(n), y])) + l2 * np.sum(w * w)
        g = (p - onehot) / n
        return loss, np.concatenate([(x.T @ g + 2 * l2 * w).ravel(), g.sum(0)])

    res = minimize(objective, np.zeros(d * k + k), jac=True, method="L-BFGS-B", options={"maxiter": 5000, "gtol": 1e-10, "ftol": 1e-15})
    return res.x[: d * k].reshape(d, k), res.x[d * k :]


@pytest.mark.slow
def test_the_probe_scores_what_an_independent_logistic_regression_scores(encoder_and_data):
    encoder, tokenizer, data = encoder_and_data
    task = finetune.TaskInfo(kind="classification", metric="accuracy", n_classes=3)
    out = probe.linear_probe(encoder, tokenizer, data, task, max_length=32, device="cpu")
    feats = {s: loop_features(encoder, tokenizer, data[s].text) for s in finetune.SPLITS}
    mu, sd = feats["train"].mean(0), feats["train"].std(0, ddof=1)
    feats = {s: (f - mu) / sd for s, f in feats.items()}
    acc = {}
    for l2 in probe.L2_GRID:
        w, b = scipy_logistic(feats["train"], np.asarray(data["train"].label), 3, l2)
        acc[l2] = {s: float(np.mean((feats[s] @ w + b).argmax(1) == np.asarray(data[s].label))) for s in ("val", "test")}
    chosen = out["probe_l2"]
    assert [h["val_metric"] for h in out["history"]] == pytest.approx([acc[l2]["val"] for l2 in probe.L2_GRID], abs=0.0101)
    assert abs(out["test_metric"] - acc[chosen]["test"]) <= 0.01  # within 1 point
    assert out["test_metric"] == out["test_accuracy"] > out["chance_metric"] + 0.2  # the features carry the topic
    assert out["trainable_parameters"] == 16 * 3 + 3
    assert out["parameters"] == sum(p.numel() for p in encoder.parameters()) + 16 * 3 + 3


def test_ridge_probe_equals_numpys_least_squares_on_the_augmented_system():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 4))
    z = x @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.3 + 0.1 * rng.normal(size=50)
    l2 = 0.05
    w, b = probe.fit_ridge(torch.tensor(x), torch.tensor(z), l2)
    # (1/n)‖Xc w − zc‖² + λ‖w‖²  ⇔  lstsq of [Xc; √(nλ) I] w = [zc; 0]
    xc, zc = x - x.mean(0), z - z.mean()
    aug = np.vstack([xc, np.sqrt(len(x) * l2) * np.eye(4)])
    ref, *_ = np.linalg.lstsq(aug, np.concatenate([zc, np.zeros(4)]), rcond=None)
    np.testing.assert_allclose(w.numpy()[:, 0], ref, atol=1e-12)
    np.testing.assert_allclose(float(b[0]), z.mean() - x.mean(0) @ ref, atol=1e-12)
