"""Decoder LLMs (Llama, Gemma-3) through the embed stage, against an explicit unbatched loop.

Tiny seeded causal models, and two tokenizers trained here on a few sentences: a byte-level BPE
like SmolLM2's (no BOS, a first word without ``Ġ``, padding with its end token) and a
SentencePiece-style BPE like Gemma's (``▁`` pieces, byte-fallback ``<0x..>`` pieces for unseen
characters, ``<bos>`` first). Each is saved padding on the right and on the left (Gemma's side);
embed pads on the right either way, so every row must equal its text run alone. (Rotary
positions hide a left padding's shift up to rounding; GPT-2's learned positions show it.)
"""

from __future__ import annotations

import functools
import json
import shutil

import numpy as np
import pytest
import torch

from conftest import write_sequences
from embed_reference import cfg
from lmdecomp.data import shards
from lmdecomp.models import embed, sources

TRAIN = [
    "The quick brown fox jumps over the lazy dog.",
    "Markets rose sharply on Tuesday after the central bank held rates.",
    "A naive cafe in Zurich serves three cups of coffee.",
    "Words split into pieces: establishment, establish, disestablish.",
    "The dog and the fox rose over the bank on Tuesday.",
    "Numbers like 3.14 and 2,71 appear in the rates.",
]
TEXTS = [
    "Hello world.",
    "A naïve café in Zürich.",
    "Pi is 3.14159, e is 2,718.",
    "Rare ones: 🙂👍🏽 and ꙮ.",  # unseen characters: byte pieces in both tokenizers
    "antidisestablishmentarianism",
    "Ok.",
    "The quick brown fox jumps over the lazy dog " * 4,  # longer than MAX_LENGTH: truncated
]
SPLITS = ["train", "val", "test", "train", "train", "val", "test"]
MAX_LENGTH, BATCH_TOKENS, VOCAB = 24, 60, 512
ATOL = 2e-5


def _byte_level():
    """SmolLM2-style: byte-level BPE, no prefix space, no BOS, the end token pads."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TRAIN, trainer)
    return tok, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}


def _sentencepiece():
    """Gemma-style: ``▁`` pieces (no prefix on the first word), BPE with byte fallback, ``<bos>`` first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["<pad>", "<eos>", "<bos>", "<unk>"],
                                  show_progress=False)
    tok.train_from_iterator(TRAIN, trainer)
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):  # the pieces byte fallback needs
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", tok.token_to_id("<bos>"))])
    return tok, {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}


def _llama():
    """Llama-family (SmolLM2): grouped key/value heads."""
    from transformers import LlamaConfig, LlamaModel

    return LlamaModel(LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  num_key_value_heads=1, intermediate_size=64, max_position_embeddings=128))


def _gemma3():
    """Gemma-3 text: a sliding-window layer (window 6 < the texts' lengths) then a full one;
    grouped key/value heads, as Gemma-3-270M's (4 heads, 1 key/value head)."""
    from transformers import Gemma3TextConfig, Gemma3TextModel

    return Gemma3TextModel(Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, intermediate_size=64, max_position_embeddings=128, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"]))


def _gpt2():
    """GPT-2: learned absolute positions, which a left padding's shift changes outright."""
    from transformers import GPT2Config, GPT2Model

    return GPT2Model(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_inner=64, n_positions=128,
                                bos_token_id=0, eos_token_id=0))


def _like_the_real_one(name, tok) -> None:
    """The traits of SmolLM2's and Gemma's tokenizers that these tests rely on."""
    assert tok.get_vocab_size() <= VOCAB
    tokens = tok.encode(TEXTS[3]).tokens  # "Rare ones: …"
    if name == "sentencepiece":
        assert tokens[0] == "<bos>" and not tokens[1].startswith("▁") and any(t.startswith("<0x") for t in tokens)
    else:
        assert not tokens[0].startswith("Ġ") and "Ġand" in tokens


TOKENIZERS = {"bytelevel": _byte_level, "sentencepiece": _sentencepiece}
ARCHS = {"llama": _llama, "gemma3": _gemma3, "gpt2": _gpt2}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{(arch, tokenizer, padding side): model folder}: each seeded model with each tokenizer,
    saved padding on either side."""
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("decoders")
    made = {}
    for a, (arch, build) in enumerate(ARCHS.items()):
        torch.manual_seed(100 + a)
        build().eval().save_pretrained(root / arch)
        for name, train in TOKENIZERS.items():
            tok, special = train()
            _like_the_real_one(name, tok)
            for side in ("right", "left"):
                folder = root / f"{arch}-{name}-{side}"
                shutil.copytree(root / arch, folder)
                PreTrainedTokenizerFast(tokenizer_object=tok, padding_side=side, **special).save_pretrained(folder)
                made[arch, name, side] = folder
    return made


@pytest.fixture()
def sequences(tmp_path):
    return write_sequences(tmp_path / "sequences.parquet", TEXTS, SPLITS, np.arange(len(TEXTS)) * 10)


@functools.lru_cache(maxsize=None)
def reference_states(folder) -> list[np.ndarray]:
    """Per text, run alone (one row, no padding): every hidden state, float64 (states, tokens, dim)."""
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    out = []
    for text in TEXTS:
        ids = tok(text, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            states = model(input_ids=ids, output_hidden_states=True).hidden_states
        out.append(np.stack([h[0].double().numpy() for h in states]))
    return out


def pooled_by_hand(states: np.ndarray, pooling: str) -> np.ndarray:
    """(states, tokens, dim) → (states, dim): the mean over every token, or the last token."""
    if pooling == "last":
        return states[:, -1]
    total = np.zeros((states.shape[0], states.shape[2]))
    for t in range(states.shape[1]):
        total += states[:, t]
    return total / states.shape[1]


def embedded(folder, sequences, out, **over) -> tuple[dict, list[shards.Shard]]:
    ref = sources.resolve({"name": "dec", "path": str(folder)})
    settings = cfg(max_length=MAX_LENGTH, batch_tokens=BATCH_TOKENS, shard_rows=4, overflow="truncate")
    settings.update(over)
    manifest = embed.embed_model(ref, sequences, out, settings, progress=False)
    columns = ["embedding", *(shards.hidden_column(k) for k in manifest["layers"] if k != manifest["layer"])]
    return manifest, list(shards.iter_shards(out, columns=columns))


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("pooling", ["mean", "last"])
@pytest.mark.parametrize("arch,tokenizer", [("llama", "bytelevel"), ("llama", "sentencepiece"),
                                            ("gemma3", "sentencepiece"), ("gemma3", "bytelevel")])
def test_padded_batches_equal_each_text_run_alone(folders, sequences, tmp_path, arch, tokenizer, pooling, side):
    from transformers import AutoTokenizer

    folder = folders[arch, tokenizer, side]
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.padding_side == side  # the saved tokenizer really pads on that side
    full = np.array([len(ids) for ids in tok(TEXTS)["input_ids"]])
    lengths = np.minimum(full, MAX_LENGTH)
    # the batches embed forms hold rows of different lengths: they pad
    assert any(len(set(lengths[b])) > 1 for b in embed.token_budget_batches(lengths, BATCH_TOKENS))
    manifest, parts = embedded(folder, sequences, tmp_path / "emb", pooling=pooling)
    got = np.concatenate([p.embedding for p in parts]).astype(np.float64)
    assert np.concatenate([p.seq_id for p in parts]).tolist() == [i * 10 for i in range(len(TEXTS))]
    want = np.stack([pooled_by_hand(s, pooling)[-1] for s in reference_states(folder)])
    assert np.abs(got - want).max() <= ATOL
    assert manifest["pooling"] == pooling and manifest["truncated_sequences"] == np.sum(full > MAX_LENGTH) >= 1
    assert manifest["tokens"] == lengths.sum()


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_every_stored_hidden_state_equals_the_loop(folders, sequences, tmp_path, pooling):
    folder = folders["gemma3", "sentencepiece", "left"]
    manifest, parts = embedded(folder, sequences, tmp_path / "emb", pooling=pooling, layers="all", layer=-1)
    assert manifest["layers"] == [0, 1, 2]
    want = np.stack([pooled_by_hand(s, pooling) for s in reference_states(folder)])  # (texts, states, dim)
    for k in manifest["layers"]:
        column = "embedding" if k == manifest["layer"] else shards.hidden_column(k)
        got = np.concatenate([p.columns[column] for p in parts]).astype(np.float64)
        assert np.abs(got - want[:, k]).max() <= ATOL, k


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("blocked", [True, False])  # a CPU without AMX (grouped heads fall back to SDPA), one with
def test_bfloat16_stays_near_float32(folders, sequences, tmp_path, monkeypatch, blocked, arch):
    monkeypatch.setattr(embed, "prefer_blocked_attention", lambda: blocked)
    folder = folders[arch, "sentencepiece", "left"]
    _, fp32 = embedded(folder, sequences, tmp_path / "fp32", pooling="last")
    manifest, bf16 = embedded(folder, sequences, tmp_path / "bf16", pooling="last", dtype="bfloat16")
    assert manifest["attention"] == ("lmdecomp_blocked" if blocked else "sdpa")
    a = np.concatenate([p.embedding for p in fp32]).astype(np.float64)
    b = np.concatenate([p.embedding for p in bf16]).astype(np.float64)
    cosine = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() > 0.999 and not np.array_equal(a, b)


def test_last_pooling_over_windows_is_refused(folders, sequences, tmp_path):
    ref = sources.resolve({"name": "dec", "path": str(folders["llama", "bytelevel", "right"])})
    with pytest.raises(embed.EmbedError, match=r"overflow: windows .* needs embed.pooling: mean \(got 'last'\).*"
                                               r"restarts a decoder's context.*set embed.overflow: truncate"):
        embed.embed_model(ref, sequences, tmp_path / "e", cfg(pooling="last", overflow="windows"), progress=False)
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_a_left_padding_tokenizer_is_padded_on_the_right(folders, sequences, tmp_path, pooling):
    """GPT-2's learned positions: a left-padded row would differ from its text alone by O(1)."""
    folder = folders["gpt2", "bytelevel", "left"]
    _, parts = embedded(folder, sequences, tmp_path / "emb", pooling=pooling)
    got = np.concatenate([p.embedding for p in parts]).astype(np.float64)
    want = np.stack([pooled_by_hand(s, pooling)[-1] for s in reference_states(folder)])
    assert np.abs(got - want).max() <= ATOL


def test_blocked_bfloat16_attention_of_a_decoder_without_grouped_heads(folders, sequences, tmp_path, monkeypatch):
    from transformers import LlamaConfig, LlamaModel

    monkeypatch.setattr(embed, "prefer_blocked_attention", lambda: True)
    folder = tmp_path / "llama-mha"
    shutil.copytree(folders["llama", "bytelevel", "right"], folder)
    torch.manual_seed(7)
    LlamaModel(LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128)).save_pretrained(folder)
    manifest, bf16 = embedded(folder, sequences, tmp_path / "bf16", pooling="last", dtype="bfloat16")
    assert manifest["attention"] == "lmdecomp_blocked"  # rotary under autocast: a float32 query, bf16 scores
    _, fp32 = embedded(folder, sequences, tmp_path / "fp32", pooling="last")
    a = np.concatenate([s.embedding for s in fp32]).astype(np.float64)
    b = np.concatenate([s.embedding for s in bf16]).astype(np.float64)
    cosine = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() > 0.999 and not np.array_equal(a, b)
