"""What a Gym's rows pass through (``nemo_gym_adapter.gym.probes.Topology``), from a hand-written Gym config; and the
busy-vs-down rule of ``HttpProbes`` against real sockets on loopback (a server that accepts and says nothing, a closed
port).

The probes themselves are exercised against real servers in ``tests/integration/gym/test_server_down.py``; the policy
acting on their answers in ``tests/unit/gym/test_liveness.py`` (whose two-agent config this reuses).
"""

from __future__ import annotations

import asyncio
import socket

from nemo_gym_adapter.data.routing import GymRoutes
from nemo_gym_adapter.gym.probes import HttpProbes, Server, Topology
from tests.unit.gym.test_liveness import two_env_config


def test_topology_names_every_server_an_agents_rows_pass_through():
    config = two_env_config()
    top = Topology.from_gym(config, GymRoutes.from_config(config), head_host="10.9.9.9")
    assert top.needs["agent_a"] == ("agent_a_environment_server", "agent_a", "res_a", "policy")
    assert top.needs["agent_b"] == ("agent_b_environment_server", "agent_b", "policy")
    assert top.replicas == {"policy": ("10.0.0.1:8000", "10.0.0.2:8000")}
    assert top.servers["10.0.0.1:8000"].url == "http://10.0.0.1:8000/health"
    assert top.servers["policy"].url == "http://10.9.9.9:9400"  # a wildcard bind is reached on the head's host
    assert top.models_of("agent_b") == ["policy"]


# ------------------------------------------------------------------ busy is not dead (HttpProbes on loopback sockets)


async def _silent_server() -> tuple[asyncio.Server, int]:
    """A TCP server that accepts and never answers: a Gym server whose event loop is busy scoring a batch."""

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)  # the request; no reply until the client gives up

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_a_silent_server_that_accepts_connections_is_busy_for_the_grace_then_down():
    """The grace is counted on the probes' clock, injected here: every probe is real (a 0.2 s timeout against a
    server that accepts and never answers), only the time each one is taken at is set, so the boundary is exact and
    no answer depends on how the machine schedules the probes."""
    now = [0.0]

    async def run() -> list[str | None]:
        server, port = await _silent_server()
        probes = HttpProbes(timeout_s=0.2, busy_grace_s=0.8, clock=lambda: now[0])
        target = Server("res_a", "resources", f"http://127.0.0.1:{port}")
        answers = []
        try:
            for t in (0.0, 0.4, 0.79, 0.8, 1.6):  # the first unanswered probe starts the grace
                now[0] = t
                answers.append(await probes.probe(target))
        finally:
            server.close()
            await probes.close()
        return answers

    answers = asyncio.run(run())
    assert answers[:3] == [None, None, None]  # busy: within the grace
    for down in answers[3:]:
        assert down is not None and "accepts connections" in down and "busy_grace_s=0.8" in down


def test_a_refused_connection_is_down_at_once_and_grace_zero_restores_the_old_rule():
    async def run() -> tuple[str | None, str | None]:
        probes = HttpProbes(timeout_s=0.2, busy_grace_s=60)
        refused = await probes.probe(Server("agent_a", "agent", f"http://127.0.0.1:{_closed_port()}"))
        server, port = await _silent_server()
        strict = HttpProbes(timeout_s=0.2, busy_grace_s=0)
        try:
            silent = await strict.probe(Server("res_a", "resources", f"http://127.0.0.1:{port}"))
        finally:
            server.close()
            await probes.close()
            await strict.close()
        return refused, silent

    refused, silent = asyncio.run(run())
    assert refused is not None and refused.startswith("unreachable")
    assert silent == "no answer within 0.2s"


def test_a_server_that_answers_again_starts_a_new_grace(caplog):
    async def run() -> list[str | None]:
        mode = {"answer": False}

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            if mode["answer"]:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
                await writer.drain()
                writer.close()
            else:
                await reader.read(1)  # hold the connection, say nothing

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        target = Server("res_a", "resources", f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        probes = HttpProbes(timeout_s=0.2, busy_grace_s=0.5)
        out = []
        try:
            out.append(await probes.probe(target))  # busy
            mode["answer"] = True
            out.append(await probes.probe(target))  # answers: the silence is over
            mode["answer"] = False
            out.append(await probes.probe(target))  # a new silence: a new grace, busy again
        finally:
            server.close()
            await probes.close()
        return out

    with caplog.at_level("WARNING"):
        assert asyncio.run(run()) == [None, None, None]
    assert sum("treated as busy" in r.getMessage() for r in caplog.records) == 2  # once per silence
