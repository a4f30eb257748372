"""Which of a set of pids still run (a zombie does not count, as in ``nemo_gym_adapter.runtime.procs.alive``), and waiting
for them to be gone: the teardown checks of the lifecycle tests."""

from __future__ import annotations

import time
from collections.abc import Iterable

from nemo_gym_adapter.runtime.procs import alive


def alive_pids(pids: Iterable[int]) -> list[int]:
    return [p for p in pids if alive(p)]


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """The pids still alive after up to ``timeout`` seconds (``[]`` as soon as all are gone)."""
    pids = list(pids)
    deadline = time.monotonic() + timeout
    while (left := alive_pids(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
