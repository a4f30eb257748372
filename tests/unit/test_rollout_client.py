"""Unit tests of the rollout client against fake Gym servers (aiohttp apps on free local ports).

``FakeEnvServer`` stands in for an environment server's ``/run``: each row says how the fake should behave
(``fake`` key: sleep, answer an HTTP error, drop the connection for the first N tries, answer non-JSON), and the
fake records what it received, how many requests were in flight at once, and which headers came in.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
from typing import Any

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from nemo_gym_adapter.errors import AdapterConfigError, AdapterError, GymServerError
from nemo_gym_adapter.procs import free_port
from nemo_gym_adapter.rollout_client import (
    BlockingRolloutClient,
    GymRoutes,
    RolloutClient,
    RolloutClientConfig,
    apply_overrides,
)


class FakeEnvServer:
    """An aiohttp server in its own thread and loop (so sync callers can block on it), serving ``POST /run``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.in_flight = 0
        self.max_in_flight = 0
        self.hits: dict[str, int] = {}
        self.bodies: list[dict[str, Any]] = []
        self.cookie_headers: list[str | None] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "fake server did not start"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/run", self._run)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    async def _run(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        self.cookie_headers.append(request.headers.get("Cookie"))
        fake = body.get("fake", {})
        rid = str(body.get("id"))
        self.hits[rid] = self.hits.get(rid, 0) + 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(fake.get("sleep", 0.0))
            if self.hits[rid] <= fake.get("drop_first", 0):
                request.transport.close()  # the client sees the connection die without an answer
                return web.Response()
            if "status" in fake:
                return web.Response(status=fake["status"], text=f"fake failure for row {rid}")
            if "raw" in fake:
                return web.Response(text=fake["raw"])
            response = web.json_response({"id": body.get("id"), "reward": 1.0, "echo": body})
            response.set_cookie("session", f"secret-{rid}")
            return response
        finally:
            self.in_flight -= 1

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def fake_server():
    server = FakeEnvServer()
    yield server
    server.stop()


def routes_for(*servers: tuple[str, str]) -> GymRoutes:
    """GymRoutes from a Gym-shaped config where agent ``name`` is fronted by a legacy_agent relay at ``url``."""
    config: dict[str, Any] = {"head_server": {"host": "127.0.0.1", "port": 1}}
    for name, url in servers:
        host, port = url.removeprefix("http://").split(":")
        config[name] = {"responses_api_agents": {"simple_agent": {"host": host, "port": 2}}}
        config[f"{name}_environment_server"] = {
            "environment_servers": {
                "legacy_agent": {
                    "host": host,
                    "port": int(port),
                    "agent_server": {"type": "responses_api_agents", "name": name},
                }
            }
        }
    return GymRoutes.from_config(config)


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
    # 4 rows x 0.3 s through one slot take 1.2 s in all, each well inside its 0.6 s budget.
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast(max_concurrency=1, timeout_s=0.6)) as c:
        out = await c.run(rows(4, sleep=0.3))
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
    assert out[0].result["echo"]["agent_ref"] == {"name": "agent_a"}


async def test_cookies_from_one_rollout_never_reach_another(fake_server):
    async with RolloutClient(routes_for(("agent_a", fake_server.url)), fast(max_concurrency=1)) as client:
        await client.run(rows(3))
        await client.run(rows(2))
    assert fake_server.cookie_headers == [None] * 5


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


GYM_CONFIG = {
    "head_server": {"host": "127.0.0.1", "port": 11000},
    "policy_model": {"responses_api_models": {"vllm_model": {"host": "127.0.0.1", "port": 9001}}},
    "weather": {"resources_servers": {"example_single_tool_call": {"host": "127.0.0.1", "port": 9002}}},
    "weather_simple_agent": {
        "responses_api_agents": {
            "simple_agent": {
                "host": "127.0.0.1",
                "port": 9003,
                "resources_server": {"type": "resources_servers", "name": "weather"},
            }
        }
    },
    "weather_environment_server": {
        "environment_servers": {
            "legacy_agent": {
                "host": "0.0.0.0",
                "port": 9004,
                "agent_server": {"type": "responses_api_agents", "name": "weather_simple_agent"},
            }
        }
    },
    "twice": {"responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": 9005}}},
    "env_1": {"environment_servers": {"legacy_agent": {"port": 9006, "agent_server": {"name": "twice"}}}},
    "env_2": {"environment_servers": {"legacy_agent": {"agent_server": {"name": "twice"}}}},
}
INSTANCES = [{"process_name": "env_2", "url": "http://10.0.0.7:9007"}]


def test_routes_from_gym_config():
    routes = GymRoutes.from_config(GYM_CONFIG, INSTANCES, head_host="10.0.0.5")
    agent, route = routes.resolve({"agent_ref": {"name": "weather_simple_agent"}})
    # The row goes to the environment server fronting the agent, never to the agent's own port.
    assert (agent, route.server, route.run_url) == (
        "weather_simple_agent",
        "weather_environment_server",
        "http://10.0.0.5:9004/run",
    )
    # task_source naming the resources server resolves through the one agent that uses it.
    assert routes.resolve({"task_source": "weather"})[1].server == "weather_environment_server"
    assert routes.resolve({"task_source": "weather_simple_agent"})[0] == "weather_simple_agent"
    ambiguous = routes.resolve({"agent_ref": "twice"}, index=7)
    assert ambiguous.reason == "ambiguous_agent" and "env_1" in ambiguous.detail and "row 7" in ambiguous.detail
    assert routes.resolve({"task_source": "policy_model"}).reason == "unknown_agent"
    assert sorted(r.base_url for r in routes.servers_by_agent["twice"]) == [
        "http://10.0.0.5:9006",
        "http://10.0.0.7:9007",
    ]


def test_route_without_address_names_the_server():
    with pytest.raises(GymServerError, match="env_2"):
        GymRoutes.from_config(GYM_CONFIG)


class FakeHeadServer(FakeEnvServer):
    """Serves the two head-server GETs the way Gym 0.7 does (the YAML config wrapped in a JSON string)."""

    def __init__(self, config: dict[str, Any] = GYM_CONFIG) -> None:
        self.config = config
        super().__init__()

    def _serve(self) -> None:
        import yaml

        async def config(_: web.Request) -> web.Response:
            return web.json_response(yaml.safe_dump(self.config))

        async def instances(_: web.Request) -> web.Response:
            return web.json_response(INSTANCES)

        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/global_config_dict_yaml", config)
        app.router.add_get("/server_instances", instances)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()


async def test_routes_fetched_from_head_server():
    head = FakeHeadServer()
    try:
        routes = await GymRoutes.fetch(head.url)
    finally:
        head.stop()
    assert routes.resolve({"agent_ref": "weather_simple_agent"})[1].base_url == "http://127.0.0.1:9004"


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


def test_unreachable_head_server_names_it():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(GymServerError, match=f"head server {url}"):
        GymRoutes.fetch_blocking(url, timeout_s=2)


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
        assert body["responses_create_params"].get(key) == (value if value is not None else params.get(key))
    assert body["agent_ref"] == {"name": "a"} and body["task_source"] == "x"
