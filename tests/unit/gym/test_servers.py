"""Unit tests of nemo_gym_adapter.gym.servers with a fake Gym (``tests/support/fake_gym_venv.py``: no real Gym, no
Ray, seconds): start, readiness, crash and timeout diagnosis, teardown of escaped helpers, attach."""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from nemo_gym_adapter.errors import GymServerError
from nemo_gym_adapter.gym.servers import GymServers
from tests.support.fake_gym_venv import fake_spec
from tests.support.pids import alive_pids

# ---------------------------------------------------------------- start / stop with FakeGym


def test_start_exposes_head_and_teardown_kills_escaped_helpers(fake_gym_venv, tmp_path):
    with GymServers.start(fake_spec(fake_gym_venv, tmp_path, policy_api_key="sk-x")) as gym:
        assert gym.owned and gym.startup_seconds is not None
        pids = gym.pids()
        assert len(pids) >= 2  # launcher + the orphaned, SIGTERM-ignoring helper
        assert set(gym.server_instances()) == {"env_a"}
        cfg = gym.global_config()
        assert cfg["policy_model"]["responses_api_models"]["vllm_model"]["base_url"] == "http://127.0.0.1:9/v1"
        assert cfg["policy_api_key"] == "<redacted>"
        assert gym.run_url("agent_a") == f"{gym.head_url}/run"
        with pytest.raises(GymServerError, match="agent_b"):
            gym.run_url("agent_b")
    assert alive_pids(pids) == []


def test_restart_keeps_the_head_url_drops_dead_replicas_and_stops_the_old_gym(fake_gym_venv, tmp_path, monkeypatch):
    from nemo_gym_adapter.gym import servers as gym_servers

    spec = fake_spec(fake_gym_venv, tmp_path, policy_base_url=["127.0.0.1:9", "127.0.0.1:10"])
    records_before_each_write: list[list[str]] = []  # the run dir's records when a launch writes its own

    def spy(path: Path, pids) -> None:
        records_before_each_write.append(
            sorted(str(r.relative_to(tmp_path / "run")) for r in (tmp_path / "run").rglob("*.pid"))
        )
        real(path, pids)

    real = gym_servers.write_pid_record
    monkeypatch.setattr(gym_servers, "write_pid_record", spy)
    with GymServers.start(spec) as gym:
        # string consumers get one URL, the policy's model server the replica list (as Gym's config merge does)
        assert gym.global_config()["policy_base_url"] == "http://127.0.0.1:9/v1"
        two = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
        assert gym.global_config()["policy_model"]["responses_api_models"]["vllm_model"]["base_url"] == two
        head, old = gym.head_url, gym.pids()
        seen: list[int] = []
        gym.on_restart.append(lambda g: seen.append(g.restarts))
        gym.restart(drop_replicas=["127.0.0.1:10"])
        assert gym.head_url == head and gym.restarts == 1 and seen == [1]
        assert alive_pids(old) == [] and gym.pids()
        cfg = gym.global_config()
        assert cfg["policy_model"]["responses_api_models"]["vllm_model"]["base_url"] == "http://127.0.0.1:9/v1"
        assert (tmp_path / "run" / "restart1" / "gym.log").exists() and gym.run_dir == tmp_path / "run"
        # The old record went only once the new launch had written its own: the run dir's watchdog (runtime.reaper)
        # never sees it without one, and takes no restart for the Gym's end.
        assert records_before_each_write == [[], ["gym.pid"]]
        assert sorted(str(r.relative_to(tmp_path / "run")) for r in (tmp_path / "run").rglob("*.pid")) == [
            "restart1/gym.pid"
        ]
        with pytest.raises(GymServerError, match="every vLLM replica is down"):
            gym.restart(drop_replicas=["127.0.0.1:9"])
        new = gym.pids()
    assert alive_pids(new) == []
    with pytest.raises(GymServerError, match="not started by us"):
        GymServers(head).restart()


def test_crashed_server_is_named_with_log_tail(fake_gym_venv, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_GYM_MODE", "crash")
    t0 = time.monotonic()
    with pytest.raises(GymServerError) as e:
        GymServers.start(fake_spec(fake_gym_venv, tmp_path))
    assert time.monotonic() - t0 < 15
    msg = str(e.value)
    assert "crashed: policy_model" in msg and "fake gym starting crash" in msg  # name + launcher log tail
    assert alive_pids(_fake_gym_pids(tmp_path)) == []


def test_never_ready_times_out_naming_the_model_endpoint(fake_gym_venv, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_GYM_MODE", "never")
    t0 = time.monotonic()
    with pytest.raises(GymServerError) as e:
        GymServers.start(fake_spec(fake_gym_venv, tmp_path, startup_timeout_s=3))
    assert time.monotonic() - t0 < 3 + 10
    # every instance answers, so the one thing Gym still waits for is the (unreachable) model endpoint
    assert "not ready after 3s" in str(e.value) and "http://127.0.0.1:9/v1" in str(e.value)
    assert alive_pids(_fake_gym_pids(tmp_path)) == []


class _Models(BaseHTTPRequestHandler):
    """A model endpoint: answers anything (Gym only needs an HTTP answer from ``<base_url>/models``)."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


def test_ready_when_every_server_and_model_answers_before_gyms_own_flag(fake_gym_venv, tmp_path, monkeypatch):
    """Gym's head says 503 for 60 s (its fixed-cadence wait), but every instance and the model endpoint answer: we
    are ready at once. The control: with Gym's model wait off, only Gym's own /health counts (timeout)."""
    monkeypatch.setenv("FAKE_GYM_DELAY", "60")
    models = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=models.serve_forever, daemon=True).start()
    try:
        url = f"127.0.0.1:{models.server_address[1]}"
        with GymServers.start(fake_spec(fake_gym_venv, tmp_path, policy_base_url=[url])) as gym:
            assert gym.startup_seconds is not None and gym.startup_seconds < 15
        overrides = {"model_endpoint_readiness_timeout_seconds": 0}
        with pytest.raises(GymServerError, match="not ready after 3s"):
            GymServers.start(
                fake_spec(
                    fake_gym_venv, tmp_path, policy_base_url=[url], config_overrides=overrides, startup_timeout_s=3
                )
            )
    finally:
        models.shutdown()


def _fake_gym_pids(tmp_path: Path) -> list[int]:
    """Processes still running FakeGym code from this test's venv (scoped to tmp_path, so only ours)."""
    out = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            if str(tmp_path) in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid():
                out.append(p.pid)
        except psutil.Error:
            pass
    return out


# ---------------------------------------------------------------- attach


class FakeHead(BaseHTTPRequestHandler):
    """A head server only: /health status settable per test."""

    health = 200

    def log_message(self, *a):
        pass

    def do_GET(self):
        body, code = b"[]", 200
        if self.path == "/health":
            code = type(self).health
            body = b"{}"
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def fake_head():
    handler = type("Handler", (FakeHead,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_attach_owns_nothing(fake_head):
    handler, url = fake_head
    gym = GymServers.attach(url, timeout=5)
    assert not gym.owned and gym.pids() == set()
    gym.stop()  # a no-op: the head still answers
    with gym:
        pass
    assert GymServers.attach(url, timeout=5).head_url == url


def test_attach_to_unready_gym_times_out(fake_head):
    handler, url = fake_head
    handler.health = 503
    with pytest.raises(GymServerError, match=rf"{url}.*not ready after 1s.*503"):
        GymServers.attach(url, timeout=1)


def test_reattach_waits_for_the_attached_gym_to_answer_again_then_forgets_the_old_one(fake_head):
    """An attached Gym whose host was lost: reattach() waits (attach_timeout_s) for the same head URL to be ready,
    drops the cached config (a new launch has new ports), counts it and runs the on_restart hooks; a Gym that stays
    down is a GymServerError naming it."""
    handler, url = fake_head
    gym = GymServers.attach(url, timeout=1)
    gym._config = {"stale": {}}
    hooks: list[int] = []
    gym.on_restart.append(lambda g: hooks.append(g.restarts))
    handler.health = 503
    threading.Timer(0.6, lambda: setattr(handler, "health", 200)).start()  # the service comes back
    gym.reattach()
    assert gym._config is None and gym.restarts == 1 and hooks == [1]
    handler.health = 503
    with pytest.raises(GymServerError, match=rf"{url}.*not ready after 1s"):
        gym.reattach()


# ---------------------------------------------------------------- a port lost at start-up (gym.ports)


@pytest.mark.parametrize("who", ["agent_a", "head"])
def test_a_lost_port_relaunches_gym_on_new_ports_and_says_which(fake_gym_venv, tmp_path, monkeypatch, caplog, who):
    """The first launch's server (or head server) finds its port taken: Gym is relaunched, cold, its logs under
    ``port_retry1``, a warning names the server and the port; ``run_dir`` stays the first launch's; nothing of the
    failed launch is left."""
    monkeypatch.setenv("FAKE_GYM_MODE", f"lose_port:{who}:1:{tmp_path / 'launches'}")
    spec = fake_spec(fake_gym_venv, tmp_path, port_range=(40000, 40100), startup_timeout_s=60)
    lost = 40000 if who == "agent_a" else None
    with caplog.at_level("WARNING"), GymServers.start(spec) as gym:
        assert (tmp_path / "launches").read_text() == "2"
        assert gym.run_dir == tmp_path / "run" and gym.log_path == tmp_path / "run" / "port_retry1" / "gym.log"
        first_log = (tmp_path / "run" / "gym.log").read_text()
        if lost is None:  # the head server's port: ours, drawn from the same band
            lost = int(first_log.split("bind on address ('127.0.0.1', ")[1].split(")")[0])
            assert 40000 <= lost <= 40100
        server = "head server" if who == "head" else "agent_a"
        assert f"{server} lost port {lost}" in caplog.text and "retry 1 of nemo_gym.port_retries=2" in caplog.text
        assert gym.server_instances()
        pids = gym.pids()
    assert alive_pids(pids) == []


def test_a_port_lost_every_time_fails_after_the_retries_naming_server_and_port(fake_gym_venv, tmp_path, monkeypatch):
    from nemo_gym_adapter.gym.ports import GymPortInUseError

    monkeypatch.setenv("FAKE_GYM_MODE", f"lose_port:agent_a:9:{tmp_path / 'launches'}")
    spec = fake_spec(fake_gym_venv, tmp_path, port_range=(40000, 40100), port_retries=1, startup_timeout_s=60)
    with pytest.raises(GymPortInUseError, match="agent_a could not bind port 40000") as e:
        GymServers.start(spec)
    assert (e.value.server, e.value.port) == ("agent_a", 40000)
    assert (tmp_path / "launches").read_text() == "2"  # the launch and one retry


def test_a_pinned_head_port_that_is_lost_is_not_retried(fake_gym_venv, tmp_path, monkeypatch):
    from nemo_gym_adapter.gym.ports import GymPortInUseError
    from nemo_gym_adapter.runtime.procs import free_port

    monkeypatch.setenv("FAKE_GYM_MODE", f"lose_port:head:1:{tmp_path / 'launches'}")
    port = free_port()
    with pytest.raises(GymPortInUseError, match=f"head server could not bind port {port}"):
        GymServers.start(fake_spec(fake_gym_venv, tmp_path, head_port=port, startup_timeout_s=60))
    assert (tmp_path / "launches").read_text() == "1"
