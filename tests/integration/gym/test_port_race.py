"""A real NeMo Gym whose server loses its port at start-up (the race ``nemo_gym_adapter.gym.ports`` describes):
Gym is relaunched with new ports and starts; nothing of the failed launch is left.

The collision is made, not waited for: a thread binds the port Gym gave a server the moment Gym's head lists it
(the server is spawned and still importing), so the server's own bind fails with "address already in use" exactly as
it did when a Ray worker took the port.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request

import pytest

from nemo_gym_adapter.gym.ports import RAY_CLI_WORKER_PORTS
from nemo_gym_adapter.gym.servers import GymServers
from nemo_gym_adapter.runtime.procs import free_port
from tests.integration.gym.test_lifecycle import NO_MODEL_WAIT, START_TIMEOUT_S, PidRecorder, _cmdlines
from tests.support.gym_fixtures import SINGLE_TOOL_CALL_AGENT, single_tool_call_spec
from tests.support.pids import alive_pids, wait_gone

# The slow tier (CI budget; docs/CI.md): 43 s of a fresh clone's CI. The relaunch on new ports is the unit tier's on
# the fake Gym (tests/unit/gym/test_servers.py::test_a_lost_port_relaunches_gym_on_new_ports_and_says_which, and the
# port lost every time); every default-tier Gym start runs the same launcher.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


class PortSquatter:
    """Binds (once) the port Gym's head lists for ``server``, as soon as it lists it; holds it until exit."""

    def __init__(self, head_port: int, server: str) -> None:
        self.url, self.server = f"http://127.0.0.1:{head_port}/server_instances", server
        self.sock: socket.socket | None = None
        self.port: int | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.sock is None and not self._done.is_set() and time.monotonic() < deadline:
            try:
                instances = json.loads(urllib.request.urlopen(self.url, timeout=1).read())
            except (OSError, ValueError):
                time.sleep(0.02)
                continue
            for inst in instances:
                if inst["process_name"] == self.server:
                    sock = socket.socket()
                    sock.bind((inst["host"], inst["port"]))
                    sock.listen()
                    self.sock, self.port = sock, inst["port"]
            time.sleep(0.02)

    def __enter__(self) -> PortSquatter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        if self.sock is not None:
            self.sock.close()


def test_a_server_that_loses_its_port_is_relaunched_on_new_ports_and_gym_starts(tmp_path, caplog):
    head_port = free_port()  # pinned, so the squatter knows where to ask (a lost server port is retried anyway)
    run_dir = tmp_path / "run"
    spec = single_tool_call_spec(
        [f"127.0.0.1:{free_port()}"],
        "m",
        run_dir=run_dir,
        head_port=head_port,
        startup_timeout_s=START_TIMEOUT_S,
        config_overrides=NO_MODEL_WAIT,
    )
    t0 = time.monotonic()
    with caplog.at_level("WARNING"), PidRecorder() as rec, PortSquatter(head_port, SINGLE_TOOL_CALL_AGENT) as squat:
        with GymServers.start(spec) as gym:
            started_s = time.monotonic() - t0
            assert squat.port is not None  # the first launch really lost that port
            assert gym.server_instances()[SINGLE_TOOL_CALL_AGENT].url.rsplit(":", 1)[1] != str(squat.port)
            assert f"{SINGLE_TOOL_CALL_AGENT} lost port {squat.port}" in caplog.text
            assert (
                f"error while attempting to bind on address ('127.0.0.1', {squat.port})"
                in (run_dir / "gym.log").read_text()
            )
            assert gym.log_path == run_dir / "port_retry1" / "gym.log" and gym.run_dir == run_dir
            low, high = gym.global_config()["port_range_low"], gym.global_config()["port_range_high"]
            assert high < RAY_CLI_WORKER_PORTS[0] or low > RAY_CLI_WORKER_PORTS[1]  # never Ray's worker band
            assert low <= squat.port <= high
    assert wait_gone(rec.seen, 15.0) == [], _cmdlines(alive_pids(rec.seen))
    print(f"Gym started after a lost port in {started_s:.0f}s (two launches)")
