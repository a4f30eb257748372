"""Fake NeMo Gym servers for unit tests: aiohttp apps on free local ports, each in its own thread and loop.

``FakeEnvServer`` stands in for an environment server's ``/run`` (and ``/aggregate_metrics``, recorded): each row says how the fake should behave
(``fake`` key: sleep, answer an HTTP error, drop the connection for the first N tries, answer non-JSON or a given
``result``), and the fake records what it received, how many requests were in flight at once, and which headers
came in.
``FakeHeadServer`` serves the head server's GETs (``/global_config_dict_yaml``, ``/server_instances``, ``/health``).
``GYM_CONFIG`` is a Gym-shaped global config; :func:`routes_for` builds routes to fake environment servers.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from aiohttp import web

from nemo_gym_adapter.data.routing import GymRoutes
from nemo_gym_adapter.runtime.procs import free_port


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
        self.aggregate_bodies: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "fake server did not start"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_post("/run", self._run)
        app.router.add_post("/aggregate_metrics", self._aggregate_metrics)
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
            if "result" in fake:  # a Gym-shaped /run result, returned as it is
                return web.json_response(fake["result"])
            response = web.json_response({"id": body.get("id"), "reward": 1.0, "echo": body})
            response.set_cookie("session", f"secret-{rid}")
            return response
        finally:
            self.in_flight -= 1

    async def _aggregate_metrics(self, request: web.Request) -> web.Response:
        """Gym 0.7's ``/aggregate_metrics`` shape: mean reward as the key metric, a few agent metrics (a string too)."""
        body = await request.json()
        self.aggregate_bodies.append(body)
        rewards = [float(r["reward"]) for r in body["verify_responses"]]
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        return web.json_response(
            {
                "key_metrics": {"mean/reward": mean},
                "agent_metrics": {"mean/reward": mean, "max/reward": max(rewards, default=0.0), "label": "fake"},
                "group_level_metrics": [],
                "repeat_level_metrics": [],
            }
        )

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def routes_for(*servers: tuple[str, str]) -> GymRoutes:
    """GymRoutes from a Gym-shaped config where agent ``name`` is fronted by a legacy_agent relay at ``url``."""
    return GymRoutes.from_config(gym_config_for(*servers))


def gym_config_for(*servers: tuple[str, str]) -> dict[str, Any]:
    """A Gym-shaped global config where agent ``name`` is fronted by a legacy_agent relay at ``url``."""
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
    return config


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
INSTANCES = [  # as Gym 0.7's head server lists them
    {
        "process_name": "env_2",
        "server_type": "environment_servers",
        "name": "legacy_agent",
        "host": "10.0.0.7",
        "port": 9007,
        "url": "http://10.0.0.7:9007",
    }
]


class FakeHeadServer(FakeEnvServer):
    """Serves the head server's GETs the way Gym 0.7 does (the YAML config wrapped in a JSON string; ``/health``)."""

    def __init__(self, config: dict[str, Any] = GYM_CONFIG, instances: list[dict[str, Any]] = INSTANCES) -> None:
        self.config = config
        self.instances = instances
        super().__init__()

    def _serve(self) -> None:
        import yaml

        async def config(_: web.Request) -> web.Response:
            return web.json_response(yaml.safe_dump(self.config))

        async def instances(_: web.Request) -> web.Response:
            return web.json_response(self.instances)

        async def health(_: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_get("/global_config_dict_yaml", config)
        app.router.add_get("/server_instances", instances)
        app.router.add_get("/health", health)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()
