"""Unit-tier fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def isolated_datasets_cache(tmp_path_factory, monkeypatch):
    """Every unit test gets an empty ``HF_DATASETS_CACHE``: the Gym dataset's validated-rows cache
    (:mod:`nemo_gym_adapter.dataset_store`) never reads or fills the user's, and no test hits another's entries."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_datasets")))
