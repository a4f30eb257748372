"""Unit tests of nemo_gym_adapter.gym_servers with a fake Gym (no real Gym, no Ray, seconds).

``FakeGym`` is a stand-in ``bin/gym`` executable in a fake Gym venv: it reads our launch config (the last
``+config_paths`` entry) like Gym would, serves the head server's three endpoints and one "server instance", and
can be told (via its environment) to be slow, to never become ready, to crash like a Gym server, or to leave a
child that ignores SIGTERM behind -- the behaviours the lifecycle code must handle.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from nemo_gym_adapter.errors import AdapterConfigError, GymServerError
from nemo_gym_adapter.gym_servers import (
    GymLaunchSpec,
    GymServers,
    _launch_config,
    resolve_config_paths,
)

GYM_REL_CONFIG = "resources_servers/fake_env/configs/fake_env.yaml"

FAKE_GYM = textwrap.dedent(
    r"""
    import json, os, re, subprocess, sys, time, yaml
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    paths = re.match(r"\+config_paths=\[(.*)\]$", sys.argv[3]).group(1)
    launch = json.loads(json.loads("[" + paths + "]")[-1] and open(json.loads("[" + paths + "]")[-1]).read())
    host, port = launch["head_server"]["host"], launch["head_server"]["port"]
    mode = os.environ.get("FAKE_GYM_MODE", "ok")
    if not launch.get("ray_head_node_address") and os.environ.get("RAY_ADDRESS") != "local":
        sys.exit("ray.init() would join whatever cluster /tmp/ray/ray_current_cluster names")
    print("fake gym starting", mode, flush=True)
    # Like Ray's agents once the raylet is gone: re-parented to init (its parent exits at once), in its own
    # process group, ignoring SIGTERM. Only the launcher's session still leads to it.
    helper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    subprocess.run([sys.executable, "-c",
        f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {helper!r}], process_group=0)"])
    if mode == "crash":
        time.sleep(0.5)
        print("Process `policy_model` finished unexpectedly!", flush=True)
        sys.exit(1)
    ready_at = time.monotonic() + float(os.environ.get("FAKE_GYM_DELAY", "0.5"))
    cfg = {"policy_base_url": launch["policy_base_url"], "policy_api_key": launch["policy_api_key"],
           "env_a": {"environment_servers": {"legacy_agent": {"agent_server": {"type": "responses_api_agents",
                     "name": "agent_a"}, "host": host, "port": port}}},
           "policy_model": {"responses_api_models": {"vllm_model": {"base_url": "${policy_base_url}",
                            "host": host, "port": port}}}}

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def _send(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def do_GET(self):
            ready = mode == "ok" and time.monotonic() > ready_at
            if self.path == "/health":
                self._send(200 if ready else 503, {"status": "ok" if ready else "starting"})
            elif self.path == "/server_instances":
                self._send(200, [{"process_name": "env_a", "server_type": "environment_servers",
                                  "name": "legacy_agent", "host": host, "port": port,
                                  "url": f"http://{host}:{port}"}])
            elif self.path == "/global_config_dict_yaml":
                self._send(200, yaml.safe_dump(cfg))
            else:
                self._send(404, {})

    ThreadingHTTPServer((host, port), H).serve_forever()
    """
)


@pytest.fixture
def fake_gym_venv(tmp_path: Path) -> Path:
    """A directory shaped like the Gym venv: bin/python, bin/gym (FakeGym), site-packages with nemo_gym/."""
    venv = tmp_path / "gym-venv"
    site = venv / "lib" / "python3.13" / "site-packages"
    (site / "nemo_gym").mkdir(parents=True)
    cfg = site / GYM_REL_CONFIG
    cfg.parent.mkdir(parents=True)
    cfg.write_text("fake_env: {}\n")
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    gym = venv / "bin" / "gym"
    gym.write_text(f"#!{sys.executable}\n{FAKE_GYM}")
    gym.chmod(0o755)
    return venv


def _spec(venv: Path, tmp_path: Path, **kw) -> GymLaunchSpec:
    base = dict(
        config_paths=[GYM_REL_CONFIG],
        policy_base_url=["127.0.0.1:9"],
        policy_model_name="m",
        gym_venv=venv,
        run_dir=tmp_path / "run",
        startup_timeout_s=20,
        stop_timeout_s=1,
    )
    return GymLaunchSpec(**{**base, **kw})


# ---------------------------------------------------------------- spec validation


def test_spec_normalises_replica_addresses():
    spec = GymLaunchSpec(
        config_paths=["a.yaml"],
        policy_base_url=["10.0.0.1:8000", "http://h:1/v1/", "https://h:2"],
        policy_model_name="m",
    )
    assert spec.policy_base_url == ["http://10.0.0.1:8000/v1", "http://h:1/v1", "https://h:2/v1"]
    assert "secret" not in repr(
        GymLaunchSpec(config_paths=["a"], policy_base_url=["h:1"], policy_model_name="m", policy_api_key="secret")
    )


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"policy_base_url": ["http://h:1/v2"]}, "policy_base_url"),
        ({"policy_base_url": []}, "policy_base_url"),
        ({"config_paths": []}, "config_paths"),
        ({"head_port": 70000}, "head_port"),
        ({"port_range": (20000, 10000)}, "port_range"),
        ({"startup_timeout_s": 0}, "startup_timeout_s"),
        ({"policy_modle_name": "typo"}, "policy_modle_name"),
    ],
)
def test_spec_errors_name_the_field(bad, field):
    data = {"config_paths": ["a.yaml"], "policy_base_url": ["h:1"], "policy_model_name": "m", **bad}
    with pytest.raises(ValidationError) as e:
        GymLaunchSpec(**data)
    assert field in str(e.value)
    with pytest.raises(AdapterConfigError, match=rf"trainer\.gym\.{field}"):
        GymLaunchSpec.parse(data, prefix="trainer.gym")


def test_config_paths_resolve_like_gym(fake_gym_venv, tmp_path, monkeypatch):
    mine = tmp_path / "cwd" / "configs" / "mine.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("x: 1\n")
    monkeypatch.chdir(tmp_path / "cwd")
    spec = _spec(fake_gym_venv, tmp_path, config_paths=["configs/mine.yaml", GYM_REL_CONFIG])
    # cwd-relative becomes absolute (Gym runs in run_dir); Gym-relative stays for Gym's own lookup
    assert resolve_config_paths(spec) == [str(mine.resolve()), GYM_REL_CONFIG]
    with pytest.raises(AdapterConfigError, match=r"gym\.config_paths\[1\]: 'nope/x\.yaml' not found"):
        resolve_config_paths(_spec(fake_gym_venv, tmp_path, config_paths=[GYM_REL_CONFIG, "nope/x.yaml"]))
    with pytest.raises(AdapterConfigError, match=r"gym\.config_paths\[0\]"):
        resolve_config_paths(_spec(fake_gym_venv, tmp_path, config_paths=[str(tmp_path / "absent.yaml")]))


def test_launch_config_carries_everything_but_the_key(tmp_path):
    spec = GymLaunchSpec(
        config_paths=["a.yaml"],
        policy_base_url=["h:1", "h:2"],
        policy_model_name="m",
        policy_api_key="sk-secret",
        ray_head_node_address="10.0.0.1:6379",
        port_range=(30000, 31000),
        server_venvs_dir=tmp_path / "venvs",
        config_overrides={"head_server": {"host": "0.0.0.0"}, "policy_model": {"x": 1}},
    )
    cfg = _launch_config(spec, head_port=1234, run_dir=tmp_path)
    assert cfg["policy_base_url"] == ["http://h:1/v1", "http://h:2/v1"]
    assert cfg["head_server"] == {"host": "0.0.0.0", "port": 1234}  # deep-merged override
    assert cfg["ray_head_node_address"] == "10.0.0.1:6379"
    assert (cfg["port_range_low"], cfg["port_range_high"]) == (30000, 31000)
    assert cfg["uv_venv_dir"] == str(tmp_path / "venvs") and cfg["skip_venv_if_present"] is True
    assert cfg["policy_model"] == {"x": 1}
    assert "sk-secret" not in json.dumps(cfg)


# ---------------------------------------------------------------- start / stop with FakeGym


def _alive(pids):
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


def test_start_exposes_head_and_teardown_kills_escaped_helpers(fake_gym_venv, tmp_path):
    with GymServers.start(_spec(fake_gym_venv, tmp_path, policy_api_key="sk-x")) as gym:
        assert gym.owned and gym.startup_seconds is not None
        pids = gym.pids()
        assert len(pids) >= 2  # launcher + the orphaned, SIGTERM-ignoring helper
        assert set(gym.server_instances()) == {"env_a"}
        cfg = gym.global_config()
        assert cfg["policy_model"]["responses_api_models"]["vllm_model"]["base_url"] == ["http://127.0.0.1:9/v1"]
        assert cfg["policy_api_key"] == "<redacted>"
        assert gym.run_url("agent_a") == f"{gym.head_url}/run"
        with pytest.raises(GymServerError, match="agent_b"):
            gym.run_url("agent_b")
    assert _alive(pids) == []


def test_crashed_server_is_named_with_log_tail(fake_gym_venv, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_GYM_MODE", "crash")
    t0 = time.monotonic()
    with pytest.raises(GymServerError) as e:
        GymServers.start(_spec(fake_gym_venv, tmp_path))
    assert time.monotonic() - t0 < 15
    msg = str(e.value)
    assert "crashed: policy_model" in msg and "fake gym starting crash" in msg  # name + launcher log tail
    assert _alive(_fake_gym_pids(tmp_path)) == []


def test_never_ready_times_out_naming_the_model_endpoint(fake_gym_venv, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_GYM_MODE", "never")
    t0 = time.monotonic()
    with pytest.raises(GymServerError) as e:
        GymServers.start(_spec(fake_gym_venv, tmp_path, startup_timeout_s=3))
    assert time.monotonic() - t0 < 3 + 10
    # every instance answers, so the one thing Gym still waits for is the (unreachable) model endpoint
    assert "not ready after 3s" in str(e.value) and "http://127.0.0.1:9/v1" in str(e.value)
    assert _alive(_fake_gym_pids(tmp_path)) == []


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
