"""Unit tests of the event-loop thread that sync callers use to run the async rollout code."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from nemo_gym_adapter.errors import AdapterError
from nemo_gym_adapter.runtime.loop_thread import LoopThread


def test_runs_coroutines_on_its_own_thread_and_refuses_after_close():
    loop = LoopThread("test-loop")

    async def where() -> str:
        return threading.current_thread().name

    assert loop.run(where()) == "test-loop"
    loop.close()
    loop.close()  # idempotent
    with pytest.raises(AdapterError, match="test-loop: closed"):
        loop.run(where())


def test_a_call_from_its_own_thread_is_refused_not_deadlocked():
    loop = LoopThread("test-loop")

    async def reenter() -> None:
        async def inner() -> None:
            return None

        loop.run(inner())

    try:
        with pytest.raises(AdapterError, match="own event-loop thread"):
            loop.run(reenter())
    finally:
        loop.close()


def test_close_runs_the_last_coroutine_first():
    loop = LoopThread("test-loop")
    done = []

    async def last() -> None:
        await asyncio.sleep(0)
        done.append(True)

    loop.close(last())
    assert done == [True]


def test_event_loop_is_uvloop_where_installed_unless_switched_off(monkeypatch):
    from nemo_gym_adapter.runtime.loop_thread import UVLOOP_ENV, new_event_loop

    uvloop = pytest.importorskip("uvloop")  # vLLM depends on it, so the trainer venv has it
    loop = new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()
    monkeypatch.setenv(UVLOOP_ENV, "0")
    loop = new_event_loop()
    try:
        assert not isinstance(loop, uvloop.Loop) and isinstance(loop, asyncio.AbstractEventLoop)
    finally:
        loop.close()


def test_submit_returns_at_once_and_the_future_carries_the_result():
    gate = threading.Event()
    loop = LoopThread("t-submit")
    try:

        async def wait_for_gate() -> str:
            while not gate.is_set():
                await asyncio.sleep(0.01)
            return threading.current_thread().name

        future = loop.submit(wait_for_gate())
        assert not future.done()  # submit did not wait
        gate.set()
        assert future.result(timeout=5) == "t-submit"
    finally:
        loop.close()
    coro = wait_for_gate()
    with pytest.raises(AdapterError, match="closed"):
        loop.submit(coro)


def test_close_cancels_pending_tasks_and_lets_them_unwind_on_the_loop():
    """A task left pending would be destroyed at process exit and run its clean-up then (after Ray shut down)."""
    loop = LoopThread("test-loop")
    unwound = []

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0.01)  # clean-up that itself awaits
            unwound.append(True)
            raise

    future = loop.submit(forever())
    time.sleep(0.05)
    loop.close()
    assert unwound == [True] and future.cancelled()
