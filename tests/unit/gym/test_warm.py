"""Unit tests of nemo_gym_adapter.gym.warm (the warm Gym launcher) with the fake Gym venv
(``tests/support/fake_gym_venv.py``: FakeGym as ``bin/gym``, FakeRay as ``bin/ray``; no real Gym, seconds): the pure
parts (interpreter from ``#!``, environment comparison, ready time), a launch handed over (same cwd, log, argv,
interpreter as a cold one), every fallback to the cold launch with its reason, the early start with the Ray head,
and that nothing is left: stopped unused, stopped after use, its trainer gone (end of stdin), swept by the driver."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from nemo_gym_adapter.config import NemoGymConfig, parse_section
from nemo_gym_adapter.gym import ray_head as gym_ray
from nemo_gym_adapter.gym import warm as gym_warm
from nemo_gym_adapter.gym.early import early_gym_servers
from nemo_gym_adapter.gym.ray_head import GymRayHead, claim_early_head
from nemo_gym_adapter.gym.servers import GymServers
from nemo_gym_adapter.gym.warm import WarmLauncher, claim_early_warm, env_mismatch, interpreter, ready_at
from nemo_gym_adapter.gym.warm_boot import READY_LINE
from tests.support.fake_gym_venv import fake_spec
from tests.support.pids import wait_gone
from tests.support.recipe_config import GYM_CONFIG


@pytest.fixture(autouse=True)
def short_stop_grace(monkeypatch):
    """FakeGym/FakeRay leave a SIGTERM-ignoring orphan like Ray's agents: SIGKILL it after 0.5 s, not 3 s."""
    monkeypatch.setattr(gym_ray, "STOP_TIMEOUT_S", 0.5)
    monkeypatch.setattr(gym_warm, "STOP_TIMEOUT_S", 0.5)


def test_interpreter_is_the_scripts_shebang_else_the_fallback(tmp_path):
    script = tmp_path / "gym"
    script.write_text("#!/opt/venv/bin/python3.13 -X utf8\nprint(1)\n")
    assert interpreter(script, Path("/fallback")) == ["/opt/venv/bin/python3.13", "-X", "utf8"]
    script.write_text("print(1)\n")
    assert interpreter(script, Path("/fallback")) == ["/fallback"]
    assert interpreter(tmp_path / "missing", Path("/fallback")) == ["/fallback"]


def test_env_mismatch_names_added_removed_and_changed_variables_never_values():
    started = {"A": "1", "SECRET": "old-token", "GONE": "x"}
    launch = {"A": "1", "SECRET": "new-token", "NEW": "y"}
    assert env_mismatch(started, launch) == ["GONE", "NEW", "SECRET"]
    assert env_mismatch(started, dict(started)) == []


def test_ready_at_reads_the_boots_ready_line():
    assert ready_at(f"noise\n{READY_LINE} at t=1000.500 (3 modules in 0.20s)\n", 998.0) == pytest.approx(2.5)
    assert ready_at("no ready line yet", 998.0) is None


def _pids(proc: subprocess.Popen | psutil.Process) -> set[int]:
    """The process and its session (the fake Gym leaves a SIGTERM-ignoring orphan there)."""
    from nemo_gym_adapter.runtime.procs import session_members

    return {proc.pid, *session_members(proc.pid)}


def test_a_warm_launch_runs_gym_like_a_cold_one_and_nothing_is_left(fake_gym_venv, tmp_path):
    spec = fake_spec(fake_gym_venv, tmp_path, run_dir=tmp_path / "warm")
    warm = WarmLauncher.for_spec(spec, preload=["json", "sqlite3"])
    warm_pid = warm.proc.pid
    with GymServers.start(spec, warm=warm) as gym:
        assert gym.warm and gym._launcher.pid == warm_pid and warm.launched and warm.proc is None
        launcher = psutil.Process(warm_pid)
        assert launcher.cwd() == str(tmp_path / "warm")  # Gym's cwd is its run dir, as for a cold launch
        log = gym.log_path.read_text()
        assert gym.log_path == tmp_path / "warm" / "gym.log"
        assert log.startswith(f"\n$ {fake_gym_venv / 'bin' / 'gym'} env start +config_paths=")  # the cold header
        assert "fake gym starting ok" in log and "Uvicorn running on" in log
        assert launcher.cmdline()[0] == sys.executable  # the gym script's #! interpreter
        assert gym.server_instances() and gym.pids()
        pids = gym.pids()
    assert wait_gone(pids, 10.0) == []
    warm.stop()  # a no-op once handed over
    assert f"{READY_LINE} at t=" in warm_log(tmp_path)


def warm_log(tmp_path: Path) -> str:
    return "\n".join(p.read_text() for p in sorted((tmp_path / "warm").glob("gym_warm-*.log")))


def test_an_environment_that_changed_launches_cold_and_says_which_variables(fake_gym_venv, tmp_path, caplog):
    spec = fake_spec(fake_gym_venv, tmp_path, run_dir=tmp_path / "warm")
    warm = WarmLauncher.for_spec(spec.model_copy(update={"env": {"NGV_TEST_X": "1"}}), preload=[])
    waiting = _pids(warm.proc.popen)
    with caplog.at_level(logging.WARNING, logger="nemo_gym_adapter.gym.warm"):
        with GymServers.start(spec, warm=warm) as gym:
            assert not gym.warm and gym._launcher.pid not in waiting
    assert "another environment" in caplog.text and "NGV_TEST_X" in caplog.text and "launching Gym cold" in caplog.text
    assert wait_gone(waiting, 10.0) == []


def test_a_dead_or_tainted_warm_launcher_launches_cold_with_the_reason(fake_gym_venv, tmp_path, caplog):
    spec = fake_spec(fake_gym_venv, tmp_path, run_dir=tmp_path / "warm")
    dead = WarmLauncher.for_spec(spec, preload=[])
    dead.proc.popen.kill()
    dead.proc.popen.wait(5)
    # huggingface_hub reads HF_HOME at import, which nemo_gym sets from the launch's cwd: the boot refuses to keep it
    tainted = WarmLauncher.for_spec(spec, preload=["huggingface_hub"])
    with caplog.at_level(logging.WARNING, logger="nemo_gym_adapter.gym.warm"):
        for warm in (dead, tainted):
            with GymServers.start(spec, warm=warm) as gym:
                assert not gym.warm
    assert "exited with code -9" in caplog.text
    assert "exited with code 3" in caplog.text and "must be imported after nemo_gym" in caplog.text


def test_unused_stopped_or_orphaned_warm_launchers_leave_nothing(fake_gym_venv, tmp_path):
    spec = fake_spec(fake_gym_venv, tmp_path)
    run_dir = tmp_path / "gym"
    run_dir.mkdir()
    unused = WarmLauncher.for_spec(spec, run_dir=run_dir, preload=[])
    record = json.loads((run_dir / gym_warm.PID_FILE).read_text())
    assert record["pids"] == [unused.proc.pid] and record["sessions"] == [unused.proc.pid]
    pids = unused.pids()
    unused.stop()
    assert wait_gone(pids, 10.0) == [] and not (run_dir / gym_warm.PID_FILE).exists()
    # its trainer died outright: stdin reaches end of input and it exits by itself
    orphan = WarmLauncher.for_spec(spec, preload=[])
    assert orphan._wait_ready(10) is None
    orphan.proc.popen.stdin.close()
    assert orphan.proc.popen.wait(timeout=10) == 0
    assert "no launch came" in orphan.proc.tail()
    orphan.stop()


def test_driver_sweeps_a_warm_launcher_left_by_a_killed_trainer(fake_gym_venv, tmp_path):
    from recipe.nemo_gym.main import sweep_gym

    # a trainer that started one and was SIGKILLed before using it (its stdin pipe is still held open by `holder`)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.PIPE, start_new_session=True
    )
    warm = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.stdin.readline(); time.sleep(600)"],
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        record = {"sessions": [warm.pid], "pids": [warm.pid], "owner_pid": holder.pid}
        (tmp_path / gym_warm.PID_FILE).write_text(json.dumps(record))
        assert sweep_gym(tmp_path) == [warm.pid]
        assert warm.wait(timeout=10) is not None and not (tmp_path / gym_warm.PID_FILE).exists()
    finally:
        for p in (holder, warm):
            if p.poll() is None:
                p.kill()


def _gym(tmp_path: Path, venv: Path, **section) -> NemoGymConfig:
    """The run's ``nemo_gym:`` section, as the task runners hand it to ``early_gym_servers``."""
    return parse_section(
        {"config_paths": [GYM_CONFIG], "gym_venv": str(venv), "run_dir": str(tmp_path / "gym"), **section}
    )


def test_early_start_holds_the_heads_token_is_claimed_or_stopped(fake_gym_venv, tmp_path):
    gym = _gym(tmp_path, fake_gym_venv, env={"NGV_X": "1"})
    with early_gym_servers(gym) as head:
        assert isinstance(head, GymRayHead)
        warm = claim_early_warm()
        assert warm is not None and warm.alive() and claim_early_warm() is None
        assert warm.env["RAY_AUTH_TOKEN"] == head.auth_token.get_secret_value() and warm.env["NGV_X"] == "1"
        assert (tmp_path / "gym" / gym_warm.PID_FILE).exists()
        assert claim_early_head() is head
    try:
        assert warm.alive()  # claimed: the claimer's to stop
    finally:
        warm.stop()
        head.stop()
    with early_gym_servers(gym) as head:  # nobody claimed either: both stopped at the end of the block
        pids = claim_early_warm_pids()
    assert wait_gone(pids, 10.0) == [] and not head.alive()
    for section in ({"warm_launcher": False}, {"head_url": "http://h:1", "config_paths": []}):
        with early_gym_servers(_gym(tmp_path, fake_gym_venv, **section)):
            assert claim_early_warm() is None


def claim_early_warm_pids() -> set[int]:
    """The pids of the parked warm launcher, leaving it parked (unclaimed)."""
    warm = gym_warm.EARLY.peek()
    assert warm is not None and warm.alive()
    return warm.pids()


def test_a_launch_from_another_gym_venv_goes_cold(fake_gym_venv, tmp_path, caplog):
    spec = fake_spec(fake_gym_venv, tmp_path)
    warm = WarmLauncher.for_spec(spec, preload=[])
    with caplog.at_level(logging.WARNING, logger="nemo_gym_adapter.gym.warm"):
        assert warm.launch(["/elsewhere/bin/gym", "env", "start"], warm.env, tmp_path, tmp_path / "gym.log") is None
    assert "was started for" in caplog.text and not warm.alive()
    assert warm.launch([str(warm.script)], warm.env, tmp_path, tmp_path / "gym.log") is None  # stopped: never reused
    assert os.environ.get("RAY_AUTH_TOKEN") is None  # nothing leaked into the trainer's environment


def test_a_warm_launcher_that_cannot_start_is_skipped_with_a_warning(tmp_path, caplog):
    gym = _gym(tmp_path, tmp_path / "no-venv")  # no bin/gym, no bin/python
    with caplog.at_level(logging.WARNING, logger="nemo_gym_adapter.gym.warm"):
        assert gym_warm.start_warm_for(gym, None) is None
    assert "nemo_gym.warm_launcher: could not start" in caplog.text and "launch cold" in caplog.text
