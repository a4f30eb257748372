"""Child-process lifecycle shared by every server we start (vLLM, NeMo Gym).

Rules this module enforces (see STYLE.md §8):
- each server runs in its own session (process group) with its own log file;
- readiness is polled with a timeout, and a server that dies or never answers raises ``ServerError``
  naming the server and quoting the tail of its log;
- cleanup is by pid, never by name: before signalling we snapshot the whole descendant tree (psutil),
  because some children (Ray helpers, uvicorn workers) start their own sessions and would escape a
  process-group kill;
- every live process is stopped on normal exit (atexit), on SIGTERM/SIGINT, and by the context manager;
- a launcher whose descendants re-parent themselves away (Ray agents) is a :class:`SessionProcess`: what is left in
  its session after the tree is stopped is killed too.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from nemo_gym_adapter.errors import ServerError
from nemo_gym_adapter.runtime.http_get import http_get

logger = logging.getLogger(__name__)

_LIVE: dict[int, ManagedProcess] = {}
_LIVE_LOCK = threading.Lock()
_HANDLERS_INSTALLED = False


def log_tail(path: Path | str, lines: int = 40) -> str:
    """Return the last ``lines`` lines of a log file ('' if missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def descendant_processes(pids: Iterable[int]) -> list:
    """Every live descendant of each of ``pids`` as ``psutil.Process`` objects (pid + start time, so a later kill or
    wait never reaches a process that only reuses the pid), best effort."""
    import psutil

    found = []
    for pid in pids:
        try:
            found.extend(psutil.Process(pid).children(recursive=True))
        except psutil.Error:
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Pids of every live descendant of ``pid`` (children first-level included), best effort."""
    return [p.pid for p in descendant_processes([pid])]


def kill_tree(pids: Iterable[int], timeout: float = 10.0) -> None:
    """SIGTERM every pid in ``pids``, wait up to ``timeout`` s, then SIGKILL whatever is left."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.Error:
            continue
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)


class ManagedProcess:
    """A server subprocess we own: started in its own session, logged to a file, stopped with its tree.

    Use as a context manager or call :meth:`stop`; either way it is also stopped at interpreter exit and
    on SIGTERM/SIGINT.
    """

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        log_path: Path | str,
        env: Mapping[str, str] | None = None,
        cwd: Path | str | None = None,
        stdin: int = subprocess.DEVNULL,
    ) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        _install_handlers()
        self._log = open(self.log_path, "ab")
        self._log.write(f"\n$ {' '.join(self.cmd)}\n".encode())
        self._log.flush()
        self.popen = subprocess.Popen(
            self.cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=stdin,  # subprocess.PIPE: a warm Gym launcher's command channel (gym.warm)
            env=dict(env) if env is not None else None,
            cwd=str(cwd) if cwd is not None else None,
            start_new_session=True,
        )
        self._known_descendants: set[int] = set()
        with _LIVE_LOCK:
            _LIVE[self.popen.pid] = self
        logger.info("started %s (pid %d), log: %s", name, self.popen.pid, self.log_path)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)

    def remember_descendants(self) -> None:
        """Record the current descendant pids, so they are stopped even if later re-parented to init."""
        self._known_descendants.update(descendants(self.pid))

    def fail(self, why: str) -> ServerError:
        """A ``ServerError`` naming this server, with the log tail."""
        return ServerError(f"{self.name}: {why}\n--- last lines of {self.log_path} ---\n{self.tail()}")

    def wait_http_ready(
        self,
        url: str,
        timeout: float,
        ok_statuses: tuple[int, ...] = (200,),
        interval: float = 0.5,
        headers: Mapping[str, str] | None = None,
    ) -> float:
        """Poll ``url`` (sending ``headers``, e.g. a rollout key) until it answers one of ``ok_statuses``; return
        seconds waited.

        Raises ``ServerError`` (with the log tail) if the process exits or ``timeout`` passes.
        """
        t0 = time.monotonic()
        last = "no answer yet"
        while True:
            if not self.alive():
                raise self.fail(f"exited with code {self.popen.returncode} before {url} answered")
            try:
                status, _ = http_get(url, headers, timeout=5, limit=0)
            except OSError as e:  # nothing answers in HTTP yet (a URLError is an OSError)
                last = str(e)
            else:
                if status in ok_statuses:
                    self.remember_descendants()
                    return time.monotonic() - t0
                last = f"HTTP {status}"
            if time.monotonic() - t0 > timeout:
                raise self.fail(f"not ready after {timeout:.0f}s at {url} (last: {last})")
            time.sleep(interval)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the process and every descendant (SIGTERM, then SIGKILL after ``timeout``). Idempotent."""
        with _LIVE_LOCK:
            _LIVE.pop(self.popen.pid, None)
        pids = set(self._known_descendants)
        if self.alive():
            pids.update(descendants(self.pid))
            pids.add(self.pid)
            try:  # the whole session first: cheap and catches children psutil has not seen yet
                os.killpg(self.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
        kill_tree(pids, timeout=timeout)
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            self.popen.stdin.close()
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        if not self._log.closed:
            self._log.close()
        logger.info("stopped %s (pid %d)", self.name, self.pid)

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_all() -> None:
    """Stop every ManagedProcess still alive (used at exit and on signals)."""
    with _LIVE_LOCK:
        live = list(_LIVE.values())
    for proc in reversed(live):
        try:
            proc.stop()
        except Exception:  # cleanup must go on for the others
            logger.exception("failed to stop %s", proc.name)


def _on_signal(signum: int, frame: object) -> None:
    stop_all()
    # Re-deliver with the default action so the exit status says "killed by signal".
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_handlers() -> None:
    """Install atexit and SIGTERM/SIGINT handlers once (main thread only; Python allows no other)."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(stop_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)
        if previous in (signal.SIG_DFL, signal.default_int_handler, None):
            signal.signal(sig, _on_signal)
        else:
            # Someone (pytest, Ray, hydra) already handles it: chain, don't replace.
            def chained(signum: int, frame: object, _prev=previous) -> None:
                stop_all()
                if callable(_prev):
                    _prev(signum, frame)

            signal.signal(sig, chained)


def session_members(sid: int) -> list[int]:
    """Pids of live processes in session ``sid`` (our launcher's own session: only Gym's processes are in it)."""
    import psutil

    out = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == sid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except (OSError, psutil.Error):
            continue
    return out


class SessionProcess(ManagedProcess):
    """A ManagedProcess whose ``stop`` also kills whatever is left in its session (the Gym launcher, a Ray head).

    Also applies when ``procs.stop_all`` runs it at exit or on SIGTERM. Ray's agents outlive the raylet as orphans
    that ignore SIGTERM; only the session id still ties them to us.
    """

    stop_timeout_s = 3.0

    def stop(self, timeout: float | None = None) -> None:
        timeout = self.stop_timeout_s if timeout is None else timeout
        self.remember_descendants()
        sid = self.pid  # start_new_session: the launcher leads a session whose id is its pid
        before = set(session_members(sid))
        super().stop(timeout=timeout)
        leftovers = set(session_members(sid)) | {p for p in before if alive(p)}
        if leftovers:  # typically Ray's agents, which ignore SIGTERM: no longer grace than the tree had
            kill_tree(leftovers, timeout=min(2.0, timeout))


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie does not count)."""
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class LogWatch:
    """Wake up when a log file gets one of ``markers`` appended (e.g. a server announcing itself), not on a fixed
    cadence. Reads only the bytes appended since the last look (a ``stat`` every 20 ms while waiting)."""

    def __init__(self, path: Path, markers: Sequence[bytes]) -> None:
        self.path = path
        self.markers = tuple(markers)
        self.offset = 0
        self._carry = b""

    def wait(self, timeout: float) -> bool:
        """True as soon as a marker is appended (or was, since the last call); False after ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while True:
            if self._marker_appended():
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)

    def _marker_appended(self) -> bool:
        try:
            size = self.path.stat().st_size
            if size <= self.offset:
                return False
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read(size - self.offset)
        except OSError:
            return False
        self.offset += len(chunk)
        text, self._carry = self._carry + chunk, chunk[-64:]  # a marker split across two reads is still seen
        return any(marker in text for marker in self.markers)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on ``host`` (the OS picks it)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class _Stoppable(Protocol):
    def stop(self) -> None: ...


S = TypeVar("S", bound=_Stoppable)


class EarlySlot(Generic[S]):
    """One server started early in this process (a task runner, before verl's workers) for an owner created later
    (the rollout manager) to claim; what is replaced or never claimed is stopped. Gym's Ray head
    (``early.early_gym_servers``) and the warm Gym launcher (``gym.warm``) each have one."""

    def __init__(self) -> None:
        self._parked: S | None = None
        self._lock = threading.Lock()

    def park(self, server: S | None) -> None:
        """Keep ``server`` for :meth:`claim`; a different one parked before is stopped."""
        with self._lock:
            previous, self._parked = self._parked, server
        if previous is not None and previous is not server:
            previous.stop()

    def drop(self, server: S | None) -> None:
        """Stop ``server`` if it is still parked (nobody claimed it: start-up failed before the owner existed)."""
        with self._lock:
            unclaimed = self._parked if server is not None and self._parked is server else None
            if unclaimed is not None:
                self._parked = None
        if unclaimed is not None:
            unclaimed.stop()

    def claim(self) -> S | None:
        """The parked server, now the caller's to stop, or None."""
        with self._lock:
            server, self._parked = self._parked, None
        return server

    def peek(self) -> S | None:
        """The parked server, left parked (tests)."""
        return self._parked
