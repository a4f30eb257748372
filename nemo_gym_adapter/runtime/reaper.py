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
   (:func:`sweep_run_dir`), logs to ``<run_dir>/reaper.log`` and exits. It exits with its Gym too: once the run dir
   has held a record and then held none for :data:`GRACE_S` (whoever stops what a record names removes the record,
   so no record left is no Gym left), it drops its registration and exits, within a few seconds of the Gym's stop --
   not at the end of the owner, which may be a process that outlives its Gym by hours (a test session, a notebook,
   a TaskRunner after a failed start). A Gym restart never leaves the run dir without a record for that long
   (``GymServers.restart`` removes the old record once the new launch has written its own). :func:`start_watchdog`
   starts a new watchdog for a run dir whose earlier one has exited. Cost: one small Python process (~25 MB) per
   trainer, while its Gym runs.
3. **The next launch's sweep** (:func:`sweep_orphans`), for a watchdog killed too (a whole-job kill): each watchdog
   registers its owner and run dirs in a node-local directory (``paths.node_state_dir()/owners``); the driver sweeps,
   before it starts anything, the run dirs of every registered owner that no longer runs, and leaves a live one's
   (another run on the node) alone.
"""

from __future__ import annotations

import hashlib
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
GRACE_S = 2.0  # a run dir without a record for this long (after it held one): its Gym is stopped, the watchdog exits
START_TOLERANCE_S = 0.05  # psutil's create_time is jiffies since boot: the same process reads the same value
# (owner, run dir) -> (pid, start time) of the watchdog this process started for it
_STARTED: dict[tuple[int, Path], tuple[int, float]] = {}
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
    the node's state directory for :func:`sweep_orphans`. One live watchdog per (owner, run dir) and process: a call
    while the one started earlier still runs does nothing; after it exited with its Gym (module docstring), a new
    one starts. Returns at once."""
    owner = owner_pid or os.getpid()
    run_dir = run_dir.resolve()
    with _LOCK:
        earlier = _STARTED.get((owner, run_dir))
        if earlier is not None and owner_alive(*earlier):
            return
        created = start_time(owner)
        if created is None:
            raise ValueError(f"watchdog for {run_dir}: owner pid {owner} does not run")
        run_dir.mkdir(parents=True, exist_ok=True)
        _register(owner, created, run_dir)
        env = dict(os.environ)
        repo = str(paths.REPO_ROOT)  # this package importable from anywhere
        env["PYTHONPATH"] = os.pathsep.join(p for p in [repo, env.get("PYTHONPATH")] if p)
        # Records there already (the usual case: asked for right after recording a Gym): the watchdog counts them as
        # seen, so a stop before its first look still ends it.
        recorded = "recorded" if has_records(run_dir) else "empty"
        cmd = [sys.executable, "-m", "nemo_gym_adapter.runtime.reaper", str(owner), repr(created), str(run_dir)]
        cmd += [recorded, repr(POLL_S), repr(GRACE_S)]
        with open(run_dir / LOG_NAME, "ab") as log:
            # The child forks the watchdog, prints its pid and exits at once (waited for here): the watchdog's parent
            # is then init. The watchdog's own output goes to the log (it lets go of the pipe before anything else).
            done = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env, start_new_session=True,
                check=True,
            )  # fmt: skip
        pid = int(done.stdout.split()[-1])
        _STARTED[(owner, run_dir)] = (pid, start_time(pid) or 0.0)
    logger.info(
        "watchdog %d for pid %d started: it stops what %s records once that process is gone", pid, owner, run_dir
    )


def owner_alive(pid: int, created: float) -> bool:
    """True while ``pid`` is the process that started at ``created`` (a reused pid does not count; nor a zombie)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - created) < START_TOLERANCE_S and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def has_records(run_dir: Path) -> bool:
    """Does ``run_dir`` (its retry and restart subdirectories too) hold a pid record?"""
    return run_dir.is_dir() and next(run_dir.rglob(RECORD_GLOB), None) is not None


def watch(
    owner: int,
    created: float,
    run_dir: Path,
    poll_s: float = POLL_S,
    grace_s: float = GRACE_S,
    seen: bool = False,
) -> list[int] | None:
    """Block until the owner is gone, then sweep ``run_dir`` and drop the registration: the pids stopped. Or, once
    ``run_dir`` held a record (``seen``: it did when the watchdog was asked for) and then none for ``grace_s`` (its
    Gym was stopped), drop the registration: None."""
    empty_since = 0.0
    while owner_alive(owner, created):
        if has_records(run_dir):
            seen, empty_since = True, 0.0
        elif seen:
            empty_since = empty_since or time.monotonic()
            if time.monotonic() - empty_since >= grace_s:
                _entry(owner, created, run_dir).unlink(missing_ok=True)
                print(
                    f"{time.strftime('%H:%M:%S')} no record left in {run_dir}: its Gym is stopped; exiting", flush=True
                )
                return None
        time.sleep(poll_s)
    stopped = sweep_run_dir(run_dir, f"Gym (its trainer, pid {owner}, is gone)")
    _entry(owner, created, run_dir).unlink(missing_ok=True)
    print(f"{time.strftime('%H:%M:%S')} pid {owner} gone; stopped {len(stopped)} process(es): {stopped}", flush=True)
    return stopped


def main(argv: list[str]) -> int:
    owner, created, run_dir = int(argv[0]), float(argv[1]), Path(argv[2])
    seen = argv[3:4] == ["recorded"]
    poll_s, grace_s = (float(argv[4]), float(argv[5])) if len(argv) >= 6 else (POLL_S, GRACE_S)
    child = os.fork()
    if child > 0:  # start_watchdog() reads the watchdog's pid and returns; the watchdog is re-parented to init
        print(child, flush=True)
        os._exit(0)
    # Let go of start_watchdog()'s pipe at once (it reads until every writer is gone): output to the log from here.
    log = os.open(run_dir / LOG_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stdout)
    print(f"{time.strftime('%H:%M:%S')} watchdog {os.getpid()}: watching pid {owner} for {run_dir}", flush=True)
    watch(owner, created, run_dir, poll_s, grace_s, seen)
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


def _entry(owner: int, created: float, run_dir: Path) -> Path:
    """One entry per (owner, run dir): each watchdog removes its own, nobody rewrites another's."""
    digest = hashlib.sha256(str(run_dir).encode()).hexdigest()[:12]
    return paths.node_state_dir() / "owners" / f"{owner}-{created:.3f}-{digest}.json"


def _register(owner: int, created: float, run_dir: Path) -> None:
    """The node-local entry naming ``run_dir`` while ``owner`` runs (:func:`sweep_orphans` reads it)."""
    if _owners_dir() is None:
        return
    entry = _entry(owner, created, run_dir)
    entry.write_text(json.dumps({"owner": owner, "created": created, "run_dirs": [str(run_dir)]}))


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
