"""Fixtures of the dataset-source tests: the test datasets of ``hub_dataset_layout``, and the
Hugging Face caches redirected into a temporary folder, offline, for one test module at a time."""

from __future__ import annotations

import pytest

from hub_dataset_layout import write_reviews, write_topics


@pytest.fixture(scope="module")
def hf_caches(tmp_path_factory):
    """datasets' Arrow cache and the hub cache under a temporary folder, with the hub offline."""
    import datasets
    from huggingface_hub import constants

    root = tmp_path_factory.mktemp("hf")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets.config, "HF_DATASETS_CACHE", root / "datasets")
        patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        patch.setattr(constants, "HF_HUB_CACHE", str(root / "hub"))
        yield root


@pytest.fixture(scope="module")
def reviews(tmp_path_factory, hf_caches):
    return write_reviews(tmp_path_factory.mktemp("reviews") / "reviews")


@pytest.fixture(scope="module")
def topics(tmp_path_factory, hf_caches):
    return write_topics(tmp_path_factory.mktemp("topics") / "topics")
