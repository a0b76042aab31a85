"""Embedding extraction against an explicit one-sequence-at-a-time loop."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from embed_reference import TEXTS, cfg, reference, reference_windows, sequences  # noqa: F401  (fixture)
from lmdecomp.models import embed, sources
from lmdecomp.data import shards

@pytest.mark.parametrize("pooling,layer", [("mean", -1), ("padded_mean", 1), ("cls", 0)])
def test_pooled_embeddings_equal_an_unbatched_loop(tiny_model_dir, sequences, tmp_path, pooling, layer):
    ref = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    out = tmp_path / "emb"
    manifest = embed.embed_model(ref, sequences, out, cfg(pooling=pooling, layer=layer, overflow="truncate"),
                                 progress=False)
    parts = list(shards.iter_shards(out))
    assert [len(p.seq_id) for p in parts] == [3, 3, 1]
    got = np.concatenate([p.embedding for p in parts])
    assert np.concatenate([p.seq_id for p in parts]).tolist() == [i * 10 for i in range(len(TEXTS))]
    for i, text in enumerate(TEXTS):
        np.testing.assert_allclose(got[i], reference(tiny_model_dir, text, layer, pooling, 40), atol=2e-5)
    assert manifest["dim"] == 32 and manifest["rows"] == len(TEXTS)
    assert manifest["truncated_sequences"] == 1  # the long sentence exceeds 40 tokens
    assert manifest["split_counts"] == {"test": 2, "train": 3, "val": 2}
    assert manifest["weights_sha256"] == sources.weights_sha256(ref.load_model())
    on_disk = json.loads((out / shards.MANIFEST).read_text())
    assert on_disk == json.loads(json.dumps(manifest))


@pytest.mark.parametrize("max_length", [12, 40])
def test_long_texts_are_embedded_whole_in_windows(tiny_model_dir, sequences, tmp_path, max_length):
    ref = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    manifest = embed.embed_model(ref, sequences, tmp_path / "emb", cfg(max_length=max_length, batch_tokens=30),
                                 progress=False)
    got = np.concatenate([p.embedding for p in shards.iter_shards(tmp_path / "emb")])
    for i, text in enumerate(TEXTS):
        np.testing.assert_allclose(got[i], reference_windows(tiny_model_dir, text, -1, max_length), atol=2e-5)
    from transformers import AutoTokenizer

    lengths = [len(ids) for ids in AutoTokenizer.from_pretrained(tiny_model_dir)(TEXTS)["input_ids"]]
    assert manifest["overflow"] == "windows" and manifest["truncated_sequences"] == 0
    assert manifest["windowed_sequences"] == sum(n > max_length for n in lengths) > 0


def test_windows_need_mean_pooling(tiny_model_dir, sequences, tmp_path):
    ref = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    with pytest.raises(embed.EmbedError, match="overflow: windows .* needs embed.pooling: mean"):
        embed.embed_model(ref, sequences, tmp_path / "e", cfg(pooling="cls", overflow="windows"), progress=False)
    assert not (tmp_path / "e").exists()


def test_token_budget_batches_cover_every_row_once_within_budget():
    lengths = np.array([5, 40, 12, 12, 3, 7, 40, 1, 9])
    batches = list(embed.token_budget_batches(lengths, batch_tokens=50))
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(len(lengths)))
    for b in batches:
        assert len(b) == 1 or len(b) * lengths[b].max() <= 50
        assert lengths[b[0]] == lengths[b].max()


def test_rerun_resumes_from_finished_shards_and_gives_the_same_bytes(tiny_model_dir, sequences, tmp_path):
    ref = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    out = tmp_path / "emb"
    embed.embed_model(ref, sequences, out, cfg(), progress=False)
    before = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    # Simulate a job killed after the first shard: later shards and the manifest are gone.
    (out / "part-00002.parquet").unlink()
    (out / "part-00001.parquet").unlink()
    (out / shards.MANIFEST).unlink()
    mtime = (out / "part-00000.parquet").stat().st_mtime_ns
    embed.embed_model(ref, sequences, out, cfg(), progress=False)
    assert (out / "part-00000.parquet").stat().st_mtime_ns == mtime  # reused, not recomputed
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == before
    # A different plan (another pooling) starts clean instead of mixing shards.
    embed.embed_model(ref, sequences, out, cfg(pooling="cls"), progress=False)
    assert json.loads((out / shards.MANIFEST).read_text())["pooling"] == "cls"
    assert pq.read_table(out / "part-00000.parquet").num_rows == 3


def test_a_killed_jobs_work_folder_is_resumed_only_with_the_same_weights(tiny_model_dir, sequences, tmp_path):
    import shutil

    from transformers import AutoModel

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    ref = sources.resolve({"name": "tiny", "path": str(folder)})
    out, work = tmp_path / "emb", tmp_path / ".emb.partial"
    embed.embed_model(ref, sequences, out, cfg(), progress=False, work_dir=work)
    assert not work.exists() and (out / shards.MANIFEST).is_file()
    old = {p.name: p.read_bytes() for p in out.iterdir()}

    def kill_after_first_shard():  # what a killed job leaves: its work folder; the engine removes out
        shutil.copytree(out, work)
        for name in ("part-00001.parquet", "part-00002.parquet", shards.MANIFEST):
            (work / name).unlink()
        shutil.rmtree(out)

    kill_after_first_shard()
    inode = (work / "part-00000.parquet").stat().st_ino
    embed.embed_model(ref, sequences, out, cfg(), progress=False, work_dir=work)
    assert (out / "part-00000.parquet").stat().st_ino == inode  # resumed: the same file
    assert {p.name: p.read_bytes() for p in out.iterdir()} == old and not work.exists()

    kill_after_first_shard()
    model = AutoModel.from_pretrained(folder)  # the weights change in place: same folder, same params
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.mul_(2.0)
    model.save_pretrained(folder)
    embed.embed_model(ref, sequences, out, cfg(), progress=False, work_dir=work)
    fresh = tmp_path / "fresh"
    embed.embed_model(ref, sequences, fresh, cfg(), progress=False)
    new = {p.name: p.read_bytes() for p in out.iterdir()}
    assert new == {p.name: p.read_bytes() for p in fresh.iterdir()}
    assert new["part-00000.parquet"] != old["part-00000.parquet"]


def test_resume_skips_damaged_shards_half_written_files_and_other_thread_counts(tiny_model_dir, sequences,
                                                                               tmp_path):
    """What a killed job can leave besides finished shards: the temporary of the shard it was
    writing (SIGKILL skips the cleanup), a shard damaged since (its bytes still parse, into
    wrong numbers), and shards computed with another thread count (other rounding)."""
    import shutil

    ref = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    out, work, fresh = tmp_path / "emb", tmp_path / ".emb.partial", tmp_path / "fresh"
    embed.embed_model(ref, sequences, fresh, cfg(), progress=False)
    expected = {p.name: p.read_bytes() for p in fresh.iterdir()}
    assert embed.FINISHED in expected  # the journal of finished shards travels with them

    def killed_work_folder(threads=1):
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        embed.embed_model(ref, sequences, work, cfg(threads=threads), progress=False)
        for name in ("part-00002.parquet", shards.MANIFEST):
            (work / name).unlink()
        (work / ".part-00002.parquet.k1ll3d.tmp").write_bytes(b"PAR1 half a shard")

    killed_work_folder()
    data = bytearray((work / "part-00000.parquet").read_bytes())
    data[len(data) // 3] ^= 0x10  # one bit in the compressed vectors
    (work / "part-00000.parquet").write_bytes(bytes(data))
    inode = (work / "part-00001.parquet").stat().st_ino
    embed.embed_model(ref, sequences, out, cfg(), progress=False, work_dir=work)
    assert (out / "part-00001.parquet").stat().st_ino == inode  # the intact shard was resumed
    assert {p.name: p.read_bytes() for p in out.iterdir()} == expected  # the rest recomputed, no .tmp

    killed_work_folder(threads=2)
    assert json.loads((work / embed.PLAN).read_text())["threads"] == 2
    # stand in for 2 threads' rounding (this tiny model may round alike on 1 and 2): a whole,
    # recorded shard that differs from what 1 thread writes; the plan alone must reject it
    shard = shards.read_shard(work / "part-00001.parquet")
    shards.write_shard(work / "part-00001.parquet", shard.seq_id, list(shard.split), shard.embedding * 2, 2)
    finished = json.loads((work / embed.FINISHED).read_text())
    finished["part-00001.parquet"] = shards.shard_entry(work, "part-00001.parquet", 0)["sha256"]
    (work / embed.FINISHED).write_text(json.dumps(finished))
    embed.embed_model(ref, sequences, out, cfg(threads=1), progress=False, work_dir=work)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == expected


def test_an_unknown_dtype_is_refused(tiny_model_dir, sequences, tmp_path):
    ref = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    with pytest.raises(embed.EmbedError, match=r"embed.dtype is 'float16'; choose one of \('float32', 'bfloat16'\)"):
        embed.embed_model(ref, sequences, tmp_path / "e", cfg(dtype="float16"), progress=False)


def test_weights_other_than_the_model_stage_recorded_are_refused(tiny_model_dir, sequences, tmp_path):
    ref = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    recorded = sources.prepare_model({"name": "tiny", "path": str(tiny_model_dir)}, tmp_path / "m")["weights_sha256"]
    manifest = embed.embed_model(ref, sequences, tmp_path / "ok", cfg(), progress=False, expected_weights=recorded)
    assert manifest["weights_sha256"] == recorded
    with pytest.raises(embed.EmbedError, match="not the ones the model stage recorded"):
        embed.embed_model(ref, sequences, tmp_path / "e", cfg(), progress=False, work_dir=tmp_path / ".e.partial",
                          expected_weights="0" * 64)
    assert not (tmp_path / "e").exists() and not (tmp_path / ".e.partial").exists()


def test_bad_layer_is_a_clear_error(tiny_model_dir, sequences, tmp_path):
    ref = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    with pytest.raises(embed.EmbedError, match="embed.layer=7 but the model has 3 hidden states"):
        embed.embed_model(ref, sequences, tmp_path / "e", cfg(layer=7), progress=False)


@pytest.mark.parametrize("blocked", [True, False])  # a CPU without AMX, and one with
def test_bfloat16_stays_near_float32_and_is_deterministic_with_either_attention(tiny_model_dir, sequences, tmp_path,
                                                                               monkeypatch, blocked):
    monkeypatch.setattr(embed, "prefer_blocked_attention", lambda: blocked)
    ref = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    fp32 = embed.embed_model(ref, sequences, tmp_path / "fp32", cfg(), progress=False)
    bf16 = embed.embed_model(ref, sequences, tmp_path / "bf16", cfg(dtype="bfloat16"), progress=False)
    assert fp32["attention"] == "sdpa" and bf16["attention"] == ("lmdecomp_blocked" if blocked else "sdpa")
    a = np.concatenate([p.embedding for p in shards.iter_shards(tmp_path / "fp32")]).astype(np.float64)
    b = np.concatenate([p.embedding for p in shards.iter_shards(tmp_path / "bf16")]).astype(np.float64)
    cosine = np.sum(a * b, 1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() > 0.999  # 2 random layers in bf16: a few 2⁻⁸ relative
    assert not np.array_equal(a, b)  # it really ran in reduced precision
    embed.embed_model(ref, sequences, tmp_path / "again", cfg(dtype="bfloat16"), progress=False)
    for name in sorted(p.name for p in (tmp_path / "bf16").glob("part-*")):
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "bf16" / name).read_bytes()


@pytest.mark.parametrize("native", [True, False])  # a Zen 4 or AMX CPU, and an AVX2-only one
def test_bfloat16_on_a_cpu_without_native_bf16_warns_and_names_the_fix(tiny_model_dir, sequences, tmp_path,
                                                                       monkeypatch, native):
    monkeypatch.setattr(embed, "cpu_has_native_bf16", lambda: native)
    ref = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        embed.embed_model(ref, sequences, tmp_path / "bf16", cfg(dtype="bfloat16"), progress=False)
    emulated = [str(w.message) for w in caught if "emulated" in str(w.message)]
    if native:
        assert emulated == []
    else:
        assert emulated == ["model 'tiny': embed.dtype bfloat16 on a CPU without avx512_bf16 or AMX is emulated "
                            "(usually slower than float32); set embed.dtype: float32 (config/float32.yaml)"]


@pytest.mark.parametrize("rust_backend", [True, False])
def test_truncated_rows_match_the_untruncated_lengths(tiny_model_dir, rust_backend):
    from transformers import AutoTokenizer, BatchEncoding

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    lengths = [len(ids) for ids in tok(TEXTS)["input_ids"]]
    for max_length in sorted({*lengths, *(n - 1 for n in lengths), 3}):
        encoded = tok(TEXTS, truncation=True, max_length=max_length)
        if not rust_backend:
            encoded = BatchEncoding(dict(encoded))  # as a Python tokenizer returns it: no .encodings
            assert encoded.encodings is None
        assert embed.truncated_rows(tok, TEXTS, encoded, max_length) == [n > max_length for n in lengths]
