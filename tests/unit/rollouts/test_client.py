"""Unit tests of the rollout client against fake Gym servers (``tests/support/fake_gym.py``)."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemo_gym_adapter.errors import AdapterConfigError, AdapterError, GymServerError
from nemo_gym_adapter.rollouts.client import (
    BlockingRolloutClient,
    RolloutClient,
    RolloutClientConfig,
    apply_overrides,
)
from nemo_gym_adapter.runtime.procs import free_port
from tests.support.fake_gym import GYM_CONFIG, FakeEnvServer, FakeHeadServer, routes_for


def rows(n: int, agent: str = "agent_a", **fake: Any) -> list[dict[str, Any]]:
    return [
        {"id": i, "agent_ref": {"name": agent}, "responses_create_params": {"input": f"q{i}"}, "fake": dict(fake)}
        for i in range(n)
    ]


def fast(**kw: Any) -> RolloutClientConfig:
    return RolloutClientConfig(**{"timeout_s": 5.0, "retry_backoff_s": 0.01, "progress": False, **kw})


async def test_results_come_back_in_input_order(fake_server):
    batch = rows(8)
    for i, row in enumerate(batch):
        row["fake"]["sleep"] = 0.05 * (8 - i)  # later rows finish first
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast()) as client:
        out = await client.run(batch)
    assert [o.index for o in out] == list(range(8))
    assert [o.result["id"] for o in out] == list(range(8))
    assert all(o.ok and o.agent == "agent_a" and o.server == "agent_a_environment_server" for o in out)
    assert all(o.attempts == 1 and o.latency_s > 0 for o in out)


async def test_concurrency_bound_is_respected(fake_server):
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast(max_concurrency=3)) as client:
        out = await client.run(rows(12, sleep=0.1))
    assert all(o.ok for o in out)
    assert fake_server.max_in_flight == 3


async def test_time_queued_behind_other_rows_does_not_count_against_the_timeout(fake_server):
    # 5 rows x 0.3 s through one slot take 1.5 s in all, each well inside its 0.9 s budget (3x its own time: a margin
    # that holds with both cores busy; the last rows wait longer than the budget, so counting the queue would fail).
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast(max_concurrency=1, timeout_s=0.9)) as c:
        out = await c.run(rows(5, sleep=0.3))
    assert all(o.ok for o in out), [o.failure for o in out]


async def test_timeout_becomes_failure_record_without_hanging(fake_server):
    batch = rows(4)
    batch[1]["fake"]["sleep"] = 3
    t0 = time.monotonic()
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast(timeout_s=0.5)) as client:
        out = await client.run(batch)
    assert time.monotonic() - t0 < 5
    assert [o.ok for o in out] == [True, False, True, True]
    assert out[1].failure.reason == "timeout" and "agent_a_environment_server" in out[1].failure.detail
    assert out[1].attempts == 1 and fake_server.hits["1"] == 1  # a timeout is never retried


async def test_connection_drops_are_retried_up_to_the_cap(fake_server):
    batch = rows(3)
    batch[0]["fake"]["drop_first"] = 2  # recovers on the 3rd try (2 retries)
    batch[1]["fake"]["drop_first"] = 99  # never recovers
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast(max_connection_retries=2)) as client:
        out = await client.run(batch)
        assert client.resends == 4  # 2 + 2 re-sends after connection errors, counted (core.resend_metrics)
    assert out[0].ok and out[0].attempts == 3
    assert out[1].failure.reason == "connection" and out[1].attempts == 3 and fake_server.hits["1"] == 3
    assert out[2].ok and out[2].attempts == 1


async def test_refused_connection_is_a_connection_failure_after_retries():
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with RolloutClient(routes_for(("agent_a", dead)), fast(max_connection_retries=1)) as client:
        out = await client.run(rows(2))
    assert [o.failure.reason for o in out] == ["connection", "connection"]
    assert all(o.attempts == 2 and dead in o.failure.detail for o in out)


@pytest.mark.parametrize("status", [400, 422, 500, 503])
async def test_http_errors_are_not_retried(fake_server, status):
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast()) as client:
        out = await client.run(rows(2, status=status))
    assert [o.failure.reason for o in out] == [f"http_{status}"] * 2
    assert out[0].failure.status == status and "fake failure for row 0" in out[0].failure.detail
    assert fake_server.hits == {"0": 1, "1": 1}


@pytest.mark.parametrize("raw", ["not json", "[1, 2]", ""])
async def test_non_object_answers_are_bad_json(fake_server, raw):
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast()) as client:
        out = await client.run(rows(1, raw=raw))
    assert out[0].failure.reason == "bad_json" and out[0].failure.status == 200


async def test_unroutable_rows_are_failures_and_never_sent(fake_server):
    batch = rows(4)
    batch[1]["agent_ref"] = {"name": "no_such_agent"}
    del batch[2]["agent_ref"]
    batch[3]["agent_ref"] = "agent_a"  # a plain string is a valid agent_ref too
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast()) as client:
        out = await client.run(batch)
    assert [o.failure.reason if o.failure else "ok" for o in out] == ["ok", "unknown_agent", "unknown_agent", "ok"]
    assert "no_such_agent" in out[1].failure.detail and "row 1" in out[1].failure.detail and out[1].attempts == 0
    assert "row 2" in out[2].failure.detail
    assert set(fake_server.hits) == {"0", "3"}


async def test_a_row_that_is_not_an_object_is_a_failure_not_a_crash(fake_server):
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast()) as client:
        out = await client.run([rows(1)[0], ["not", "a", "row"], None])
    assert out[0].ok and [o.failure.reason for o in out[1:]] == ["client_error", "client_error"]
    assert "row 1 is a list" in out[1].failure.detail


async def test_mixed_batch_preserves_count_and_routes_per_agent(fake_server):
    other = FakeEnvServer()
    try:
        routes = routes_for(("agent_a", fake_server.url), ("agent_b", other.url))
        batch = rows(6) + rows(6, agent="agent_b") + rows(2, status=500) + rows(1, agent="ghost")
        async with RolloutClient(routes, fast()) as client:
            out = await client.run(batch)
        assert len(out) == len(batch) and [o.index for o in out] == list(range(len(batch)))
        assert [o.agent for o in out[:12]] == ["agent_a"] * 6 + ["agent_b"] * 6
        assert len(fake_server.bodies) == 8 and len(other.bodies) == 6
        assert sum(o.ok for o in out) == 12
    finally:
        other.stop()


async def test_overrides_reach_the_server_and_rows_stay_untouched(fake_server):
    batch = rows(2)
    batch[0]["responses_create_params"]["temperature"] = 0.1
    before = copy.deepcopy(batch)
    overrides = {"temperature": 1.0, "top_p": None, "max_output_tokens": 64}
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast()) as client:
        out = await client.run(batch, overrides=overrides)
    assert batch == before
    sent = out[0].result["echo"]["responses_create_params"]
    assert sent == {"input": "q0", "temperature": 1.0, "max_output_tokens": 64}
    assert client.resends == 0
    assert out[0].result["echo"]["agent_ref"] == {"name": "agent_a"}


async def test_cookies_from_one_rollout_never_reach_another(fake_server):
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast(max_concurrency=1)) as client:
        await client.run(rows(3))
        await client.run(rows(2))
    assert fake_server.cookie_headers == [None] * 5


async def test_on_outcome_sees_every_row_once_in_completion_order(fake_server):
    batch = rows(4)
    for i, row in enumerate(batch):
        row["fake"]["sleep"] = 0.1 * (4 - i)  # the last row finishes first
    batch.append({"agent_ref": {"name": "ghost"}, "id": 9})  # never sent: its outcome comes at once
    seen: list[int] = []

    async def hook(outcome):  # an async hook is awaited before the row counts as done
        await asyncio.sleep(0)
        seen.append(outcome.index)

    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast()) as client:
        out = await client.run(batch, on_outcome=hook)
    assert [o.index for o in out] == [0, 1, 2, 3, 4]
    assert seen == [4, 3, 2, 1, 0]


async def test_a_failing_hook_fails_the_call_and_cancels_the_rows_in_flight(fake_server):
    batch = rows(5, sleep=5.0)
    batch[0]["fake"]["sleep"] = 0.0

    def hook(outcome):
        raise RuntimeError(f"consumer broke on row {outcome.index}")

    before = {t for t in asyncio.all_tasks() if not t.done()}
    t0 = time.monotonic()
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast(timeout_s=30)) as client:
        with pytest.raises(RuntimeError, match="consumer broke on row 0"):
            await client.run(batch, on_outcome=hook)
    assert time.monotonic() - t0 < 4  # the four slow rows were cancelled, not waited for
    assert {t for t in asyncio.all_tasks() if not t.done()} == before  # no orphan tasks


def test_blocking_client_from_sync_code(fake_server):
    with BlockingRolloutClient(routes_for(("agent_a", fake_server.url)), fast()) as client:
        first = client.run(rows(3))
        second = client.run(rows(2), overrides={"temperature": 0.5})
    assert [o.result["id"] for o in first] == [0, 1, 2]
    assert second[1].result["echo"]["responses_create_params"]["temperature"] == 0.5


async def test_blocking_client_inside_a_running_event_loop(fake_server):
    # verl may call generate_sequences from a thread that already runs a loop (Ray async actors).
    with BlockingRolloutClient(routes_for(("agent_a", fake_server.url)), fast()) as client:
        out = client.run(rows(2))
    assert all(o.ok for o in out)


def test_config_rejects_bad_values_naming_the_key():
    with pytest.raises(AdapterConfigError, match="rollout_client.max_concurrency=0"):
        RolloutClientConfig(max_concurrency=0)
    with pytest.raises(AdapterConfigError, match="trainer.gym.timeout_s"):
        RolloutClientConfig(timeout_s=0, key_prefix="trainer.gym")
    with pytest.raises(AdapterConfigError, match="rollout_client.max_body_mb=0"):
        RolloutClientConfig(max_body_mb=0)
    assert RolloutClientConfig(max_body_mb=1.5).max_body_bytes == 1572864


def test_blocking_client_connects_through_the_head_server(fake_server):
    config = copy.deepcopy(GYM_CONFIG)
    config["weather_environment_server"]["environment_servers"]["legacy_agent"]["port"] = fake_server.port
    head = FakeHeadServer(config)
    try:
        client = BlockingRolloutClient.connect(head.url, fast())
    finally:
        head.stop()  # routes are fetched once, at connect: the head is not needed afterwards
    out = client.run(rows(2, agent="weather_simple_agent") + [{"task_source": "weather", "id": 9}])
    client.close()
    assert [o.result["id"] for o in out] == [0, 1, 9]
    assert {o.server for o in out} == {"weather_environment_server"}
    with pytest.raises(AdapterError, match="closed"):
        client.run(rows(1))


async def test_client_connects_through_the_head_server_the_way_gym_routes():
    head = FakeHeadServer()  # the weather agent's server from the config, env_2 from /server_instances only
    try:
        client = await RolloutClient.connect(head.url, fast())
    finally:
        head.stop()
    try:
        assert client.routes.resolve({"agent_ref": "weather_simple_agent"})[1].base_url == "http://127.0.0.1:9004"
        assert client.routes.servers_by_agent["twice"][1].base_url == "http://10.0.0.7:9007"
        assert client.routes.capture_dir is None  # the head's config has no token-ID capture
    finally:
        await client.close()


def test_connecting_to_an_unreachable_head_server_names_it():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(GymServerError, match=f"Gym head server {url}: not reachable"):
        BlockingRolloutClient.connect(url)


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5), st.lists, max_leaves=5)


@given(
    params=st.dictionaries(st.text(max_size=5), json_values, max_size=4),
    overrides=st.dictionaries(
        st.sampled_from(["temperature", "top_p", "max_output_tokens"]), st.none() | st.floats(0, 2)
    ),
)
def test_apply_overrides_never_mutates_and_skips_none(params, overrides):
    row = {"responses_create_params": params, "task_source": "x"}
    before = json.dumps(row, sort_keys=True)
    body = apply_overrides(row, "a", overrides)
    assert json.dumps(row, sort_keys=True) == before
    for key, value in overrides.items():
        own = params.get(key)
        if value is not None and key == "max_output_tokens" and isinstance(own, int) and not isinstance(own, bool):
            value = min(own, value) if own >= 1 else value  # a cap on the row's own budget (rollouts.sampling)
        assert body["responses_create_params"].get(key) == (value if value is not None else own)
    assert body["agent_ref"] == {"name": "a"} and body["task_source"] == "x"


# ------------------------------------------------------------------------- issue 19: Gym's rollout id and capture


async def test_every_dispatch_carries_its_own_rollout_id(fake_server):
    """Gym keys token-ID capture and prefix supply by ``_ng_rollout_id``: unique per dispatch, across calls too (a
    row repeated n times for GRPO, or in the next step), never the row's own, a new one on a resend."""
    batch = rows(3)
    batch[0]["_ng_rollout_id"] = "from-the-dataset"
    batch[2]["fake"]["drop_first"] = 1  # one connection drop (first run only): the first send may have reached Gym
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast()) as client:
        first = await client.run(batch)
        again = await client.run(batch)
    sent = [body["_ng_rollout_id"] for body in fake_server.bodies]
    assert len(sent) == len(set(sent)) == 7 and "from-the-dataset" not in sent  # 3 + 1 resend, then 3
    assert all(s.startswith("ngv-") for s in sent)
    assert [len(o.rollout_ids) for o in first + again] == [1, 1, 2, 1, 1, 1]
    assert {i for o in first + again for i in o.rollout_ids} == set(sent)
    assert batch[0]["_ng_rollout_id"] == "from-the-dataset"  # the caller's row is untouched


async def test_capture_files_are_retired_once_the_outcome_was_handed_on(fake_server, tmp_path):
    routes = routes_for(("agent_a", fake_server.url))
    routes.capture_dir = str(tmp_path)
    seen: list[list[str]] = []

    def on_outcome(outcome) -> None:
        # Gym's store wrote these while the rollout ran; the hook still sees them.
        for suffix in (".tokens.jsonl", ".tokens.state.json", ".tokens.lock"):
            (tmp_path / f"{outcome.rollout_ids[-1]}{suffix}").write_text("{}")
        seen.append(sorted(p.name for p in tmp_path.iterdir()))

    (tmp_path / "someone-else.tokens.jsonl").write_text("{}")
    async with RolloutClient(routes, fast()) as client:
        out = await client.run(rows(2), on_outcome=on_outcome)
    assert all(len(names) >= 4 for names in seen)
    assert [p.name for p in tmp_path.iterdir()] == ["someone-else.tokens.jsonl"]
    assert all(o.ok for o in out)
