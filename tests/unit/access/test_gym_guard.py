"""The Gym side of the run's key (``nemo_gym_adapter.access.gym_guard``): which URLs get the key, the environment a
guarded Gym is launched with, the guard in its header mode on a real Starlette app, the launch check that every Gym
server refuses a keyless request, and -- in a subprocess of Gym's own interpreter (Python 3.13, Gym's starlette and
aiohttp, started the way Gym starts its servers: ``PYTHONPATH`` naming the boot directory) -- that ``sitecustomize``
guards a server app and adds the key to aiohttp requests to Gym's addresses only."""

from __future__ import annotations

import http.server
import json
import subprocess
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from nemo_gym_adapter.access import guard, gym_guard
from nemo_gym_adapter.errors import GymServerError
from nemo_gym_adapter.gym.launch import access_env, gym_env
from nemo_gym_adapter.runtime import paths

KEY = "gym-key-0123456789"


def test_the_key_goes_to_gyms_hosts_on_gyms_ports_only():
    where = gym_guard.Destinations(["127.0.0.1", "localhost", "::1", "10.0.0.5"], "20000-32767,11000")
    assert "http://127.0.0.1:20001/run" in where and "http://localhost:32767/" in where
    assert "http://[::1]:25000/" in where and "http://10.0.0.5:11000/global_config_dict_yaml" in where
    assert "http://127.0.0.1:8000/v1/chat/completions" not in where  # a local service outside Gym's band
    assert "https://api.openai.com/v1/responses" not in where and "http://10.0.0.6:20001/" not in where
    assert "not a url" not in where and "http://127.0.0.1:99999999/" not in where


def test_launch_env_names_the_boot_dir_and_never_an_empty_key():
    env = gym_guard.launch_env(KEY, "10.0.0.5", (20000, 32767), [11000])
    assert env == {
        gym_guard.KEY_ENV: KEY,
        gym_guard.HOSTS_ENV: "127.0.0.1,localhost,::1,10.0.0.5",
        gym_guard.PORTS_ENV: "20000-32767,11000",
        "PYTHONPATH": str(gym_guard.BOOT_DIR),
    }
    assert (gym_guard.BOOT_DIR / "sitecustomize.py").is_file()
    with pytest.raises(ValueError, match="must not be empty"):
        gym_guard.launch_env("", "127.0.0.1", (20000, 32767))


def test_gyms_environment_gets_the_boot_dir_first_and_only_with_a_key(tmp_path):
    guard_env = access_env(SecretStr(KEY), "127.0.0.1", (20000, 32767), head_port=11000)
    assert guard_env[gym_guard.PORTS_ENV] == "20000-32767,11000"  # a head pinned outside the band
    assert access_env(SecretStr(KEY), "127.0.0.1", (20000, 32767), 20500)[gym_guard.PORTS_ENV] == "20000-32767"
    assert access_env(None, "127.0.0.1", None, None) == {}
    base = {"PATH": "/usr/bin", "PYTHONPATH": "/trainer/only"}  # the trainer's own path never reaches Gym
    env = gym_env(tmp_path, {"PYTHONPATH": "/users/extra"}, SecretStr("EMPTY"), None, None, base, guard_env)
    assert env["PYTHONPATH"] == f"{gym_guard.BOOT_DIR}:/users/extra" and env[gym_guard.KEY_ENV] == KEY
    plain = gym_env(tmp_path, {}, SecretStr("EMPTY"), None, None, base)
    assert "PYTHONPATH" not in plain and gym_guard.KEY_ENV not in plain


def test_client_headers_follow_use_key():
    try:
        assert gym_guard.client_headers() == {}
        gym_guard.use_key(KEY)
        assert gym_guard.client_headers() == {"X-NGV-Run-Key": KEY}
    finally:
        gym_guard.use_key(None)
    assert gym_guard.client_headers() == {}


@pytest.fixture
def app_client() -> Iterator[TestClient]:
    async def endpoint(request):
        return JSONResponse({"ok": True})

    try:
        with TestClient(Starlette(routes=[Route("/run", endpoint, methods=["GET", "POST"])])) as c:
            yield c
    finally:
        guard.remove_guard()


def test_in_header_mode_only_the_gym_header_gets_in(app_client):
    guard.install_guard([KEY], header=gym_guard.HEADER)
    refused = app_client.post("/run")
    assert refused.status_code == 401 and "carries no x-ngv-run-key header" in refused.json()["error"]["message"]
    assert app_client.post("/run", headers={"Authorization": f"Bearer {KEY}"}).status_code == 401  # not Gym's way
    wrong = app_client.post("/run", headers={gym_guard.HEADER: KEY + "x"})
    assert wrong.status_code == 401 and "not this run's" in wrong.text and KEY[:8] not in wrong.text
    assert app_client.post("/run", headers={gym_guard.HEADER: KEY}).status_code == 200
    guard.install_guard([KEY])  # back to Bearer on the same process: the header mode is gone
    assert app_client.post("/run", headers={gym_guard.HEADER: KEY}).status_code == 401
    assert app_client.post("/run", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


class _Answer(http.server.BaseHTTPRequestHandler):
    status, body = 200, b"{}"

    def do_GET(self) -> None:  # noqa: N802  (http.server's name)
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(status: int, body: bytes) -> tuple[http.server.HTTPServer, str]:
    handler = type("Handler", (_Answer,), {"status": status, "body": body})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def test_the_launch_check_names_every_server_that_answers_without_the_key():
    _, refusal = guard.refusal({"type": "http", "headers": []})
    guarded, guarded_url = _serve(401, refusal)
    open_, open_url = _serve(200, b"{}")
    foreign, foreign_url = _serve(401, b"someone else's 401")
    try:
        gym_guard.check_guarded({"head server": guarded_url})
        with pytest.raises(GymServerError) as info:
            gym_guard.check_guarded({"head server": guarded_url, "agent": open_url, "judge": foreign_url})
        message = str(info.value)
        assert f"agent ({open_url}): HTTP 200 without the key" in message
        assert f"judge ({foreign_url}): HTTP 401" in message and "head server" not in message
    finally:
        for server in (guarded, open_, foreign):
            server.shutdown()


GYM_SIDE = textwrap.dedent(
    """
    import asyncio, http.server, json, sys, threading
    import aiohttp, requests
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    seen = {}

    class Record(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen[self.server.server_port] = self.headers.get("X-NGV-Run-Key")
            self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
        def log_message(self, *a):
            pass

    def serve(port):
        s = http.server.HTTPServer(("127.0.0.1", port), Record)
        threading.Thread(target=s.serve_forever, daemon=True).start()
        return s

    inside, outside = serve(int(sys.argv[1])), serve(0)

    async def calls():
        async with aiohttp.ClientSession() as session:
            for server in (inside, outside):
                async with session.get(f"http://127.0.0.1:{server.server_port}/") as r:
                    await r.read()

    asyncio.run(calls())

    async def endpoint(request):
        return JSONResponse({"ok": True})

    with TestClient(Starlette(routes=[Route("/run", endpoint)])) as client:
        statuses = [client.get("/run").status_code, client.get("/run", headers={"X-NGV-Run-Key": sys.argv[2]}).status_code]
    print(json.dumps({"booted": sys.modules["_ngv_gym_guard"].boot(), "inside": seen[inside.server_port],
                      "outside": seen[outside.server_port], "statuses": statuses}))
    """
)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_in_gyms_own_interpreter_sitecustomize_guards_servers_and_sends_the_key_to_gym_only(tmp_path):
    python = paths.gym_venv() / "bin" / "python"
    if not python.exists():
        pytest.skip(f"Gym's venv is not set up ({python}); scripts/setup_tests.sh makes it")
    port = _free_port()
    env = {"PATH": "/usr/bin:/bin", **gym_guard.launch_env(KEY, "127.0.0.1", (port, port))}
    script = tmp_path / "gym_side.py"
    script.write_text(GYM_SIDE)
    done = subprocess.run(
        [str(python), str(script), str(port), KEY], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["booted"] == ["starlette", "aiohttp", "requests"]  # all imported by then: patched at once
    assert result["inside"] == KEY and result["outside"] is None  # only Gym's band gets the key
    assert result["statuses"] == [401, 200]
    # lazily: an interpreter that imports none of the three loads none of them; one that does gets its patch
    lazy = subprocess.run(
        [
            str(python),
            "-c",
            "import sys; print([m for m in ('aiohttp', 'starlette', 'requests') if m in sys.modules]); "
            "import aiohttp, requests; "
            f"print(hasattr(aiohttp.ClientSession._request, {gym_guard.SENTINEL!r}), "
            f"hasattr(requests.Session.request, {gym_guard.SENTINEL!r}))",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lazy.returncode == 0 and lazy.stdout.split("\n")[:2] == ["[]", "True True"], (lazy.stdout, lazy.stderr)
    # the control: the same interpreter without the key's environment guards nothing
    bare = subprocess.run(
        [str(python), "-c", "import starlette.applications as a; print(a.Starlette.__call__.__qualname__)"],
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(gym_guard.BOOT_DIR)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bare.returncode == 0 and bare.stdout.strip() == "Starlette.__call__", bare.stderr[-500:]


def test_a_boot_failure_stops_the_interpreter_instead_of_serving_unguarded(tmp_path):
    python = paths.gym_venv() / "bin" / "python"
    if not python.exists():
        pytest.skip(f"Gym's venv is not set up ({python})")
    env = {"PATH": "/usr/bin:/bin", **gym_guard.launch_env(KEY, "127.0.0.1", (20000, 20001))}
    env[gym_guard.PORTS_ENV] = "not-a-port"
    done = subprocess.run([str(python), "-c", "print('served')"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 78 and "served" not in done.stdout
    assert "Gym access guard could not be installed" in done.stderr and KEY not in done.stderr


def test_the_boot_dir_holds_nothing_that_could_shadow_a_gym_module():
    names = {p.name for p in Path(gym_guard.BOOT_DIR).iterdir() if p.name != "__pycache__"}
    assert names == {"sitecustomize.py", "__init__.py"}
