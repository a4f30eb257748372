"""Nothing a trainer started outlives it, however it died: pid records, a watchdog, and the next launch's sweep.

Why: Gym's launcher, its Ray head and the warm launcher are started by the TaskRunner (a Ray worker), each leading
a session of its own. When the driver is SIGKILLed (or OOM-killed) its Ray cluster dies with it, and the TaskRunner,
finding its raylet gone, SIGKILLs its *direct* children before it exits (Ray's ``kill_child_processes_on_worker_exit``,
default on, not recursive): the launchers die, their children do not. Measured on the CPU demo (SIGKILL of the
driver in step 3): Gym's agent, resources server and model proxy with their bash wrappers and tees were still
running after the relaunch ended, re-parented to init, holding their ports. No cleanup code of the dead process runs.

Three pieces, none matching processes by name:

1. **Pid records** (:func:`write_pid_record`, :func:`sweep_pid_record`): ``<run_dir>/*.pid`` name what we started --
   the pids, their sessions (a launcher leads its own, whose id still finds its processes once they are re-parented)
   and each pid's start time, so a pid or session id reused by an unrelated process after a wrap-around is never
   taken for ours. Whoever stops what a record names removes the record.
2. **A watchdog** (:func:`start_watchdog`): ``python -m nemo_gym_adapter.runtime.reaper <owner pid> <start time> <run dir>``,
   which forks and exits at once, so the watchdog is re-parented to init -- out of reach of Ray's child killing and
   of the owner's own death. It polls the owner (pid + start time, once a second; no pipe: a fork of the owner would
   hold its write end open) and, once the owner is gone, sweeps every record under the run dir
   (:func:`sweep_run_dir`), logs to ``<run_dir>/reaper.log`` and exits. After a clean shutdown the records are gone
   and it sweeps nothing. Cost: one small Python process (~25 MB) per trainer.
3. **The next launch's sweep** (:func:`sweep_orphans`), for a watchdog killed too (a whole-job kill): each watchdog
   registers its owner and run dirs in a node-local directory (``paths.node_state_dir()/owners``); the driver sweeps,
   before it starts anything, the run dirs of every registered owner that no longer runs, and leaves a live one's
   (another run on the node) alone.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from nemo_gym_adapter.runtime import paths
from nemo_gym_adapter.runtime.procs import alive, kill_tree, session_members

logger = logging.getLogger(__name__)

RECORD_GLOB = "*.pid"  # every pid record under a run dir (gym.pid, gym_ray.pid, gym_warm.pid, port_retry*/...)
LOG_NAME = "reaper.log"
POLL_S = 1.0
START_TOLERANCE_S = 0.05  # psutil's create_time is jiffies since boot: the same process reads the same value
_STARTED: set[tuple[int, Path]] = set()  # (owner, run dir) watched by a watchdog this process started
_LOCK = threading.Lock()


# ------------------------------------------------------------------------------------------------ pid records


def start_time(pid: int) -> float | None:
    """``pid``'s start time (seconds since the epoch, psutil), None when it does not run."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def write_pid_record(path: Path, pids: Iterable[int]) -> None:
    """A record of processes we own, for a sweep by another process if ours is killed outright
    (:func:`sweep_pid_record`): the pids, their start times and session ids, and our pid."""
    pids = sorted(pids)
    sessions, started = set(), {}
    for pid in pids:
        t = start_time(pid)
        try:
            sessions.add(os.getsid(pid))
        except OSError:
            continue
        if t is not None:
            started[str(pid)] = t
    record = {"sessions": sorted(sessions), "pids": pids, "started": started, "owner_pid": os.getpid()}
    path.write_text(json.dumps(record) + "\n")


def _same_process(pid: int, started: float | None) -> bool:
    """True while ``pid`` is the recorded process (no start time recorded: any process with that pid)."""
    now = start_time(pid)
    return now is not None and (started is None or abs(now - started) < START_TOLERANCE_S)


def recorded_leftovers(record: dict) -> set[int]:
    """The live processes a record still names: every member of each recorded session whose leader was not replaced
    by an unrelated process, and each recorded pid that is still the recorded process, in one of those sessions."""
    started = {int(p): float(t) for p, t in record.get("started", {}).items()}
    sessions = set()
    for sid in (int(s) for s in record.get("sessions", [])):
        leader_now = start_time(sid)
        if sid in started and leader_now is not None and not _same_process(sid, started[sid]):
            continue  # the leader's pid belongs to another process now: this session id is not ours any more
        sessions.add(sid)
    since = min(started.values(), default=0.0) - START_TOLERANCE_S
    leftovers: set[int] = set()
    for sid in sessions:
        leftovers.update(p for p in session_members(sid) if (start_time(p) or 0.0) >= since)
    for pid in (int(p) for p in record.get("pids", [])):
        try:
            ours = os.getsid(pid) in sessions and alive(pid) and _same_process(pid, started.get(pid))
        except OSError:
            continue
        if ours:
            leftovers.add(pid)
    return leftovers


def sweep_pid_record(path: Path, what: str) -> list[int]:
    """Stop what a :func:`write_pid_record` record still names (:func:`recorded_leftovers`), remove the record,
    return the pids stopped."""
    if not path.is_file():
        return []
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        logger.warning("unreadable %s pid file %s; nothing swept", what, path)
        return []
    leftovers = recorded_leftovers(record) if isinstance(record, dict) else set()
    if leftovers:
        logger.warning(
            "stopping %d %s process(es) left behind (%s): %s", len(leftovers), what, path.name, sorted(leftovers)
        )
        kill_tree(sorted(leftovers), timeout=5.0)
    path.unlink(missing_ok=True)
    return sorted(leftovers)


def sweep_run_dir(run_dir: Path, what: str = "Gym") -> list[int]:
    """:func:`sweep_pid_record` over every record under ``run_dir`` (retry and restart subdirectories too)."""
    if not run_dir.is_dir():
        return []
    return sorted(p for path in sorted(run_dir.rglob(RECORD_GLOB)) for p in sweep_pid_record(path, what))


# ------------------------------------------------------------------------------------------------ the watchdog


def start_watchdog(run_dir: Path, owner_pid: int | None = None) -> None:
    """Have a watchdog sweep ``run_dir``'s records once this process (``owner_pid``) is gone, and register both in
    the node's state directory for :func:`sweep_orphans`. Once per (owner, run dir) and process; returns at once."""
    owner = owner_pid or os.getpid()
    run_dir = run_dir.resolve()
    with _LOCK:
        if (owner, run_dir) in _STARTED:
            return
        _STARTED.add((owner, run_dir))
    created = start_time(owner)
    if created is None:
        raise ValueError(f"watchdog for {run_dir}: owner pid {owner} does not run")
    run_dir.mkdir(parents=True, exist_ok=True)
    _register(owner, created, run_dir)
    env = dict(os.environ)
    repo = str(paths.REPO_ROOT)  # this package importable from anywhere
    env["PYTHONPATH"] = os.pathsep.join(p for p in [repo, env.get("PYTHONPATH")] if p)
    cmd = [sys.executable, "-m", "nemo_gym_adapter.runtime.reaper", str(owner), repr(created), str(run_dir)]
    with open(run_dir / LOG_NAME, "ab") as log:
        # The child forks the watchdog and exits at once (waited for here): the watchdog's parent is then init.
        subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, start_new_session=True, check=True
        )
    logger.info("watchdog for pid %d started: it stops what %s records once that process is gone", owner, run_dir)


def owner_alive(pid: int, created: float) -> bool:
    """True while ``pid`` is the process that started at ``created`` (a reused pid does not count; nor a zombie)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - created) < START_TOLERANCE_S and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watch(owner: int, created: float, run_dir: Path, poll_s: float = POLL_S) -> list[int]:
    """Block until the owner is gone, then sweep ``run_dir`` and drop the owner's registration; the pids stopped."""
    while owner_alive(owner, created):
        time.sleep(poll_s)
    stopped = sweep_run_dir(run_dir, f"Gym (its trainer, pid {owner}, is gone)")
    _entry(owner, created).unlink(missing_ok=True)
    print(f"{time.strftime('%H:%M:%S')} pid {owner} gone; stopped {len(stopped)} process(es): {stopped}", flush=True)
    return stopped


def main(argv: list[str]) -> int:
    owner, created, run_dir = int(argv[0]), float(argv[1]), Path(argv[2])
    if os.fork() > 0:  # the parent returns to start_watchdog() at once; the watchdog is re-parented to init
        os._exit(0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    print(f"{time.strftime('%H:%M:%S')} watchdog {os.getpid()}: watching pid {owner} for {run_dir}", flush=True)
    watch(owner, created, run_dir)
    return 0


# ------------------------------------------------------------------------------------------------ the node's registry


def _owners_dir() -> Path | None:
    """``<node state dir>/owners``, private to this user; None (with a warning) when it cannot be."""
    owners = paths.node_state_dir() / "owners"
    try:
        owners.mkdir(parents=True, exist_ok=True, mode=0o700)
        if owners.stat().st_uid != os.getuid():
            raise PermissionError(f"{owners} belongs to another user")
    except OSError as e:
        logger.warning("no node-local registry of trainers (%s); set NGV_STATE_DIR", e)
        return None
    return owners


def _entry(owner: int, created: float) -> Path:
    return paths.node_state_dir() / "owners" / f"{owner}-{created:.3f}.json"


def _register(owner: int, created: float, run_dir: Path) -> None:
    """The node-local entry naming ``run_dir`` while ``owner`` runs (:func:`sweep_orphans` reads it)."""
    if _owners_dir() is None:
        return
    entry = _entry(owner, created)
    try:
        dirs = set(json.loads(entry.read_text())["run_dirs"]) if entry.exists() else set()
    except (OSError, ValueError, KeyError):
        dirs = set()
    entry.write_text(json.dumps({"owner": owner, "created": created, "run_dirs": sorted(dirs | {str(run_dir)})}))


def sweep_orphans() -> list[int]:
    """Before a launch starts anything: stop what every registered trainer that no longer runs left on this node
    (its watchdog gone too) and drop its entry; a live trainer's entry is left alone. The pids stopped."""
    owners = _owners_dir()
    if owners is None:
        return []
    stopped: list[int] = []
    for entry in sorted(owners.glob("*.json")):
        try:
            record = json.loads(entry.read_text())
            owner, created, run_dirs = int(record["owner"]), float(record["created"]), list(record["run_dirs"])
        except (OSError, ValueError, KeyError, TypeError):
            logger.warning("unreadable trainer registration %s; removed", entry)
            entry.unlink(missing_ok=True)
            continue
        if owner_alive(owner, created):
            continue
        for run_dir in run_dirs:
            stopped += sweep_run_dir(Path(run_dir), f"Gym of a trainer that is gone (pid {owner})")
        entry.unlink(missing_ok=True)
    return sorted(stopped)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
