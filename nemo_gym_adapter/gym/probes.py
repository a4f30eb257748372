"""What a Gym's rows pass through, and how to ask each of those servers whether it is alive.

:class:`Topology` maps each agent to the Gym servers its rows need (from Gym's resolved global config) and each model
proxy to its vLLM replicas; :class:`HttpProbes` are the real probes (any HTTP answer for a Gym server, ``/health``
200 for a replica, vLLM's running + waiting gauges for a replica's load). Apart from :mod:`liveness` because this is
the *what* and *how* of probing, fixed per Gym; :mod:`liveness` is the *policy* (``on_server_down``) and the step
guard that act on the answers, and its tests swap these probes for fakes. Nothing here imports ``nemo_gym``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from nemo_gym_adapter.access.gym_guard import client_headers
from nemo_gym_adapter.data.routing import GymRoutes

logger = logging.getLogger(__name__)

_KINDS = {
    "environment_servers": "environment",
    "responses_api_agents": "agent",
    "resources_servers": "resources",
    "responses_api_models": "model",
}


@dataclass(frozen=True)
class Server:
    """One thing to probe: a Gym server instance (by its config name) or a vLLM replica (by ``host:port``)."""

    name: str
    kind: str  # environment | agent | resources | model | replica
    url: str

    def __str__(self) -> str:
        return f"{self.kind} server {self.name!r} ({self.url})"


@dataclass(frozen=True)
class Topology:
    """What each agent's rows pass through. ``needs[agent]``: Gym servers; ``replicas[model]``: replica names."""

    servers: Mapping[str, Server]
    needs: Mapping[str, tuple[str, ...]]
    replicas: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def from_gym(cls, global_config: Mapping[str, Any], routes: GymRoutes, head_host: str = "127.0.0.1") -> Topology:
        inner: dict[str, Mapping[str, Any]] = {}
        servers: dict[str, Server] = {}
        for name, block in global_config.items():
            for section, kind in _KINDS.items():
                impls = block.get(section) if isinstance(block, Mapping) else None
                for cfg in impls.values() if isinstance(impls, Mapping) else ():
                    if isinstance(cfg, Mapping) and cfg.get("port"):
                        host = cfg.get("host")
                        host = head_host if host in (None, "", "0.0.0.0", "::") else host
                        servers[str(name)], inner[str(name)] = (
                            Server(str(name), kind, f"http://{host}:{cfg['port']}"),
                            cfg,
                        )
        replicas: dict[str, tuple[str, ...]] = {}
        for name, cfg in inner.items():
            urls = cfg.get("base_url") if servers[name].kind == "model" else None
            urls = [urls] if isinstance(urls, str) else [u for u in urls or () if isinstance(u, str)]
            names = []
            for url in urls:
                root = url.rstrip("/").removesuffix("/v1")
                replica = root.split("://", 1)[-1]
                servers[replica] = Server(replica, "replica", f"{root}/health")
                names.append(replica)
            if names:
                replicas[name] = tuple(names)

        def refs(name: str) -> list[str]:
            return [
                str(v["name"])
                for v in inner.get(name, {}).values()
                if isinstance(v, Mapping)
                and v.get("name") in servers
                and v.get("type", "responses_api_agents") in _KINDS
            ]

        needs: dict[str, tuple[str, ...]] = {}
        for agent, agent_routes in routes.servers_by_agent.items():
            seen: list[str] = []
            todo = [r.server for r in agent_routes] + [agent]
            while todo:
                name = todo.pop(0)
                if name in servers and name not in seen and servers[name].kind != "replica":
                    seen.append(name)
                    todo.extend(refs(name))
            needs[agent] = tuple(seen)
        return cls(servers, needs, replicas)

    def models_of(self, agent: str) -> list[str]:
        return [name for name in self.needs.get(agent, ()) if name in self.replicas]


Probe = Callable[[Server], Awaitable["str | None"]]
"""``None`` when the server is alive, else why not (one line)."""
Load = Callable[[Sequence[Server]], Awaitable["float | None"]]
"""Requests running + waiting over these replicas, or None when unreadable."""


class HttpProbes:
    """The real probes (aiohttp, one session; create inside the event loop that uses it).

    Busy is not dead: a server that does its work inside its event loop (math_with_judge runs math-verify there)
    answers nothing while a batch is being scored, yet its kernel still accepts connections. A probe that gets no
    answer in ``timeout_s`` therefore connects once more: refused (the process is gone) is down at once; accepted is
    *busy* and counts as alive for ``busy_grace_s`` from its first unanswered probe (logged once), then as down (a
    hung server looks the same from outside). ``busy_grace_s=0``: any timeout is down, as before.

    ``replica_headers``: sent to the vLLM replicas only (the run's rollout key, ``nemo_gym_adapter.access``: a
    replica answers 401 without it); Gym's servers never get it."""

    def __init__(
        self,
        timeout_s: float,
        busy_grace_s: float = 0.0,
        replica_headers: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.busy_grace_s = busy_grace_s
        self.clock = clock  # what the busy grace is counted in (tests inject theirs: no decision on a wall-clock tie)
        self.replica_headers = dict(replica_headers or {})
        self._session: aiohttp.ClientSession | None = None
        self._silent_since: dict[str, float] = {}  # server -> first unanswered probe of its current silence

    def _get(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout, cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def probe(self, server: Server) -> str | None:
        try:
            headers = self.replica_headers if server.kind == "replica" else client_headers()
            async with self._get().get(server.url, allow_redirects=False, headers=headers) as r:
                if self._silent_since.pop(server.name, None) is not None:
                    logger.info("%s answers again", server)
                if server.kind == "replica" and r.status != 200:
                    return f"/health answered {r.status}"
                return None
        except asyncio.TimeoutError:
            return await self._busy_or_down(server)
        except (aiohttp.ClientError, OSError) as e:
            self._silent_since.pop(server.name, None)
            return f"unreachable ({type(e).__name__})"

    async def _busy_or_down(self, server: Server) -> str | None:
        timeout = self.timeout.total or 0.0
        why = f"no answer within {timeout:g}s"
        if self.busy_grace_s <= 0:
            return why
        if not await self.accepts(server):
            self._silent_since.pop(server.name, None)
            return f"{why}, connection not accepted"
        now = self.clock()
        since = self._silent_since.setdefault(server.name, now)
        if since == now:
            logger.warning(
                "%s: %s but accepts connections: treated as busy, not down, for up to %gs "
                "(nemo_gym.liveness.busy_grace_s)",
                server, why, self.busy_grace_s,
            )  # fmt: skip
        if now - since < self.busy_grace_s:
            return None
        return f"no answer for {now - since:.0f}s though it accepts connections (busy_grace_s={self.busy_grace_s:g})"

    async def accepts(self, server: Server) -> bool:
        """Whether ``server``'s port accepts a TCP connection within the probe timeout."""
        url = urllib.parse.urlsplit(server.url)
        port = url.port or (443 if url.scheme == "https" else 80)
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(url.hostname, port), self.timeout.total)
        except (asyncio.TimeoutError, OSError):
            return False
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
        return True

    async def load(self, replicas: Sequence[Server]) -> float | None:
        total = 0.0
        for replica in replicas:
            try:
                url = replica.url.removesuffix("/health") + "/metrics"
                async with self._get().get(url, headers=self.replica_headers) as r:
                    text = (await r.text()) if r.status == 200 else ""
            except (asyncio.TimeoutError, aiohttp.ClientError, OSError):
                return None
            gauges = [
                ln
                for ln in text.splitlines()
                if ln.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting"))
            ]
            if not gauges:
                return None
            total += sum(float(ln.rsplit(" ", 1)[1]) for ln in gauges)
        return total

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
