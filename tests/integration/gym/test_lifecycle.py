"""Lifecycle of a real NeMo Gym started through GymServers: failures are named, nothing outlives teardown.

No vLLM needed: Gym is pointed at a dead model URL and told not to wait for it
(``model_endpoint_readiness_timeout_seconds: 0``), except where waiting for it is the point. Processes are checked
by pid -- the launcher, every server, and the Ray cluster Gym starts (gcs_server, raylet and the agents that Ray
re-parents to init when the raylet dies).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from nemo_gym_adapter.errors import AdapterConfigError, GymServerError
from nemo_gym_adapter.gym.servers import GymServers
from nemo_gym_adapter.runtime.procs import free_port, session_members
from tests.support.gym_fixtures import single_tool_call_spec
from tests.support.pids import alive_pids, wait_gone

pytestmark = pytest.mark.integration

NO_MODEL_WAIT = {"model_endpoint_readiness_timeout_seconds": 0}
START_TIMEOUT_S = 400.0  # a shared 2-core machine under load has taken ~100 s for a spin-up that is ~10 s idle
WATCHDOG_EXIT_S = 15.0  # runtime.reaper: GRACE_S (2 s) after the last record goes, a poll, room for a loaded machine


def _dead_url() -> str:
    return f"127.0.0.1:{free_port()}"


def _cmdlines(pids) -> str:
    out = []
    for pid in pids:
        try:
            out.append(" ".join(psutil.Process(pid).cmdline()))
        except psutil.Error:
            pass
    return "\n".join(out)


class PidRecorder:
    """Records every process that appears below this process (and in the sessions they lead) while active.

    Processes that existed before (e.g. a session-scoped vLLM) are ignored, so only what the code under test
    started is checked.
    """

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self._before = {p.pid for p in psutil.Process().children(recursive=True)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _snapshot(self) -> None:
        for child in psutil.Process().children(recursive=True):
            if child.pid in self._before:
                continue
            self.seen.add(child.pid)
            try:
                if os.getsid(child.pid) == child.pid:
                    self.seen.update(session_members(child.pid))
            except OSError:
                pass

    def _run(self) -> None:
        while not self._stop.is_set():
            self._snapshot()
            time.sleep(0.2)

    def __enter__(self) -> PidRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_missing_config_path_fails_before_starting_anything(tmp_path):
    spec = single_tool_call_spec([_dead_url()], "m", run_dir=tmp_path / "run")
    spec = spec.model_copy(update={"config_paths": [*spec.config_paths, "resources_servers/nope/configs/nope.yaml"]})
    with PidRecorder() as rec, pytest.raises(AdapterConfigError, match=r"gym\.config_paths\[2\].*nope\.yaml"):
        GymServers.start(spec)
    assert rec.seen == set()


def test_config_error_inside_gym_is_reported_with_its_log(tmp_path):
    # The file exists (our check passes) but names a config Gym cannot find: Gym's own parser fails.
    broken = tmp_path / "broken.yaml"
    broken.write_text("config_paths:\n  - resources_servers/nope/configs/nope.yaml\n")
    spec = single_tool_call_spec([_dead_url()], "m", run_dir=tmp_path / "run", startup_timeout_s=START_TIMEOUT_S)
    spec = spec.model_copy(update={"config_paths": [*spec.config_paths, str(broken)]})
    t0 = time.monotonic()
    with PidRecorder() as rec, pytest.raises(GymServerError) as e:
        GymServers.start(spec)
    assert time.monotonic() - t0 < START_TIMEOUT_S
    assert "exited with code" in str(e.value) and "nope.yaml" in str(e.value)  # Gym's message, from the log tail
    assert rec.seen and wait_gone(rec.seen, 15.0) == []


# Slow tier (~90 s here at load 3-5): the unit tier names a crashed server with its log tail against the fake Gym
# (tests/unit/gym/test_servers.py::test_crashed_server_is_named_with_log_tail); this is real Gym's crash log.
@pytest.mark.slow
def test_crashing_server_is_named_with_its_log_tail(tmp_path):
    # vllm_model rejects this combination when it starts: the server process exits, Gym's launcher follows.
    crash = {
        "policy_model": {
            "responses_api_models": {
                "vllm_model": {"supply_prefix_token_ids": True, "return_token_id_information": False}
            }
        }
    }
    spec = single_tool_call_spec(
        [_dead_url()],
        "m",
        run_dir=tmp_path / "run",
        startup_timeout_s=START_TIMEOUT_S,
        config_overrides={**NO_MODEL_WAIT, **crash},
    )
    t0 = time.monotonic()
    with PidRecorder() as rec, pytest.raises(GymServerError) as e:
        GymServers.start(spec)
    assert time.monotonic() - t0 < START_TIMEOUT_S
    msg = str(e.value)
    assert "crashed: policy_model" in msg
    assert "supply_prefix_token_ids" in msg  # the crashed server's own log tail
    assert rec.seen
    assert wait_gone(rec.seen, 15.0) == []


@pytest.mark.slow
def test_never_ready_raises_within_the_timeout_naming_what_is_missing(tmp_path):
    dead = _dead_url()
    spec = single_tool_call_spec([dead], "m", run_dir=tmp_path / "run", startup_timeout_s=30)  # waits for the model
    t0 = time.monotonic()
    with PidRecorder() as rec, pytest.raises(GymServerError, match="not ready after 30s") as e:
        GymServers.start(spec)
    assert time.monotonic() - t0 < 30 + 30  # + teardown
    msg = str(e.value)
    # the culprit: the dead model endpoint -- or, on a slow machine, servers (or the head) still starting
    culprits = (f"http://{dead}/v1", "policy_model", "example_single_tool_call", "head server")
    assert [n for n in culprits if n in msg.split("\n")[0]], msg
    assert wait_gone(rec.seen, 15.0) == []


def test_context_exit_on_exception_stops_every_pid_and_attach_never_stops(tmp_path):
    spec = single_tool_call_spec(
        [_dead_url()], "m", run_dir=tmp_path / "run", startup_timeout_s=START_TIMEOUT_S, config_overrides=NO_MODEL_WAIT
    )
    with pytest.raises(RuntimeError, match="boom"):
        with GymServers.start(spec) as gym:
            pids = gym.pids()
            assert "raylet" in _cmdlines(pids) and "gcs_server" in _cmdlines(pids)  # Ray's tree is tracked
            with GymServers.attach(gym.head_url) as attached:
                assert not attached.owned
                assert set(attached.server_instances()) == set(gym.server_instances())
            GymServers.attach(gym.head_url, timeout=5)  # still ready after the attached one was "closed"
            assert alive_pids([gym._launcher.pid])
            raise RuntimeError("boom")
    assert wait_gone(pids, 15.0) == [], _cmdlines(alive_pids(pids))


CHILD = textwrap.dedent(
    """
    import json, sys, time
    from nemo_gym_adapter.gym.launch import GymLaunchSpec
    from nemo_gym_adapter.gym.ray_head import GymRayHead
    from nemo_gym_adapter.gym.servers import GymServers
    from nemo_gym_adapter.gym.warm import WarmLauncher
    spec, mode = GymLaunchSpec.model_validate_json(sys.argv[1]), sys.argv[2]
    from nemo_gym_adapter.runtime import reaper
    if "--watchdog" in sys.argv:  # as the trainer's task runner does first (gym.early)
        reaper.start_watchdog(spec.run_dir)
    if mode == "cold":  # Gym starts its own Ray cluster
        gym = GymServers.start(spec)
        print(json.dumps({"head_url": gym.head_url, "pids": sorted(gym.pids())}), flush=True)
    else:  # the trainer's default: an early Ray head and a warm launcher next to it, recorded in the run dir
        head = GymRayHead.start(run_dir=spec.run_dir)
        warm = WarmLauncher.for_spec(spec, head)
        if mode == "warm-waiting":  # killed before Gym starts: the warm launcher still waits for its launch
            head.wait_ready(300)
            warm._wait_ready(300)
            print(json.dumps({"warm": sorted(warm.pids()), "pids": sorted(head.pids() | warm.pids())}), flush=True)
        else:
            gym = GymServers.start(spec, ray_head=head, warm=warm)
            assert gym.warm, warm.log_path
            pids = sorted(gym.pids() | head.pids())
            print(json.dumps({"head_url": gym.head_url, "pids": pids}), flush=True)
            if "--then-stop" in sys.argv:  # a long-lived owner stops its Gym and lives on (a test session, a notebook)
                sys.stdin.readline()
                gym.stop()
                head.stop()
                watchdogs = [pid for pid, _ in reaper._STARTED.values()]
                print(json.dumps({"stopped": True, "watchdogs": watchdogs}), flush=True)
    time.sleep(900)
    """
)


# The default run SIGTERMs the shipped mode (warm: the early Ray head, Gym launched by the warm launcher); cold and a
# launcher still waiting are the slow tier's (~50 s here): every other test here launches cold, and the unit tier
# stops a waiting warm launcher (tests/unit/gym/test_warm.py).
@pytest.mark.parametrize(
    "mode", [pytest.param("cold", marks=pytest.mark.slow), "warm", pytest.param("warm-waiting", marks=pytest.mark.slow)]
)
def test_sigterm_to_the_trainer_stops_gym_and_ray(tmp_path, mode):
    """SIGTERM to the trainer stops everything of Gym: a cold launch and its own Ray; the early Ray head with Gym
    launched by the warm launcher; the head and a warm launcher still waiting for its launch."""
    spec = single_tool_call_spec(
        [_dead_url()], "m", run_dir=tmp_path / "run", startup_timeout_s=START_TIMEOUT_S, config_overrides=NO_MODEL_WAIT
    )
    spec_json = spec.model_dump_json(exclude={"policy_api_key"})
    child = subprocess.Popen([sys.executable, "-c", CHILD, spec_json, mode], stdout=subprocess.PIPE, text=True)
    try:
        with PidRecorder() as rec:
            line = _readline(child, timeout=START_TIMEOUT_S + 30)
            info = json.loads(line)
            if "head_url" in info:
                GymServers.attach(info["head_url"], timeout=10)
            assert "raylet" in _cmdlines(info["pids"])
            if mode == "warm-waiting":
                assert "gym/warm_boot.py" in _cmdlines(info["warm"])
            child.send_signal(signal.SIGTERM)
            assert child.wait(timeout=60) == -signal.SIGTERM
        pids = set(info["pids"]) | rec.seen
        assert wait_gone(pids, 15.0) == [], _cmdlines(alive_pids(pids))
    finally:
        if child.poll() is None:
            child.kill()


def test_a_sigkilled_trainers_warm_launcher_exits_by_itself_and_the_driver_sweeps_the_rest(tmp_path):
    """SIGKILL leaves no handler to run: the waiting warm launcher sees its stdin close and exits on its own; the Ray
    head is left for the driver's sweep of the run dir's pid records (recipe.nemo_gym.main.sweep_gym)."""
    from recipe.nemo_gym.main import sweep_gym

    run_dir = tmp_path / "run"
    spec = single_tool_call_spec([_dead_url()], "m", run_dir=run_dir, config_overrides=NO_MODEL_WAIT)
    spec_json = spec.model_dump_json(exclude={"policy_api_key"})
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, spec_json, "warm-waiting"], stdout=subprocess.PIPE, text=True
    )
    try:
        with PidRecorder() as rec:
            info = json.loads(_readline(child, timeout=START_TIMEOUT_S))
            assert (run_dir / "gym_warm.pid").exists() and (run_dir / "gym_ray.pid").exists()
            child.kill()
            child.wait(timeout=30)
            assert wait_gone(set(info["warm"]), 15.0) == [], _cmdlines(info["warm"])
            assert alive_pids(set(info["pids"]) - set(info["warm"]))  # the head outlives a SIGKILLed trainer...
            assert sweep_gym(run_dir)  # ... until the driver sweeps it
        pids = set(info["pids"]) | rec.seen
        assert wait_gone(pids, 15.0) == [], _cmdlines(alive_pids(pids))
        assert not (run_dir / "gym_warm.pid").exists() and not (run_dir / "gym_ray.pid").exists()
    finally:
        if child.poll() is None:
            child.kill()


def test_a_sigkilled_trainers_gym_ray_head_and_servers_are_stopped_by_its_watchdog(tmp_path):
    """The trainer's default start (early Ray head, Gym launched by the warm launcher) in a process that set a watchdog
    first, as the task runner does: after a SIGKILL of that process, nothing of Gym or its Ray head is left within a
    bounded wait, without anyone sweeping (``nemo_gym_adapter.runtime.reaper``)."""
    run_dir = tmp_path / "run"
    spec = single_tool_call_spec([_dead_url()], "m", run_dir=run_dir, config_overrides=NO_MODEL_WAIT)
    spec_json = spec.model_dump_json(exclude={"policy_api_key"})
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, spec_json, "warm", "--watchdog"], stdout=subprocess.PIPE, text=True
    )
    try:
        with PidRecorder() as rec:
            info = json.loads(_readline(child, timeout=START_TIMEOUT_S))
            assert (run_dir / "gym.pid").exists() and (run_dir / "gym_ray.pid").exists()
            assert "raylet" in _cmdlines(info["pids"]) and "example_single_tool_call" in _cmdlines(info["pids"])
            child.kill()
            child.wait(timeout=30)
            t0 = time.monotonic()
            pids = set(info["pids"]) | rec.seen
            assert wait_gone(pids, 60.0) == [], _cmdlines(alive_pids(pids))
        print(f"everything of the SIGKILLed trainer's Gym gone {time.monotonic() - t0:.1f}s after the kill")
        # The watchdog removes each record once its processes are stopped and logs last: wait for that line (under
        # load the last record can go a moment after the last process).
        deadline = time.monotonic() + 30.0
        while "gone; stopped" not in (run_dir / "reaper.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "gone; stopped" in (run_dir / "reaper.log").read_text() and not list(run_dir.rglob("*.pid"))
    finally:
        if child.poll() is None:
            child.kill()


def test_the_watchdog_of_a_gym_stopped_by_a_long_lived_owner_exits_with_it(tmp_path):
    """The trainer's default start (early Ray head, warm launcher, Gym) with its watchdog, in a process that stops
    them and lives on: the watchdog exits within a few seconds of the stop instead of living as long as its owner
    (``runtime.reaper``); the control is the SIGKILL test above, where the same watchdog outlives its owner's Gym
    only to sweep it."""
    run_dir = tmp_path / "run"
    spec = single_tool_call_spec([_dead_url()], "m", run_dir=run_dir, config_overrides=NO_MODEL_WAIT)
    spec_json = spec.model_dump_json(exclude={"policy_api_key"})
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, spec_json, "warm", "--watchdog", "--then-stop"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        info = json.loads(_readline(child, timeout=START_TIMEOUT_S))
        assert "raylet" in _cmdlines(info["pids"]) and (run_dir / "gym.pid").exists()
        child.stdin.write("stop\n")
        child.stdin.flush()
        stopped = json.loads(_readline(child, timeout=60))
        t0 = time.monotonic()
        [watchdog] = stopped["watchdogs"]
        assert wait_gone([watchdog], WATCHDOG_EXIT_S) == [], "the watchdog outlives its Gym"
        print(f"watchdog gone {time.monotonic() - t0:.1f}s after its Gym's stop")
        assert child.poll() is None and not list(run_dir.rglob("*.pid"))
        assert "its Gym is stopped; exiting" in (run_dir / "reaper.log").read_text()
    finally:
        if child.poll() is None:
            child.kill()


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not out or not out[0]:
        raise AssertionError(f"child did not report a started Gym within {timeout}s (exit code {proc.poll()})")
    return out[0]


# Slow tier (~70 s here): every e2e launch joins the early head (its log line is asserted), a restart joining it again
# is tests/integration/gym/test_server_down.py's (real Gym, early head), and the unit tier's test_ray_head restarts.
@pytest.mark.slow
def test_gym_joins_an_early_ray_head_a_restart_reuses_it_and_nothing_is_left(tmp_path):
    """``nemo_gym.ray_head: early``: a real ``ray start`` from Gym's venv; Gym connects to it (its log says so) and
    runs no Ray cluster of its own (one GCS, the head's); a Gym restart joins the same head; stopping Gym, then the
    head, leaves no process and no temp dir."""
    from nemo_gym_adapter.gym.ray_head import GymRayHead

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = single_tool_call_spec(
        [_dead_url()], "m", run_dir=run_dir, startup_timeout_s=START_TIMEOUT_S, config_overrides=NO_MODEL_WAIT
    )
    joined = "Connecting to Ray cluster at specified address: {}"
    with PidRecorder() as rec:
        head = GymRayHead.start(run_dir=run_dir)
        try:
            with GymServers.start(spec, ray_head=head) as gym:
                log = gym.log_path.read_text()
                assert joined.format(head.address) in log and "starting a new Ray cluster" not in log, log[-3000:]
                assert "gcs_server" not in _cmdlines(gym.pids()) and "raylet" not in _cmdlines(gym.pids())
                assert "gcs_server" in _cmdlines(head.pids())
                first = head.proc.pid
                gym.restart()
                assert head.proc.pid == first and head.restarts == 0
                assert joined.format(head.address) in (run_dir / "restart1" / "gym.log").read_text()
                print(f"Ray head up in {head.start_seconds:.1f}s; Gym {gym.startup_seconds:.1f}s after restart")
            assert head.alive()  # Gym's stop leaves the head to its owner
        finally:
            head.stop()
    assert wait_gone(rec.seen, 15.0) == [], _cmdlines(alive_pids(rec.seen))
    assert head.temp_dir is not None and not head.temp_dir.exists()


def _normalised(value, run_dir: str):
    """``value`` (Gym's global config) with ``run_dir`` spelled <run> and every port 0 (the ports Gym picked, listed
    in ``disallowed_ports``, only counted): what two launches of one spec share."""
    if isinstance(value, dict):
        ports = {"port": lambda v: 0, "disallowed_ports": len}
        return {k: ports[k](v) if k in ports else _normalised(v, run_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalised(v, run_dir) for v in value]
    return value.replace(run_dir, "<run>") if isinstance(value, str) else value


def _differences(a, b, path: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ, as ``path: a != b`` lines."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str) for d in _differences(a.get(k), b.get(k), f"{path}.{k}")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _launch_facts(gym: GymServers) -> dict:
    """What a launch must have in common with another of the same spec (cwd-derived state included)."""
    run_dir = str(gym.run_dir)
    launcher = psutil.Process(gym._launcher.pid)
    from nemo_gym_adapter.gym.head import http_get

    servers = {}
    for inst in json.loads(http_get(f"{gym.head_url}/server_instances")[1]):  # Gym lists each server's pid there
        proc = psutil.Process(inst["pid"])
        env = proc.environ()
        servers[inst["process_name"]] = {
            "cwd": proc.cwd().replace(run_dir, "<run>"),
            "HF_HOME": env.get("HF_HOME", "").replace(run_dir, "<run>"),  # nemo_gym/__init__ derives it from the cwd
            "env_keys": sorted(k for k in env if not k.startswith("NEMO_GYM_OTEL")),
        }
    return {
        "config": _normalised(gym.global_config(), run_dir),
        "launcher_cwd": launcher.cwd().replace(run_dir, "<run>"),
        "launcher_exe": launcher.exe(),
        "servers": servers,
        "server_logs": sorted(p.name for p in (gym.run_dir / "servers").glob("*.log")),
        "log_head": gym.log_path.read_text().lstrip("\n").split(" +config_paths=")[0],
    }


# Slow tier (~80 s here): every e2e launch is warm and asserted to be, cold launches are the rest of this module's, and
# the unit tier compares a warm and a cold launch against the fake Gym (tests/unit/gym/test_warm.py); this compares
# real Gym's configs, environments and logs: run it when Gym or gym/warm*.py change.
@pytest.mark.slow
def test_a_warm_launch_starts_the_same_gym_as_a_cold_one_and_nothing_is_left(tmp_path):
    """``nemo_gym.warm_launcher``: Gym launched by the warm launcher (imports done before the launch) has the same
    global config (ports and run dir aside), servers, server environments (HF_HOME derived from the cwd), working
    directories, interpreter, log header and server logs as a cold ``gym env start`` of the same spec, both joining
    one early Ray head; a restart launches cold; nothing is left after either."""
    from nemo_gym_adapter.gym.ray_head import GymRayHead
    from nemo_gym_adapter.gym.warm import WarmLauncher

    facts = {}
    with PidRecorder() as rec:
        head = GymRayHead.start(run_dir=tmp_path)
        try:
            for kind in ("cold", "warm"):
                spec = single_tool_call_spec(
                    [_dead_url()],
                    "m",
                    run_dir=tmp_path / kind,
                    startup_timeout_s=START_TIMEOUT_S,
                    config_overrides=NO_MODEL_WAIT,
                )
                spec = spec.model_copy(update={"policy_base_url": ["http://127.0.0.1:9/v1"]})  # one URL for both
                # started elsewhere (as without nemo_gym.run_dir): Gym's cwd comes with the launch
                warm = WarmLauncher.for_spec(spec, head, run_dir=tmp_path / "warm-own") if kind == "warm" else None
                with GymServers.start(spec, ray_head=head, warm=warm) as gym:
                    assert gym.warm == (kind == "warm"), warm and warm.log_path
                    facts[kind] = _launch_facts(gym)
                    if kind == "warm":
                        gym.restart()
                        assert not gym.warm and gym.server_instances()  # one launch per warm launcher
        finally:
            head.stop()
    assert _differences(facts["warm"], facts["cold"]) == []
    assert facts["cold"]["servers"] and facts["cold"]["launcher_cwd"] == "<run>"
    assert wait_gone(rec.seen, 15.0) == [], _cmdlines(alive_pids(rec.seen))
