"""Liveness of Gym servers and vLLM replicas (``nemo_gym_adapter.gym.liveness``) with fake probes and a fake Gym.

The probes are fakes (:class:`FakeProbes`: a server is dead when the test says so); the rows run through the real
rollout core against a fake environment server (``tests/support/fake_gym``). The real servers are killed in
``tests/integration/gym/test_server_down.py``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from nemo_gym_adapter.data.routing import GymRoutes
from nemo_gym_adapter.errors import AdapterConfigError, GymServerError
from nemo_gym_adapter.gym.liveness import Liveness, LivenessConfig, ServerDownError
from nemo_gym_adapter.gym.probes import Server, Topology
from nemo_gym_adapter.rollouts.client import RolloutClientConfig
from nemo_gym_adapter.rollouts.core import RolloutCore
from nemo_gym_adapter.rollouts.trajectory import MaskReason, TrajectoryConfig
from tests.support.fake_gym import gym_config_for
from tests.support.gym_results import E0, G0, G1, P0, handmade_multiturn

TRAJ = TrajectoryConfig(prompt_length=16, response_length=16)
FAST = {"interval_s": 0.05, "idle_s": 0.2, "replica_grace_s": 0.5}


def two_env_config(url_a: str = "http://127.0.0.1:9100", url_b: str = "http://127.0.0.1:9200") -> dict[str, Any]:
    """Agents ``agent_a`` (resources ``res_a``) and ``agent_b``, both calling ``policy`` over two vLLM replicas."""
    config = gym_config_for(("agent_a", url_a), ("agent_b", url_b))
    config["agent_a"]["responses_api_agents"]["simple_agent"].update(
        resources_server={"type": "resources_servers", "name": "res_a"},
        model_server={"type": "responses_api_models", "name": "policy"},
    )
    config["agent_b"]["responses_api_agents"]["simple_agent"]["model_server"] = {
        "type": "responses_api_models",
        "name": "policy",
    }
    config["res_a"] = {"resources_servers": {"string_match": {"host": "127.0.0.1", "port": 9301}}}
    config["policy"] = {
        "responses_api_models": {
            "vllm_model": {
                "host": "0.0.0.0",
                "port": 9400,
                "base_url": ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"],
            }
        }
    }
    return config


class FakeProbes:
    """Fake probes: ``dead[name]`` is why that server is down; ``load`` is what the live replicas report."""

    def __init__(self) -> None:
        self.dead: dict[str, str] = {}
        self.load: float | None = 0.0
        self.probed = 0

    async def probe(self, server: Server) -> str | None:
        self.probed += 1
        return self.dead.get(server.name)

    async def load_of(self, replicas: Sequence[Server]) -> float | None:
        assert all(r.kind == "replica" for r in replicas)
        return self.load


class FakeRestartableGym:
    """Fake of ``GymServers`` for restarts: records them; ``owned`` as given."""

    head_url = "http://127.0.0.1:11000"

    def __init__(self, config: dict[str, Any], owned: bool = True, on_restart: Any = None) -> None:
        self.config, self.owned, self.restarted, self._on_restart = config, owned, [], on_restart

    def global_config(self, refresh: bool = False) -> dict[str, Any]:
        return self.config

    def routes(self) -> GymRoutes:
        return GymRoutes.from_config(self.config)

    def restart(self, drop_replicas: Sequence[str] = ()) -> None:
        self.restarted.append(list(drop_replicas))
        if self._on_restart:
            self._on_restart(drop_replicas)

    attach_timeout_s = 5.0
    comes_back = True

    def reattach(self) -> None:
        self.restarted.append("reattach")
        if not self.comes_back:
            raise GymServerError(f"Gym head server at {self.head_url}: not ready after 5s (connection refused)")
        if self._on_restart:
            self._on_restart(())


def liveness(config: dict[str, Any], probes: FakeProbes, gym: Any = None, **kw: Any) -> Liveness:
    topology = Topology.from_gym(config, GymRoutes.from_config(config))
    cfg = LivenessConfig(**{**FAST, **kw})
    return Liveness(topology, cfg, gym=gym, probe=probes.probe, load=probes.load_of)


async def test_a_dead_resources_server_blocks_only_the_agents_that_use_it():
    probes = FakeProbes()
    live = liveness(two_env_config(), probes)
    probes.dead = {"res_a": "unreachable (ClientConnectorError)"}
    dead = await live.check()
    assert dead == {"res_a": "unreachable (ClientConnectorError)"}
    assert "resources server 'res_a'" in (live.blocked("agent_a", dead) or "")
    assert live.blocked("agent_b", dead) is None
    # One dead replica blocks nobody; both do.
    assert live.blocked("agent_b", {"10.0.0.1:8000": "x"}) is None
    assert "10.0.0.2:8000" in (live.blocked("agent_b", {"10.0.0.1:8000": "x", "10.0.0.2:8000": "y"}) or "")


async def test_fail_raises_before_the_step_naming_the_server():
    probes = FakeProbes()
    probes.dead = {"agent_b": "no answer within 3s"}
    with pytest.raises(ServerDownError, match=r"agent server 'agent_b' \(http://127.0.0.1:2\): no answer within 3s"):
        await liveness(two_env_config(), probes, on_server_down="fail").before_step()


async def test_restart_is_bounded_drops_dead_replicas_and_masks_when_it_cannot():
    probes = FakeProbes()
    gym = FakeRestartableGym(two_env_config(), on_restart=lambda drop: probes.dead.clear())
    live = liveness(two_env_config(), probes, gym=gym, max_restarts=1)
    probes.dead = {"10.0.0.2:8000": "/health answered 503"}
    routes, dead = await live.before_step()
    assert gym.restarted == [["10.0.0.2:8000"]] and routes is not None and dead == {}
    probes.dead = {"agent_a": "gone"}  # the budget is spent: rows are masked, no second restart
    routes, dead = await live.before_step()
    assert gym.restarted == [["10.0.0.2:8000"]] and routes is None and dead == {"agent_a": "gone"}

    # A Gym we attached to is never restarted: a dead replica masks its rows ...
    attached_gym = FakeRestartableGym(two_env_config(), owned=False, on_restart=lambda drop: probes.dead.clear())
    attached = liveness(two_env_config(), probes, gym=attached_gym)
    probes.dead = {"10.0.0.2:8000": "unreachable"}
    assert await attached.before_step() == (None, {"10.0.0.2:8000": "unreachable"}) and not attached_gym.restarted
    # ... a lost Gym server (its host, say) is waited for and attached to again ...
    probes.dead = {"agent_a": "no answer within 3s, connection not accepted"}
    routes, dead = await attached.before_step()
    assert attached_gym.restarted == ["reattach"] and routes is not None and dead == {}
    # ... and a Gym that does not come back within attach_timeout_s ends the run, naming what was lost.
    attached_gym.comes_back = False
    probes.dead = {"agent_a": "unreachable (ClientConnectorError)"}
    with pytest.raises(ServerDownError, match=r"lost the Gym at http://127.0.0.1:11000 \(agent server 'agent_a'"):
        await attached.before_step()


async def test_restart_with_no_replica_left_ends_the_run_naming_them():
    probes = FakeProbes()
    gym = FakeRestartableGym(two_env_config())
    probes.dead = {"10.0.0.1:8000": "unreachable (ClientConnectorError)", "10.0.0.2:8000": "no answer within 3s"}
    with pytest.raises(ServerDownError, match=r"every vLLM replica of model server\(s\) \['policy'\] is lost") as e:
        await liveness(two_env_config(), probes, gym=gym).before_step()
    assert "10.0.0.1:8000" in str(e.value) and "10.0.0.2:8000" in str(e.value) and not gym.restarted


def test_on_server_down_is_validated():
    with pytest.raises(AdapterConfigError, match="nemo_gym.on_server_down='retry'"):
        LivenessConfig(on_server_down="retry")  # type: ignore[arg-type]


async def test_the_guard_cuts_in_flight_rows_of_a_dead_agent_and_spares_the_others():
    probes = FakeProbes()
    live = liveness(two_env_config(), probes)
    guard = live.guard()
    watch = asyncio.ensure_future(guard.watch())
    try:
        hung = asyncio.ensure_future(guard.run("agent_a", asyncio.sleep(60, "never")))
        fine = asyncio.ensure_future(guard.run("agent_b", asyncio.sleep(0.3, "ok")))
        await asyncio.sleep(0.1)
        t0 = time.monotonic()
        probes.dead = {"res_a": "unreachable"}
        why = await asyncio.wait_for(hung, 2)
        assert time.monotonic() - t0 < 0.5
        assert isinstance(why, str) and "res_a" in why and "agent 'agent_a'" in why
        assert await fine == "ok"
        assert await guard.run("agent_a", asyncio.sleep(0, "late")) == why  # later rows are not even started
    finally:
        watch.cancel()


async def test_rows_on_a_dead_replica_are_cut_once_the_live_replicas_are_idle():
    probes = FakeProbes()
    live = liveness(two_env_config(), probes)
    guard = live.guard({"10.0.0.2:8000": "unreachable"})
    watch = asyncio.ensure_future(guard.watch())
    try:
        probes.load = 1.0  # the live replica is busy: nothing is cut
        stuck = asyncio.ensure_future(guard.run("agent_b", asyncio.sleep(60, "never")))
        await asyncio.sleep(0.5)
        assert not stuck.done()
        probes.load = 0.0
        why = await asyncio.wait_for(stuck, 2)
        assert "replica(s) ['10.0.0.2:8000'] of model server 'policy' are down" in why
        # A row started after the cut runs normally.
        assert await guard.run("agent_b", asyncio.sleep(0.1, "ok")) == "ok"
        # Unreadable gauges: cut after replica_grace_s.
        probes.load = None
        stuck = asyncio.ensure_future(guard.run("agent_a", asyncio.sleep(60, "never")))
        assert "are down" in await asyncio.wait_for(stuck, 2)
    finally:
        watch.cancel()


def gym_row(i: int, agent: str, sleep: float) -> dict[str, Any]:
    result = handmade_multiturn(P0, [G0, G1], [E0], reward=1.0)
    return {
        "id": i,
        "agent_ref": {"name": agent},
        "responses_create_params": {"input": "q"},
        "fake": {"result": result, "sleep": sleep},
    }


async def test_a_step_masks_the_dead_agents_rows_server_down_within_the_probe_interval(fake_server):
    config = two_env_config(fake_server.url, fake_server.url)
    probes = FakeProbes()
    live = liveness(config, probes)
    client = RolloutClientConfig(timeout_s=30, progress=False)
    rows = [gym_row(0, "agent_a", 30.0), gym_row(1, "agent_b", 0.2), gym_row(2, "agent_a", 30.0)]
    async with RolloutCore(GymRoutes.from_config(config), TRAJ, client, liveness=live) as core:
        asyncio.get_running_loop().call_later(0.3, lambda: probes.dead.update(agent_a="unreachable"))
        t0 = time.monotonic()
        step = await core.run_step(rows, ["agent_a", "agent_b", "agent_a"])
        took = time.monotonic() - t0
    assert took < 2, took
    reasons = [t.masked_reason for t in step.trajectories]
    assert reasons == [MaskReason.SERVER_DOWN, None, MaskReason.SERVER_DOWN]
    assert "agent server 'agent_a'" in step.trajectories[0].detail
    assert step.metrics["gym/all/masked_rate/server_down"] == pytest.approx(2 / 3)


async def test_fail_mode_ends_the_step_with_an_error_naming_the_server(fake_server):
    config = two_env_config(fake_server.url, fake_server.url)
    probes = FakeProbes()
    live = liveness(config, probes, on_server_down="fail")
    client = RolloutClientConfig(timeout_s=30, progress=False)
    async with RolloutCore(GymRoutes.from_config(config), TRAJ, client, liveness=live) as core:
        asyncio.get_running_loop().call_later(0.2, lambda: probes.dead.update(res_a="unreachable"))
        with pytest.raises(ServerDownError, match="resources server 'res_a'"):
            await core.run_step([gym_row(0, "agent_b", 30.0)], ["agent_b"])
