"""A console a user can read: each distinct log message of a noisy logger at most once per process.

:class:`OncePerProcess` is a ``logging.Filter`` that lets the first record of each distinct message through and
drops its repeats, so a notice that third-party code logs on every step (vLLM's ``RotaryEmbedding: Failed to load
weights`` at every weight sync) is still seen -- once -- and never hides a different message. :func:`once` attaches
it to a logger by name (idempotent).
"""

from __future__ import annotations

import logging
import threading


class OncePerProcess(logging.Filter):
    """Passes the first record of each distinct (level, message) pair, drops the rest (thread-safe)."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[int, str]] = set()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, record.getMessage())
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        return True


def once(logger_name: str) -> OncePerProcess:
    """Attach (once) a :class:`OncePerProcess` filter to the logger ``logger_name``; returns it."""
    log = logging.getLogger(logger_name)
    for existing in log.filters:
        if isinstance(existing, OncePerProcess):
            return existing
    flt = OncePerProcess()
    log.addFilter(flt)
    return flt
