"""Unit tests of nemo_gym_adapter.gym.ray_head with the fake Gym venv (``tests/support/fake_gym_venv.py``: FakeRay as
``bin/ray``, FakeGym as ``bin/gym``; no real Ray, seconds): the head's command and environment, start without
waiting, Gym joining it with its token, reuse and replacement on a Gym restart, failures named, nothing left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nemo_gym_adapter.access import listen
from nemo_gym_adapter.config import NemoGymConfig, parse_section
from nemo_gym_adapter.errors import GymServerError
from nemo_gym_adapter.gym import ray_head as gym_ray
from nemo_gym_adapter.gym.early import early_gym_servers
from nemo_gym_adapter.gym.ray_head import GymRayHead, claim_early_head, head_command, head_env
from nemo_gym_adapter.gym.servers import GymServers
from tests.support.fake_gym_venv import fake_spec
from tests.support.pids import wait_gone
from tests.support.recipe_config import GYM_CONFIG


@pytest.fixture(autouse=True)
def short_stop_grace(monkeypatch):
    """FakeRay's orphan ignores SIGTERM like Ray's agents: SIGKILL it after 0.5 s, not 3 s."""
    monkeypatch.setattr(gym_ray, "STOP_TIMEOUT_S", 0.5)


def test_head_command_runs_ray_from_gyms_venv_with_its_own_ports_and_temp_dir(tmp_path):
    cmd = head_command(tmp_path / "venv", 41000, 41001, 41002, tmp_path / "t")
    assert cmd[:4] == [str(tmp_path / "venv" / "bin" / "ray"), "start", "--head", "--block"]
    assert {"--port=41000", "--ray-client-server-port=41001", "--dashboard-agent-listen-port=41002"} <= set(cmd)
    assert "--include-dashboard=false" in cmd and f"--temp-dir={tmp_path / 't'}" in cmd
    # its workers and drivers (Gym's launcher and servers) get ephemeral ports, not Ray's CLI band = Gym's default
    assert {"--min-worker-port=0", "--max-worker-port=0"} <= set(cmd)
    assert not [a for a in head_command(tmp_path, 1, None, 2, tmp_path) if "client-server" in a]  # no grpc: no flag


def test_head_env_is_gyms_with_a_token_of_its_own(tmp_path):
    base = {"PYTHONPATH": "/trainer", "RAY_ADDRESS": "10.0.0.1:6379", "RAY_AUTH_TOKEN_PATH": "/x", "PATH": "/usr/bin"}
    env = head_env(tmp_path / "venv", {"HF_HOME": "/hf"}, "t" * 64, base=base)
    assert "PYTHONPATH" not in env and "RAY_ADDRESS" not in env and "RAY_AUTH_TOKEN_PATH" not in env
    assert (env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN"], env["HF_HOME"]) == ("token", "t" * 64, "/hf")
    assert env["PATH"] == f"{tmp_path / 'venv' / 'bin'}:/usr/bin"
    assert env["RAY_prestart_worker_first_driver"] == "0"  # no worker burst when Gym's launcher connects
    assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"  # no Serve drain on SIGTERM: Ray's own teardown at once
    assert (
        head_env(tmp_path, {"RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "5"}, "t", base={})[
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"
        ]
        == "5"
    )
    # no metrics exporter answering every user of the host (access.listen), unless asked for or set in nemo_gym.env
    assert env["RAY_enable_metrics_collection"] == "0" and env["AUTOSCALER_METRIC_PORT"] == listen.NO_PORT
    asked = head_env(tmp_path, {}, "t", base={}, metrics=True)
    assert not {"RAY_enable_metrics_collection", "DASHBOARD_METRIC_PORT", "AUTOSCALER_METRIC_PORT"} & set(asked)
    assert head_env(tmp_path, {"DASHBOARD_METRIC_PORT": "9100"}, "t", base={})["DASHBOARD_METRIC_PORT"] == "9100"
    assert (
        head_env(tmp_path, {"RAY_prestart_worker_first_driver": "1"}, "t", base={})["RAY_prestart_worker_first_driver"]
        == "1"
    )


def test_gym_joins_the_head_restart_reuses_it_or_replaces_a_dead_one_and_nothing_is_left(
    fake_gym_venv, tmp_path, monkeypatch
):
    monkeypatch.setenv("FAKE_RAY_DELAY", "1.0")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    t0 = time.monotonic()
    head = GymRayHead.start(fake_gym_venv, run_dir)
    assert time.monotonic() - t0 < 1.0 and head.start_seconds is None  # returned without waiting
    pid_record = json.loads((run_dir / gym_ray.PID_FILE).read_text())
    assert pid_record["sessions"] == [head.proc.pid]
    seen = set()
    try:
        with GymServers.start(fake_spec(fake_gym_venv, tmp_path), ray_head=head) as gym:
            assert gym.ray_head is head and 0 < gym.ray_wait_seconds <= gym.startup_seconds
            assert head.start_seconds is not None and head.address.startswith("127.0.0.1:")
            launch = json.loads((run_dir / "ngv_launch.yaml").read_text())
            assert launch["ray_head_node_address"] == head.address
            joined = f"Connecting to Ray cluster at specified address: {head.address} (RAY_AUTH_MODE=token, token of 64"
            assert joined in gym.log_path.read_text()
            assert head.auth_token.get_secret_value() not in launch_text(run_dir)  # environment only
            first_head = head.proc.pid
            seen |= head.pids() | gym.pids()
            gym.restart()  # the head is alive: reused
            assert head.proc.pid == first_head and head.restarts == 0
            assert joined in (run_dir / "restart1" / "gym.log").read_text()
            head.stop()  # the head dies: the next restart starts a new one first
            gym.restart()
            assert head.restarts == 1 and head.proc.pid != first_head and head.alive()
            assert f"specified address: {head.address}" in (run_dir / "restart2" / "gym.log").read_text()
            seen |= head.pids() | gym.pids()
        assert head.alive()  # Gym's stop leaves the head (the manager stops it)
    finally:
        head.stop()
    assert wait_gone(seen, 10.0) == []  # the fake agents that ignore SIGTERM too
    assert not head.temp_dir.exists() and not (run_dir / gym_ray.PID_FILE).exists()


def launch_text(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file())


def test_a_head_that_keeps_dying_is_named_with_its_log_tail_after_its_retries(fake_gym_venv, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_RAY_MODE", "crash")
    head = GymRayHead.start(fake_gym_venv, tmp_path)
    try:
        with pytest.raises(GymServerError, match=r"(?s)Gym's Ray head .*exited with code 1.*GCS port is in use"):
            GymServers.start(fake_spec(fake_gym_venv, tmp_path), ray_head=head)
        assert head.restarts == gym_ray.START_RETRIES  # bounded: started 1 + START_RETRIES times, then named
        assert not (tmp_path / "run" / "gym.log").exists()  # Gym was never started
    finally:
        head.stop()


def test_a_head_that_dies_at_start_up_once_is_started_again_and_gym_joins_the_new_one(
    fake_gym_venv, tmp_path, monkeypatch, caplog
):
    crashes = tmp_path / "crashes"
    crashes.write_text("1")
    monkeypatch.setenv("FAKE_RAY_CRASHES", str(crashes))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    head = GymRayHead.start(fake_gym_venv, run_dir)
    first = head.address
    seen: set[int] = set()
    try:
        with caplog.at_level("WARNING", logger=gym_ray.logger.name):
            with GymServers.start(fake_spec(fake_gym_venv, tmp_path), ray_head=head) as gym:
                assert head.restarts == 1 and head.address != first and head.alive()
                launch = json.loads((run_dir / "ngv_launch.yaml").read_text())
                assert launch["ray_head_node_address"] == head.address  # Gym joined the new head
                seen |= head.pids() | gym.pids()
        (warning,) = [r.getMessage() for r in caplog.records if "starting a new one" in r.getMessage()]
        assert first in warning and "exited with code 1" in warning and "GCS port is in use" in warning
        assert "retry 1 of 2" in warning
    finally:
        head.stop()
    assert wait_gone(seen, 10.0) == []
    assert json.loads(crashes.read_text()) == -1  # started exactly twice


def test_a_head_that_never_comes_up_times_out(fake_gym_venv, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_RAY_MODE", "never")
    head = GymRayHead.start(fake_gym_venv, tmp_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(GymServerError, match=r"Gym's Ray head .*not up after 1s"):
            head.wait_ready(1)
        assert time.monotonic() - t0 < 5
        pids = head.pids()
    finally:
        head.stop()
    assert wait_gone(pids, 10.0) == []


def _gym(tmp_path: Path, venv: Path, **section) -> NemoGymConfig:
    """The run's ``nemo_gym:`` section, as the task runners hand it to ``early_gym_servers``."""
    return parse_section(
        {"config_paths": [GYM_CONFIG], "gym_venv": str(venv), "run_dir": str(tmp_path / "gym"), **section}
    )


def test_early_head_is_claimed_by_the_manager_or_stopped_when_nobody_claims_it(
    fake_gym_venv, tmp_path, watchdog_requests
):
    gym = _gym(tmp_path, fake_gym_venv)
    with early_gym_servers(gym) as head:
        assert head is not None and head.alive() and head.run_dir == tmp_path / "gym"
        assert watchdog_requests == [tmp_path / "gym"]  # set before the head started (reaper)
        claimed = claim_early_head()
        assert claimed is head and claim_early_head() is None  # claimed once; now the claimer's
    try:
        assert head.alive()  # a claimed head outlives the runner's block
    finally:
        head.stop()
    with early_gym_servers(gym) as unclaimed:  # init_workers failed before the manager existed
        assert unclaimed is not None
    assert not unclaimed.alive() and claim_early_head() is None
    for section in ({"ray_head": "gym"}, {"ray_head": "10.0.0.1:6379"}, {"head_url": "http://h:1", "config_paths": []}):
        with early_gym_servers(_gym(tmp_path, fake_gym_venv, **section)) as none:
            assert none is None


def test_driver_sweeps_a_head_left_by_a_killed_trainer(tmp_path):
    from recipe.nemo_gym.main import sweep_gym

    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True, stdin=subprocess.DEVNULL
    )
    record = {"sessions": [child.pid], "pids": [child.pid], "owner_pid": os.getpid()}
    (tmp_path / gym_ray.PID_FILE).write_text(json.dumps(record))
    try:
        assert sweep_gym(tmp_path) == [child.pid]
        assert child.wait(timeout=10) is not None and not (tmp_path / gym_ray.PID_FILE).exists()
    finally:
        if child.poll() is None:
            child.kill()
