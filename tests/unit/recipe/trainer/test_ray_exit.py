"""The run's own Ray workers stop with it (``recipe.nemo_gym.trainer.ray_exit``): a worker hung in its exit is killed after
the grace, one that exits is left to exit, and only what lies below the given raylet pids is ever touched. The
"workers" here are plain child processes standing in for Ray's (fakes: no Ray is started)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from nemo_gym_adapter.runtime import procs
from recipe.nemo_gym.trainer import ray_exit

HUNG = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
EXITS = "import time; time.sleep(0.3)"


def _spawn(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_straggler_is_killed_after_the_grace_and_one_that_exits_is_not():
    hung, exits = _spawn(HUNG), _spawn(EXITS)
    try:
        procs = [psutil.Process(hung.pid), psutil.Process(exits.pid)]
        start = time.monotonic()
        killed = ray_exit.stop_stragglers(procs, grace_s=1.5)
        took = time.monotonic() - start
        assert [pid for pid, _ in killed] == [hung.pid]
        # psutil reaped both (so Popen cannot read their status): the hung one is gone, killed; the other ended itself
        assert not psutil.pid_exists(hung.pid) and not psutil.pid_exists(exits.pid)
        assert 1.4 < took < 8, took
    finally:
        for p in (hung, exits):
            if p.poll() is None:
                p.kill()


def test_nothing_to_wait_for_returns_at_once():
    start = time.monotonic()
    assert ray_exit.stop_stragglers([], grace_s=10) == []
    assert time.monotonic() - start < 1


def test_workers_are_the_descendants_of_the_given_pids_only():
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {HUNG!r}]); time.sleep(120)",
        ]
    )
    bystander = _spawn(HUNG)
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(parent.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)
        found = {p.pid for p in procs.descendant_processes([parent.pid])}
        grandchild = {p.pid for p in psutil.Process(parent.pid).children()}
        assert found == grandchild and len(found) == 1
        assert bystander.pid not in found and parent.pid not in found
        assert procs.descendant_processes([2**22 + 7]) == []  # no such pid: nothing, no error
    finally:
        for p in psutil.Process(parent.pid).children(recursive=True):
            p.kill()
        for p in (parent, bystander):
            p.kill()
            p.wait(timeout=5)


def test_without_a_local_raylet_nothing_is_noted(monkeypatch):
    import ray._private.worker as ray_worker

    monkeypatch.setattr(ray_worker, "_global_node", None, raising=False)
    assert ray_exit.local_raylet_pids() == []
