"""Unit-tier fixtures: fake Gym servers (``tests/support/fake_gym.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fake_gym import FakeEnvServer


@pytest.fixture
def fake_server() -> Iterator[FakeEnvServer]:
    """A fake environment server serving ``POST /run`` on a free port; stopped after the test."""
    server = FakeEnvServer()
    yield server
    server.stop()
