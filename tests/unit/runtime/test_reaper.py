"""nemo_gym_adapter.runtime.reaper: what a trainer recorded is stopped once it is gone, however it died -- by its watchdog
(a process outside its tree), or by the next launch's sweep of the node's registry -- and never a process that
only reuses a recorded pid or session id."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from nemo_gym_adapter.runtime import reaper
from nemo_gym_adapter.runtime.reaper import sweep_orphans, sweep_pid_record, write_pid_record
from tests.support.pids import alive_pids, wait_gone

# A "trainer": starts a "Gym" (a session leader whose child is re-parented to init once the leader is killed, as
# Ray's child killing leaves Gym's servers), records it, starts its watchdog, reports, and waits to be killed.
OWNER = textwrap.dedent(
    """
    import subprocess, sys, time
    from pathlib import Path
    from nemo_gym_adapter.runtime import reaper
    run_dir = Path(sys.argv[1])
    gym = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 300"], start_new_session=True)
    time.sleep(0.3)
    (run_dir / "port_retry1").mkdir(parents=True)
    reaper.write_pid_record(run_dir / "port_retry1" / "gym.pid", [gym.pid])  # a record in a subdirectory too
    reaper.start_watchdog(run_dir)
    reaper.start_watchdog(run_dir)  # once per run dir
    print(gym.pid, flush=True)
    time.sleep(300)
    """
)


def _watchdogs(run_dir: Path) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if p.info["cmdline"]
        and "nemo_gym_adapter.runtime.reaper" in p.info["cmdline"]
        and str(run_dir) in p.info["cmdline"]
    ]


def test_a_sigkilled_owners_records_are_swept_by_its_watchdog_which_then_exits(tmp_path):
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        leader = int(owner.stdout.readline())
        gym = [leader, *(c.pid for c in psutil.Process(leader).children(recursive=True))]
        watchdogs = _watchdogs(tmp_path)
        assert len(gym) == 3 and alive_pids(gym) == gym and len(watchdogs) == 1
        assert psutil.Process(watchdogs[0]).ppid() != owner.pid  # outside the owner's tree
        assert len(list((Path(os.environ["NGV_STATE_DIR"]) / "owners").glob(f"{owner.pid}-*.json"))) == 1
        os.kill(leader, signal.SIGKILL)  # as Ray does to a worker's direct children: the leader's child survives it
        assert wait_gone([leader], 5.0) == [] and len(alive_pids(gym)) == 2
        owner.kill()
        owner.wait()
        assert wait_gone(gym, 15.0) == []
        assert wait_gone(watchdogs, 15.0) == []
        assert not (tmp_path / "port_retry1" / "gym.pid").exists()
        log = (tmp_path / "reaper.log").read_text()
        assert f"pid {owner.pid} gone; stopped 2 process(es): {sorted(gym[1:])}" in log, log
        assert not list((Path(os.environ["NGV_STATE_DIR"]) / "owners").glob(f"{owner.pid}-*.json"))
    finally:
        if owner.poll() is None:
            owner.kill()


# A long-lived "trainer" driven line by line on stdin: ``start`` a "Gym" (a session leader), record it and ask for its
# watchdog; ``restart`` (a new Gym and record, the old record removed last, as GymServers.restart does); ``stop`` (the
# Gym stopped, its record removed, as GymServers.stop does). Answers each command with the Gym's pid and the
# watchdogs it started; lives on after its Gym is gone.
LONG_LIVED_OWNER = textwrap.dedent(
    """
    import json, subprocess, sys
    from pathlib import Path
    from nemo_gym_adapter.runtime import reaper
    reaper.POLL_S, reaper.GRACE_S = 0.2, 0.6  # the watchdogs it starts look more often (the unit tier's time)
    run_dir, gym = Path(sys.argv[1]), None
    for line in sys.stdin:
        command = line.strip()
        if command in ("start", "restart"):
            old = gym
            gym = subprocess.Popen(["sleep", "300"], start_new_session=True)
            record = run_dir / ("restart1" if command == "restart" else "") / "gym.pid"
            record.parent.mkdir(parents=True, exist_ok=True)
            reaper.write_pid_record(record, [gym.pid])
            if command == "restart":
                old.kill(); old.wait()
                (run_dir / "gym.pid").unlink()
            reaper.start_watchdog(run_dir)
        elif command == "stop":
            gym.kill(); gym.wait()
            for record in run_dir.rglob("*.pid"):
                record.unlink()
        started = [pid for pid, _ in reaper._STARTED.values()]
        print(json.dumps({"gym": gym.pid, "watchdogs": started}), flush=True)
    """
)


POLL_S, GRACE_S = 0.2, 0.6  # LONG_LIVED_OWNER's
EXIT_WITHIN_S = 10.0  # "a few seconds" after its Gym stopped, with room for a loaded machine


def _ask(owner: subprocess.Popen, command: str) -> dict:
    owner.stdin.write(command + "\n")
    owner.stdin.flush()
    return json.loads(owner.stdout.readline())


def test_the_watchdog_exits_with_its_gym_while_its_owner_lives_on_and_a_new_gym_gets_a_new_one(tmp_path):
    owner = subprocess.Popen(
        [sys.executable, "-c", LONG_LIVED_OWNER, str(tmp_path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    registry = Path(os.environ["NGV_STATE_DIR"]) / "owners"
    try:
        first = _ask(owner, "start")
        [watchdog] = first["watchdogs"]
        assert _watchdogs(tmp_path) == [watchdog] and len(list(registry.glob(f"{owner.pid}-*.json"))) == 1
        # The control: while the Gym runs the watchdog stays -- also across a restart, whose old record goes only
        # once the new one is written.
        restarted = _ask(owner, "restart")
        assert restarted["watchdogs"] == [watchdog]
        assert wait_gone([watchdog], GRACE_S + 3 * POLL_S) == [watchdog]
        # Its Gym stopped: the watchdog goes within a few seconds, while the owner lives on.
        _ask(owner, "stop")
        assert wait_gone([watchdog], EXIT_WITHIN_S) == []
        assert owner.poll() is None and alive_pids([restarted["gym"]]) == []
        assert "its Gym is stopped" in (tmp_path / "reaper.log").read_text()
        assert not list(registry.glob(f"{owner.pid}-*.json"))
        # A new Gym in the same run dir: a new watchdog; stopped before the watchdog's first look, it goes too (the
        # record it was asked for counts as seen).
        brief = _ask(owner, "start")
        [brief_watchdog] = set(brief["watchdogs"]) - {watchdog}
        _ask(owner, "stop")
        assert wait_gone([brief_watchdog], EXIT_WITHIN_S) == []
        # And another, which does its job when the owner dies.
        again = _ask(owner, "start")
        [new_watchdog] = set(again["watchdogs"]) - {watchdog, brief_watchdog}
        assert _watchdogs(tmp_path) == [new_watchdog]
        owner.kill()
        owner.wait()
        assert wait_gone([again["gym"], new_watchdog], 15.0) == []
        assert f"pid {owner.pid} gone; stopped 1 process(es): [{again['gym']}]" in (tmp_path / "reaper.log").read_text()
    finally:
        if owner.poll() is None:
            owner.kill()


def test_after_a_clean_stop_the_watchdog_sweeps_nothing_and_exits(tmp_path):
    """The owner removed its records when it stopped what they named: nothing to do. A record elsewhere is not its."""
    other = tmp_path / "other"
    other.mkdir()
    keep = subprocess.Popen(["sleep", "60"], start_new_session=True)
    run_dir = tmp_path / "run"
    try:
        write_pid_record(other / "gym.pid", [keep.pid])
        code = f"from pathlib import Path; from nemo_gym_adapter.runtime import reaper; reaper.start_watchdog(Path({str(run_dir)!r}))"
        subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
        deadline = time.monotonic() + 15
        while "stopped 0 process(es)" not in (run_dir / "reaper.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "stopped 0 process(es)" in (run_dir / "reaper.log").read_text()
        assert alive_pids([keep.pid]) == [keep.pid] and (other / "gym.pid").exists()
    finally:
        keep.kill()


def test_the_next_launch_sweeps_what_a_dead_trainer_left_and_leaves_a_live_ones(tmp_path):
    """The watchdog died too (a whole-job kill): the driver's sweep at start-up reads the node's registry."""
    owners = Path(os.environ["NGV_STATE_DIR"]) / "owners"
    owners.mkdir(parents=True, exist_ok=True)
    dead, live = tmp_path / "dead", tmp_path / "live"
    procs = {}
    for run_dir in (dead, live):
        run_dir.mkdir()
        procs[run_dir] = subprocess.Popen(["sleep", "60"], start_new_session=True)
        write_pid_record(run_dir / "gym_ray.pid", [procs[run_dir].pid])
    me = psutil.Process()
    (owners / "1-1.000.json").write_text(json.dumps({"owner": 1, "created": 1.0, "run_dirs": [str(dead)]}))
    (owners / "me.json").write_text(json.dumps({"owner": me.pid, "created": me.create_time(), "run_dirs": [str(live)]}))
    (owners / "junk.json").write_text("{")
    try:
        assert sweep_orphans() == [procs[dead].pid]
        assert wait_gone([procs[dead].pid], 5.0) == [] and alive_pids([procs[live].pid]) == [procs[live].pid]
        assert sorted(p.name for p in owners.iterdir()) == ["me.json"]
    finally:
        for p in procs.values():
            p.kill()


def test_a_pid_or_session_reused_by_another_process_is_never_swept(tmp_path):
    """Records carry start times: a recorded pid (or session leader) whose number now belongs to a process started
    later is not the one recorded -- left alone; the same record with the true start time is swept."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        write_pid_record(tmp_path / "gym.pid", [proc.pid])
        record = json.loads((tmp_path / "gym.pid").read_text())
        assert record["sessions"] == [proc.pid] and set(record["started"]) == {str(proc.pid)}
        stale = {**record, "started": {str(proc.pid): record["started"][str(proc.pid)] - 3600}}  # "an hour earlier"
        (tmp_path / "stale.pid").write_text(json.dumps(stale))
        assert sweep_pid_record(tmp_path / "stale.pid", "Gym") == [] and alive_pids([proc.pid]) == [proc.pid]
        assert not (tmp_path / "stale.pid").exists()
        assert sweep_pid_record(tmp_path / "gym.pid", "Gym") == [proc.pid]
        assert wait_gone([proc.pid], 10.0) == []
    finally:
        proc.kill()


def test_start_watchdog_is_stubbed_in_the_unit_tier(tmp_path, watchdog_requests):
    """The unit tier's own process starts none (tests/unit/conftest.py); the subprocess owners above start real ones."""
    reaper.start_watchdog(tmp_path)
    assert watchdog_requests == [tmp_path] and _watchdogs(tmp_path) == []
