"""Unit tests of the trainer-agnostic rollout core against fake Gym environment servers (``tests/support``)."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest

from nemo_gym_adapter.rollouts.client import RolloutClientConfig
from nemo_gym_adapter.rollouts.core import BlockingRolloutCore, RolloutCore, RowCallbackError, RowResult
from nemo_gym_adapter.rollouts.metrics import compute_metrics
from nemo_gym_adapter.rollouts.trajectory import MaskReason, TrajectoryConfig
from tests.support.fake_gym import routes_for
from tests.support.gym_results import E0, G0, G1, P0, handmade_multiturn

TRAJ = TrajectoryConfig(prompt_length=16, response_length=16)


def client() -> RolloutClientConfig:
    return RolloutClientConfig(timeout_s=10.0, retry_backoff_s=0.01, progress=False)


def gym_row(i: int, agent: str = "agent_a", reward: float = 1.0, sleep: float = 0.0) -> dict[str, Any]:
    """A row whose fake answer is a real-shaped two-turn result with ``reward``."""
    result = handmade_multiturn(P0, [G0, G1], [E0], reward=reward)
    fake = {"result": result, "sleep": sleep}
    return {"id": i, "agent_ref": {"name": agent}, "responses_create_params": {"input": f"q{i}"}, "fake": fake}


def core_for(fake_server) -> RolloutCore:
    return RolloutCore(routes_for(("agent_a", fake_server.url)), TRAJ, client())


async def test_every_row_yields_one_result_in_input_order_with_training_metrics(fake_server):
    rows = [gym_row(i, reward=float(i % 2), sleep=0.05 * (4 - i)) for i in range(4)]
    rows.append({"id": 9, "agent_ref": {"name": "ghost"}})  # unroutable: a masked row, not an exception
    envs = ["agent_a"] * 4 + ["ghost"]
    async with core_for(fake_server) as core:
        step = await core.run_step(rows, envs, {"temperature": 0.5})
    assert [r.index for r in step.rows] == [0, 1, 2, 3, 4] and [r.env for r in step.rows] == envs
    assert [t.reward for t in step.trajectories] == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert step.trajectories[4].masked_reason is MaskReason.UNROUTABLE
    assert all(t.response_ids.tolist() == G0 + E0 + G1 for t in step.trajectories[:4])
    # The same metrics as training computes, plus the step's timings.
    own = {k: v for k, v in step.metrics.items() if "/timing/" not in k and "/client/" not in k}
    assert own == compute_metrics(step.trajectories)
    assert step.metrics["gym/client/resends"] == step.metrics["gym/client/resends_total"] == 0.0
    assert step.metrics["gym/agent_a/reward_mean"] == 0.5 and step.metrics["gym/all/masked_rate/unroutable"] == 0.2
    assert step.metrics["gym/timing/rollout_s"] == step.timings["rollout_s"] > 0
    assert fake_server.bodies[0]["responses_create_params"]["temperature"] == 0.5


async def test_on_row_sees_each_row_once_as_it_finishes(fake_server):
    rows = [gym_row(i, sleep=0.1 * (3 - i)) for i in range(3)]
    seen: list[RowResult] = []

    async def put(row: RowResult) -> None:  # e.g. a TransferQueue put
        await asyncio.sleep(0)
        seen.append(row)

    async with core_for(fake_server) as core:
        step = await core.run_step(rows, ["agent_a"] * 3, on_row=put)
    assert [r.index for r in seen] == [2, 1, 0]  # completion order
    assert sorted(seen, key=lambda r: r.index) == step.rows


async def test_a_raising_callback_aborts_the_step_naming_the_row_and_leaves_no_task(fake_server):
    rows = [gym_row(0)] + [gym_row(i, sleep=5.0) for i in range(1, 4)]

    def put(row: RowResult) -> None:
        raise ConnectionError("queue is gone")

    before = {t for t in asyncio.all_tasks() if not t.done()}
    t0 = time.monotonic()
    async with core_for(fake_server) as core:
        with pytest.raises(RowCallbackError, match=r"row 0 \(agent_a\).*queue is gone") as e:
            await core.run_step(rows, ["agent_a"] * 4, on_row=put)
    assert e.value.row_index == 0 and isinstance(e.value.__cause__, ConnectionError)
    assert time.monotonic() - t0 < 4  # the slow rows were cancelled, not waited for
    assert {t for t in asyncio.all_tasks() if not t.done()} == before


async def test_rows_without_routing_go_to_their_environment_and_rows_stay_untouched(fake_server):
    row = gym_row(0)
    del row["agent_ref"]
    before = copy.deepcopy(row)
    async with core_for(fake_server) as core:
        step = await core.run_step([row], ["agent_a"])
    assert row == before and not step.trajectories[0].masked
    assert fake_server.bodies[0]["agent_ref"] == {"name": "agent_a"}


async def test_lengths_must_match():
    core = RolloutCore(routes_for(), TRAJ, client())
    with pytest.raises(ValueError, match="2 rows but 1 environment names"):
        await core.run_step([{}, {}], ["a"])
    await core.aclose()


def test_blocking_core_from_sync_code_with_a_sync_callback(fake_server):
    seen = []
    with BlockingRolloutCore(core_for(fake_server)) as core:
        step = core.run_step([gym_row(0), gym_row(1)], ["agent_a"] * 2, on_row=lambda row: seen.append(row.index))
        again = core.run_step([gym_row(2)], ["agent_a"])
    assert sorted(seen) == [0, 1] and len(step.rows) == 2 and again.rows[0].outcome.result is not None


async def test_gc_is_paused_while_results_arrive_by_default_opt_out_and_restored_after(fake_server, monkeypatch):
    import gc

    from nemo_gym_adapter.rollouts.core import GC_PAUSE_ENV

    monkeypatch.delenv(GC_PAUSE_ENV, raising=False)
    seen: list[bool] = []
    async with core_for(fake_server) as core:
        await core.run_step([gym_row(0)], ["agent_a"], on_row=lambda r: seen.append(gc.isenabled()))
        monkeypatch.setenv(GC_PAUSE_ENV, "0")  # the opt-out: automatic collection as usual
        await core.run_step(
            [gym_row(i) for i in range(2)], ["agent_a"] * 2, on_row=lambda r: seen.append(gc.isenabled())
        )
        assert seen == [False, True, True] and gc.isenabled()
        monkeypatch.delenv(GC_PAUSE_ENV)

        def boom(row: RowResult) -> None:
            assert not gc.isenabled()
            raise RuntimeError("boom")

        with pytest.raises(RowCallbackError):
            await core.run_step([gym_row(0)], ["agent_a"], on_row=boom)
    assert gc.isenabled()  # restored on the error path too


async def test_gc_pause_frees_cycles_every_n_rows_and_after_the_step(fake_server, monkeypatch):
    import gc
    import weakref

    from nemo_gym_adapter.rollouts import core as rollout_core

    monkeypatch.delenv(rollout_core.GC_PAUSE_ENV, raising=False)
    monkeypatch.setattr(rollout_core, "GC_YOUNG_EVERY", 2)
    young: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            young.append(info["generation"])

    class Node:
        pass

    cycles: list[weakref.ref] = []

    def make_cycle(row: RowResult) -> None:  # garbage only the cyclic collector can free
        a, b = Node(), Node()
        a.other, b.other = b, a  # type: ignore[attr-defined]
        cycles.append(weakref.ref(a))
        alive.append(sum(ref() is not None for ref in cycles))

    alive: list[int] = []
    gc.callbacks.append(count)
    try:
        async with core_for(fake_server) as core:
            await core.run_step([gym_row(i) for i in range(5)], ["agent_a"] * 5, on_row=make_cycle)
    finally:
        gc.callbacks.remove(count)
    # The callback runs after the row was counted: rows 2 and 4 were preceded by a young collection, which freed
    # the cycles made before it; the last cycle is freed by the collection that ends the step.
    assert alive == [1, 1, 2, 1, 2], alive
    assert young and set(young) == {0}, young  # only young collections, never a full pass, during the step
    assert all(ref() is None for ref in cycles) and gc.isenabled()


def test_gc_pause_that_never_ends_still_runs_a_full_collection_now_and_then(monkeypatch):
    import gc

    from nemo_gym_adapter.rollouts import core as rollout_core

    monkeypatch.setattr(rollout_core, "GC_YOUNG_EVERY", 2)
    monkeypatch.setattr(rollout_core, "GC_FULL_EVERY", 3)
    generations: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            generations.append(info["generation"])

    gc.callbacks.append(count)
    try:
        with rollout_core.gc_paused():  # overlapping steps: the pause lasts for all their rows
            for _ in range(12):
                rollout_core.gc_row_done()
            during = list(generations)
    finally:
        gc.callbacks.remove(count)
    assert during == [0, 0, 2, 0, 0, 2], during  # a young collection every 2 rows, every 3rd of them full
    assert generations[len(during) :] == [0] and gc.isenabled()  # and the young one that ends the pause


def test_gc_pause_nests_and_leaves_a_disabled_collector_disabled():
    import gc

    from nemo_gym_adapter.rollouts.core import gc_paused

    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer step is still running
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # the caller switched it off: it stays off
    finally:
        gc.enable()


async def test_resends_after_connection_errors_are_counted_per_step_and_in_total(fake_server):
    rows = [gym_row(i) for i in range(3)]
    rows[0]["fake"]["drop_first"] = 2  # answered on its third send
    rows[1]["fake"]["drop_first"] = 1
    async with core_for(fake_server) as core:
        first = await core.run_step(rows, ["agent_a"] * 3)
        second = await core.run_step([gym_row(7)], ["agent_a"])
    assert all(not t.masked for t in first.trajectories)
    assert first.metrics["gym/client/resends"] == 3.0 and first.metrics["gym/client/resends_total"] == 3.0
    assert second.metrics["gym/client/resends"] == 0.0 and second.metrics["gym/client/resends_total"] == 3.0
