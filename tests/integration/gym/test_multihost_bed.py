"""The multi-host bed's own lifecycle: built by ``scripts/multihost_bed.py``, gone after SIGTERM or a failed start.

Ray nodes only (no vLLM, no Gym): seconds. What the bed hosts is tested in ``test_multihost.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from nemo_gym_adapter.runtime.procs import alive as _alive

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "multihost_bed.py"


def _netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def _links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


def test_script_up_then_sigterm_leaves_nothing_on_any_host(tmp_path):
    log = tmp_path / "bed.err"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, str(SCRIPT), "up", "--hosts", "3"], stdout=subprocess.PIPE, stderr=err, text=True
        )
    try:
        up = json.loads(proc.stdout.readline() or "{}")
        assert up.get("ray_address"), log.read_text()[-3000:]
        namespaces = [h["netns"] for h in up["hosts"] if h["netns"]]
        if up["mode"] == "netns":
            assert [h["address"] for h in up["hosts"]] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
            assert all(ns in _netns() for ns in namespaces)
        pids = [p for host_pids in up["pids"].values() for p in host_pids]
        assert all(up["pids"].values()) and all(psutil.pid_exists(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        down = json.loads(proc.stdout.readline() or "{}")
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert down["leftovers"] == {"pids": {}, "namespaces": [], "links": []}
    assert not [p for p in pids if _alive(p)]
    assert not [ns for ns in namespaces if ns in _netns()]
    tag = f"ngv{proc.pid}"
    assert tag not in _links()
    print(f"bed up {up['setup_s']:.1f}s (network {up['network_s']:.2f}s), down {down['teardown_s']:.1f}s")


# The slow tier (CI budget; docs/CI.md): the bed's SIGTERM case above stops the same namespaces, hosts and processes;
# this one proves the reaper for an owner that could not stop anything itself (SIGKILL).
@pytest.mark.slow
def test_owner_killed_outright_its_reaper_leaves_nothing_on_any_host(tmp_path):
    """SIGKILL (or a SIGTERM that aborts inside Ray once ``ray.init`` replaced the handlers): no close() runs."""
    with open(tmp_path / "bed.err", "wb") as err:
        proc = subprocess.Popen([sys.executable, str(SCRIPT), "up", "--hosts", "3"], stdout=subprocess.PIPE, stderr=err)
    try:
        up = json.loads(proc.stdout.readline() or b"{}")
        assert up.get("ray_address"), (tmp_path / "bed.err").read_text()[-3000:]
    finally:
        proc.kill()
        proc.wait(timeout=30)
    pids = [p for host_pids in up["pids"].values() for p in host_pids]
    namespaces = [h["netns"] for h in up["hosts"] if h["netns"]]
    reaper_log = Path(up["run_dir"]) / "reaper.log"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and "died without closing its bed" not in reaper_log.read_text():
        time.sleep(0.5)
    assert not [p for p in pids if _alive(p)]
    assert not [n for n in namespaces if n in _netns()] and f"ngv{proc.pid}" not in _links()


def test_failed_start_tears_down_what_it_built():
    from nemo_gym_adapter.errors import ServerError
    from tests.support.multihost import MultiHostBed

    bed = MultiHostBed(hosts=2, num_cpus=-1)  # `ray start` refuses a negative CPU count: the head never comes up
    with pytest.raises(ServerError, match="Ray node on"):
        bed.start()
    assert not bed.leftovers
    assert f"ngv{os.getpid()}" not in _netns() + _links()
    assert all(not p.alive() for _, p in bed._procs)
