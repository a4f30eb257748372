"""Unit-tier fixtures: fake Gym servers (``tests/support/fake_gym.py``) and a fake Gym venv
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
