"""Unit-tier fixtures: an empty datasets cache per test, fake Gym servers (``tests/support/fake_gym.py``) and a fake Gym venv
(``tests/support/fake_gym_venv.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fake_gym import FakeEnvServer
from tests.support.fake_gym_venv import make_fake_gym_venv


@pytest.fixture
def fake_server() -> Iterator[FakeEnvServer]:
    """A fake environment server serving ``POST /run`` on a free port; stopped after the test."""
    server = FakeEnvServer()
    yield server
    server.stop()


@pytest.fixture
def fake_gym_venv(tmp_path: Path) -> Path:
    """A directory shaped like the Gym venv: bin/python, bin/gym (the fake Gym), site-packages with nemo_gym/."""
    return make_fake_gym_venv(tmp_path)


@pytest.fixture(autouse=True)
def isolated_datasets_cache(tmp_path_factory, monkeypatch):
    """Every unit test gets an empty ``HF_DATASETS_CACHE``: the Gym dataset's validated-rows cache
    (:mod:`nemo_gym_adapter.dataset_store`) never reads or fills the user's, and no test hits another's entries."""
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_datasets")))
