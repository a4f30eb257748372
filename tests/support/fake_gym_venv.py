"""A fake NeMo Gym venv for unit tests of the Gym lifecycle (no real Gym, no Ray, seconds).

``FAKE_RAY`` is a stand-in ``bin/ray`` for ``gym_ray.GymRayHead`` (``ray start --head --block``): it refuses to run
without token auth, makes its ``--temp-dir``, leaves a SIGTERM-ignoring orphan behind like Ray's agents, prints
``Ray runtime started.`` after ``FAKE_RAY_DELAY`` s and blocks (``FAKE_RAY_MODE=ok|crash|never``;
``FAKE_RAY_CRASHES=<file>`` holds how many starts crash before one comes up).

``FAKE_GYM`` is a stand-in ``bin/gym`` executable: it reads our launch config (the last ``+config_paths`` entry)
like Gym would, serves the head server's three endpoints and one "server instance", and can be told (via its
environment: ``FAKE_GYM_MODE=ok|crash|never|lose_port:...``, ``FAKE_GYM_DELAY``) to be slow, to never become ready,
to crash like a Gym server, to have a server (or its head server) lose its port like a bind race does, and it always leaves a child that ignores SIGTERM behind -- the behaviours the lifecycle code must
handle.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

from nemo_gym_adapter.gym.launch import GymLaunchSpec

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
    if launch.get("ray_head_node_address"):  # as Gym prints it; what Ray would see of our token
        token = os.environ.get("RAY_AUTH_TOKEN", "")
        print(f"Connecting to Ray cluster at specified address: {launch['ray_head_node_address']} "
              f"(RAY_AUTH_MODE={os.environ.get('RAY_AUTH_MODE')}, token of {len(token)} chars)", flush=True)
    # Like Ray's agents once the raylet is gone: re-parented to init (its parent exits at once), in its own
    # process group, ignoring SIGTERM. Only the launcher's session still leads to it.
    helper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    subprocess.run([sys.executable, "-c",
        f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {helper!r}], process_group=0)"])
    if mode == "crash":
        time.sleep(0.5)
        print("Process `policy_model` finished unexpectedly!", flush=True)
        sys.exit(1)
    if mode.startswith("lose_port:"):  # lose_port:<server|head>:<launches that lose it>:<counter file>
        _, who, times, counter = mode.split(":", 3)
        n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
        open(counter, "w").write(str(n))
        if n <= int(times):
            lost = port if who == "head" else launch["port_range_low"]
            prefix = "" if who == "head" else f"({who}) "
            print(f"{prefix}ERROR:    [Errno 98] error while attempting to bind on address ('{host}', {lost}): "
                  "address already in use", flush=True)
            time.sleep(600)  # Gym would stop everything a few seconds later (or wait forever: the head)
        mode = "ok"
    ready_at = time.monotonic() + float(os.environ.get("FAKE_GYM_DELAY", "0.5"))
    cfg = {"policy_base_url": launch["policy_base_url"], "policy_api_key": launch["policy_api_key"],
           "env_a": {"environment_servers": {"legacy_agent": {"agent_server": {"type": "responses_api_agents",
                     "name": "agent_a"}, "host": host, "port": port}}},
           "policy_model": {"responses_api_models": {"vllm_model": {"base_url": "${policy_base_url}",
                            "host": host, "port": port}}}}
    # Like Gym's config merge: our launch config sets the replica list on the policy's model server (gym.launch).
    cfg["policy_model"]["responses_api_models"]["vllm_model"].update(
        launch.get("policy_model", {}).get("responses_api_models", {}).get("vllm_model", {}))

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

    server = ThreadingHTTPServer((host, port), H)
    print(f"INFO:     Uvicorn running on http://{host}:{port} (Press CTRL+C to quit)", flush=True)
    server.serve_forever()
    """
)


FAKE_RAY = textwrap.dedent(
    r"""
    import os, subprocess, sys, time
    print("fake ray", " ".join(sys.argv[1:]), flush=True)
    if os.environ.get("RAY_AUTH_MODE") != "token" or len(os.environ.get("RAY_AUTH_TOKEN", "")) < 32:
        sys.exit("fake ray: no token auth")
    temp_dir = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--temp-dir="))
    os.makedirs(temp_dir, exist_ok=True)
    helper = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    subprocess.run([sys.executable, "-c",
        f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {helper!r}], process_group=0)"])
    mode = os.environ.get("FAKE_RAY_MODE", "ok")
    crashes = os.environ.get("FAKE_RAY_CRASHES")  # a file: how many starts still crash (then "ok")
    if crashes:
        left = int(open(crashes).read())
        open(crashes, "w").write(str(left - 1))
        mode = "crash" if left > 0 else "ok"
    if mode == "crash":
        sys.exit("fake ray: ConnectionError: the GCS port is in use")
    if mode == "ok":
        time.sleep(float(os.environ.get("FAKE_RAY_DELAY", "0.3")))
        print("Ray runtime started.", flush=True)
    time.sleep(600)
    """
)


def make_fake_gym_venv(tmp_path: Path) -> Path:
    """A directory shaped like the Gym venv: bin/python, bin/gym (FakeGym), bin/ray (FakeRay), site-packages with
    nemo_gym/."""
    venv = tmp_path / "gym-venv"
    site = venv / "lib" / "python3.13" / "site-packages"
    (site / "nemo_gym").mkdir(parents=True)
    cfg = site / GYM_REL_CONFIG
    cfg.parent.mkdir(parents=True)
    cfg.write_text(  # the policy's model server, as vllm_model_for_training.yaml declares it
        "fake_env: {}\npolicy_model:\n  responses_api_models:\n    vllm_model:\n      base_url: ${policy_base_url}\n"
    )
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(sys.executable)
    gym = venv / "bin" / "gym"
    gym.write_text(f"#!{sys.executable}\n{FAKE_GYM}")
    gym.chmod(0o755)
    ray = venv / "bin" / "ray"
    ray.write_text(f"#!{sys.executable}\n{FAKE_RAY}")
    ray.chmod(0o755)
    return venv


def fake_spec(venv: Path, tmp_path: Path, **kw: Any) -> GymLaunchSpec:
    """A launch spec for the fake Gym venv (short timeouts, run dir under ``tmp_path``)."""
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
