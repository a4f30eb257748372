"""An asyncio event loop in a daemon thread: how synchronous callers (verl's legacy ``generate_sequences``, scripts)
use the async rollout code.

A dedicated loop works whether or not the calling thread already runs one (Ray async actors, Jupyter), and keeps
the aiohttp session bound to one loop for its whole life. Calls from the loop's own thread would deadlock and are
refused; a caller interrupted while waiting (``KeyboardInterrupt``) cancels the coroutine it was waiting for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from nemo_gym_adapter.errors import AdapterError

T = TypeVar("T")
logger = logging.getLogger(__name__)

UVLOOP_ENV = "NGV_UVLOOP"  # "0": the stdlib event loop even where uvloop is installed


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed (vLLM depends on it; about half the CPU per HTTP request of the
    stdlib loop, measured by ``benchmarks/bench_rollout_scale.py``), else asyncio's; ``NGV_UVLOOP=0`` forces asyncio's.
    """
    if os.environ.get(UVLOOP_ENV, "1") != "0":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


F = TypeVar("F", bound="BlockingFacade")


class LoopThread:
    """Runs coroutines on its own event loop, in a daemon thread named ``name``; :meth:`close` stops it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop = new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and block until it returns (or raises) in the caller's thread."""
        if self._closed:
            coro.close()
            raise AdapterError(f"{self.name}: closed")
        if threading.current_thread() is self._thread:
            coro.close()
            raise AdapterError(f"{self.name}: called from its own event-loop thread; use the async API there")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt: stop the in-flight work too
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop and return at once (fire-and-forget callers keep the future to wait for it or
        cancel it). Safe from any thread, the loop's own included."""
        if self._closed:
            coro.close()
            raise AdapterError(f"{self.name}: closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def close(self, last: Coroutine[Any, Any, Any] | None = None, cancel_timeout_s: float = 30.0) -> None:
        """Cancel the tasks still on the loop and wait (up to ``cancel_timeout_s``) until they have unwound, run
        ``last`` (e.g. closing an HTTP session), then stop the loop and join the thread. Idempotent.

        Tasks are finished here, in this thread's loop, rather than left pending: a pending task is destroyed when
        the process exits, and its clean-up code then runs at interpreter teardown (in the async recipe run that
        code reached Ray after Ray had shut down, and Ray started a fresh cluster)."""
        if self._closed:
            if last is not None:
                last.close()
            return
        try:
            self.run(_cancel_others_then(last, cancel_timeout_s, self.name))
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()


async def _cancel_others_then(last: Coroutine[Any, Any, Any] | None, timeout_s: float, name: str) -> None:
    me = asyncio.current_task()
    pending = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        _, still = await asyncio.wait(pending, timeout=timeout_s)
        if still:
            logger.warning("%s: %d task(s) did not finish within %.0fs of being cancelled", name, len(still), timeout_s)
    if last is not None:
        await last


class BlockingFacade:
    """Base of the synchronous faces of async objects: their coroutines run on a :class:`LoopThread`; :meth:`close`
    runs the object's async close there, then stops the thread. A context manager."""

    def __init__(self, name: str, aclose: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        self._loop = LoopThread(name)
        self._aclose = aclose

    def close(self) -> None:
        """Close the async object and stop the loop thread. Idempotent."""
        self._loop.close(self._aclose())

    def __enter__(self: F) -> F:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
