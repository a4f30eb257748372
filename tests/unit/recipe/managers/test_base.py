"""Unit tests of what every NeMo Gym rollout manager shares (``recipe.nemo_gym.managers.base``), with a fake verl
manager base class (the real start-up, with verl's replicas and a real Gym, is tests/integration/recipe/test_agent_loop_manager)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from nemo_gym_adapter.errors import AdapterError
from recipe.nemo_gym.managers.base import PID_FILE, GymManagerBase, stop_gym, write_pid_file
from tests.support.recipe_config import minimal_recipe_config


@pytest.fixture
def cfg(tmp_path: Path) -> dict[str, Any]:
    return minimal_recipe_config(tmp_path)


class FakeVerlManager:
    """Stands in for verl's AgentLoopManager: keeps the constructor arguments as verl does."""

    def __init__(self, config: Any, llm_client: Any, teacher_client: Any, reward_loop_worker_handles: Any) -> None:
        self.config, self.llm_client = config, llm_client


class FakeManager(GymManagerBase, FakeVerlManager):
    pass


class FakeGym:
    """What ``write_pid_file``/``stop_gym`` use of ``GymServers``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.stopped = run_dir, False

    def pids(self) -> set[int]:
        return {os.getpid()}

    def stop(self) -> None:
        self.stopped = True


def test_pid_file_records_the_session_and_goes_when_gym_stops(tmp_path, watchdog_requests):
    gym = FakeGym(tmp_path)
    write_pid_file(gym)  # type: ignore[arg-type]
    record = json.loads((tmp_path / PID_FILE).read_text())
    assert record["pids"] == [os.getpid()] and record["sessions"] == [os.getsid(os.getpid())]
    assert watchdog_requests == [tmp_path]  # swept by a watchdog should this process be killed outright (reaper)
    stop_gym(gym)  # type: ignore[arg-type]
    assert gym.stopped and not (tmp_path / PID_FILE).exists()


def test_shutdown_undoes_start_up_newest_first_and_goes_on_after_a_failure(cfg):
    manager = FakeManager(cfg, llm_client=None)
    done: list[str] = []

    def broken() -> None:
        done.append("core")
        raise RuntimeError("already closed")

    manager.on_shutdown("Gym", lambda: done.append("gym"))
    manager.on_shutdown("rollout core", broken)
    manager.shutdown()
    manager.shutdown()  # idempotent
    assert done == ["core", "gym"]
    with pytest.raises(AdapterError, match="after shutdown"):
        manager.check_open()


def test_sampling_follows_train_or_validation_settings(cfg):
    manager = FakeManager(cfg, llm_client=None)
    engine = {"top_k": -1, "repetition_penalty": 1.0, "ignore_eos": False}  # verl's defaults, sent all the same
    train = {"temperature": 1.0, "top_p": 1.0, "max_output_tokens": 128, "metadata.extra_body": engine}
    assert manager.sampling_overrides(False) == train
    assert manager.sampling_overrides(True) == {**train, "temperature": 0.0}
    with pytest.raises(AdapterError, match="teacher"):
        FakeManager(cfg, llm_client=None, teacher_client={"t": object()})


def test_manager_starts_the_ray_head_when_the_runner_did_not_and_stops_it_at_shutdown(cfg, fake_gym_venv, tmp_path):
    cfg["nemo_gym"].update(gym_venv=str(fake_gym_venv), run_dir=str(tmp_path / "gym"))
    manager = FakeManager(cfg, llm_client=None)
    head = manager._claim_ray_head()
    assert head is not None and head.alive()
    manager.shutdown()
    assert not head.alive()
    for section in ({"ray_head": "gym"}, {"head_url": "http://h:1", "config_paths": []}):
        cfg["nemo_gym"].update(section)
        assert FakeManager(cfg, llm_client=None)._claim_ray_head() is None


def test_manager_starts_a_warm_launcher_next_to_the_head_and_stops_it_at_shutdown(cfg, fake_gym_venv, tmp_path):
    cfg["nemo_gym"].update(gym_venv=str(fake_gym_venv), run_dir=str(tmp_path / "gym"))
    manager = FakeManager(cfg, llm_client=None)
    manager.ray_head = manager._claim_ray_head()
    warm = manager._claim_warm()
    assert warm is not None and warm.alive() and manager.ray_head is not None
    assert warm.env["RAY_AUTH_TOKEN"] == manager.ray_head.auth_token.get_secret_value()  # joins that head
    manager.shutdown()
    assert not warm.alive() and not manager.ray_head.alive()
    for section in ({"warm_launcher": False}, {"head_url": "http://h:1", "config_paths": []}):
        cfg["nemo_gym"].update(section)
        assert FakeManager(cfg, llm_client=None)._claim_warm() is None


def test_replicas_a_restart_dropped_and_those_found_dead_are_not_called_again(cfg, monkeypatch):
    """After Gym restarts without a lost replica (liveness), the manager forgets it; until then, replicas the last
    liveness check found dead are skipped by the per-step calls (engine probe, weight versions, abort counts)."""
    from types import SimpleNamespace

    from nemo_gym_adapter.gym.addresses import ReplicaEndpoint
    from recipe.nemo_gym.managers import base

    manager = FakeManager(cfg, llm_client=None)
    eps = [
        ReplicaEndpoint(actor=f"vllm_server_{i}_0", host=h, port=8000, node_ip=h)
        for i, h in enumerate(("10.0.0.2", "10.0.0.3"))
    ]
    manager.replica_endpoints = eps
    manager.replicas = {ep.address: ep.actor for ep in eps}
    manager.replica_handles = {ep.actor: object() for ep in eps}
    manager.served_model_name = "m"
    liveness = SimpleNamespace(last_dead={"10.0.0.2:8000": "unreachable"})
    manager.core = SimpleNamespace(liveness=liveness)  # type: ignore[assignment]
    assert list(manager.live_replica_handles()) == ["vllm_server_1_0"]
    probed: list[str] = []
    monkeypatch.setattr(base, "probe_logprob", lambda address, *a, **k: probed.append(address) or -1.0)
    counted: list[list[str]] = []
    manager.engine = SimpleNamespace(  # type: ignore[assignment]
        probe_api="completions", engine_counters=lambda h: counted.append(list(h)) or {"aborted_turns": 0}
    )
    metrics = manager.engine_probe_metrics()
    assert metrics == {"gym/engine/probe_logprob_mean": -1.0, "gym/engine/aborted_turns_total": 0.0}
    assert probed == ["10.0.0.3:8000"] and counted == [["vllm_server_1_0"]]

    restarted = SimpleNamespace(spec=SimpleNamespace(policy_base_url=[eps[1].url]))
    manager._keep_served_replicas(restarted)  # type: ignore[arg-type]
    assert manager.replicas == {"10.0.0.3:8000": "vllm_server_1_0"} and list(manager.replica_handles) == [
        "vllm_server_1_0"
    ]
    liveness.last_dead = {"10.0.0.3:8000": "unreachable"}
    assert manager.live_replica_handles() == {} and manager.engine_probe_metrics() == {}
