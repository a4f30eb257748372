"""SIGTERM ends a test session the way Ctrl-C does (pytest plugin loaded by tests/conftest.py).

Python's default for SIGTERM is to die on the spot: no ``finally``, no fixture teardown. A CI job cancelled or a
runner's timeout then left every server the session had started running -- seen when a ``.ci/run`` was stopped with
SIGTERM: the session's vLLM server and a ``collect`` run's vLLM outlived pytest. Raised as ``KeyboardInterrupt`` in
the main thread, pytest stops, tears down every fixture (each stops what it started; e2e runs stop their recipe) and
exits with status 2 (interrupted).

Installed only where SIGTERM still has its default action, so a handler someone installed on purpose is kept.
"""

from __future__ import annotations

import signal
import threading


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_configure(config) -> None:
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
