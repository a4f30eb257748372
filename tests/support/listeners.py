"""Who listens where, and what answers a stranger: the TCP listening sockets of given processes, for the tests that
check a run exposes nothing beyond what docs/CLUSTER.md lists.

:func:`listeners` reads them with ``ss -ltnp`` (in a network namespace with ``ip netns exec``), :func:`listeners_of`
with psutil (the sockets each pid holds); both return one :class:`Listener` per (socket, owning pid); :func:`scope`
tells loopback, one address (the node's) and every interface apart; :func:`table` prints them for a test's log.
:func:`knock` sends each listener a few HTTP requests without any key (:data:`KNOCKS`) and keeps what came back
(:class:`Knock`: a status, or no HTTP answer at all -- gRPC, ZMQ and other binary protocols); :class:`TreeListeners`
takes both for a whole process tree (a recipe run, a ``collect``) once its log shows a trigger.
"""

from __future__ import annotations

import http.client
import ipaddress
import os
import re
import subprocess
import threading
import time
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

_USER = re.compile(r'\("([^"]*)",pid=(\d+),fd=\d+\)')


@dataclass(frozen=True)
class Listener:
    """One listening socket: its local ``host`` (``*``, ``0.0.0.0``, ``[::]``, an address) and port, the pid that
    holds it and that process's command line (short)."""

    host: str
    port: int
    pid: int
    process: str

    @property
    def scope(self) -> str:
        return scope(self.host)


def scope(host: str) -> str:
    """``loopback``, ``any`` (every interface) or ``address`` (one non-loopback address)."""
    host = host.strip("[]")
    if host.startswith("::ffff:"):
        host = host.removeprefix("::ffff:")
    if host in ("*", "0.0.0.0", "::"):
        return "any"
    try:
        return "loopback" if ipaddress.ip_address(host).is_loopback else "address"
    except ValueError:
        return "address"


def _command(pid: int) -> str:
    try:
        cmd = " ".join(psutil.Process(pid).cmdline()) or psutil.Process(pid).name()
    except psutil.Error:
        return "?"
    return cmd[:120]


def listeners(netns: str | None = None, pids: Collection[int] | None = None) -> list[Listener]:
    """The TCP listeners in ``netns`` (None: this namespace), held by one of ``pids`` (None: all)."""
    argv = ["ss", "-ltnpH"]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        host, _, port = parts[3].rpartition(":")
        for _name, pid in _USER.findall(line):
            if pids is None or int(pid) in pids:
                found.append(Listener(host, int(port), int(pid), _command(int(pid))))
    return sorted(set(found), key=lambda item: (item.process, item.port))


def listeners_of(pids: Iterable[int]) -> list[Listener]:
    """The TCP listeners held by ``pids`` (psutil: each process's own sockets; pids gone meanwhile are skipped)."""
    found = set()
    for pid in set(pids):
        try:
            sockets = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        for sock in sockets:
            if sock.status == psutil.CONN_LISTEN:
                host = f"[{sock.laddr.ip}]" if ":" in sock.laddr.ip else sock.laddr.ip
                found.add(Listener(host, sock.laddr.port, pid, _command(pid)))
    return sorted(found, key=lambda item: (item.process, item.port))


def table(items: Iterable[Listener]) -> str:
    """One line per listener: ``host:port  scope  pid  command``."""
    return "\n".join(f"  {f'{i.host}:{i.port}':28s} {i.scope:8s} {i.pid:7d} {i.process}" for i in items)


KNOCKS = (("GET", "/"), ("GET", "/metrics"), ("POST", "/v1/chat/completions"))
"""What a stranger sends each listener: the root, Prometheus's path (Ray's exporters answer any path), an OpenAI
generation (a rollout server's reason to exist). No key, no token, no cookie."""
KNOCK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Knock:
    """What one listener answered each of :data:`KNOCKS`: an HTTP status (``"401"``), or ``"no HTTP (<why>)"``;
    ``ours``: a 401 came from this project's guard (``nemo_gym_adapter.access.guard``)."""

    listener: Listener
    answers: tuple[str, ...]
    ours: bool = False

    @property
    def opened(self) -> bool:
        """Did any request get a 2xx?"""
        return any(answer.startswith("2") for answer in self.answers)


def _connect_host(host: str) -> str:
    host = host.strip("[]")
    if host in ("*", "0.0.0.0"):
        return "127.0.0.1"
    return "::1" if host == "::" else host


def _knock_one(item: Listener) -> Knock:
    answers, ours = [], False
    for method, path in KNOCKS:
        conn = http.client.HTTPConnection(_connect_host(item.host), item.port, timeout=KNOCK_TIMEOUT_S)
        try:
            body = b"{}" if method == "POST" else None
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
            response = conn.getresponse()
            text = response.read(4096)
            answers.append(str(response.status))
            ours |= response.status == 401 and b"nemo-gym-verl" in text
        except (OSError, http.client.HTTPException) as e:
            answers.append(f"no HTTP ({type(e).__name__})")
        finally:
            conn.close()
    return Knock(item, tuple(answers), ours)


def knock(items: Iterable[Listener]) -> list[Knock]:
    """:data:`KNOCKS` to every distinct socket of ``items`` (several at once), one :class:`Knock` per listener."""
    items = list(items)
    unique = {(i.host, i.port): i for i in items}
    with ThreadPoolExecutor(max_workers=16) as pool:
        answered = dict(zip(unique, pool.map(_knock_one, unique.values()), strict=True))
    return [Knock(i, answered[(i.host, i.port)].answers, answered[(i.host, i.port)].ours) for i in items]


def knock_table(knocks: Iterable[Knock]) -> str:
    """One line per listener: ``host:port  pid  answers  command`` (answers in :data:`KNOCKS`' order)."""
    return "\n".join(
        f"  {f'{k.listener.host}:{k.listener.port}':22s} {k.listener.pid:7d} "
        f"{' '.join(a.replace('no HTTP ', '-') for a in k.answers):44s}{' (ours)' if k.ours else '':7s} "
        f"{k.listener.process[:90]}"
        for k in knocks
    )


class TreeListeners(threading.Thread):
    """The listeners of a process tree (a recipe run), taken once its log says it is training.

    Start it with the run's pid and log; it samples the tree every ``interval_s`` (pids that re-parent away stay
    counted once seen), and when ``trigger`` first appears in the log it lists every TCP listener held by a pid of
    the tree into :attr:`found` (psutil, :func:`listeners_of`) -- with ``knock``, what each answers a stranger into
    :attr:`knocks` (:func:`knock`) and how long the log was by then into :attr:`log_chars_after` (what the run logs
    after the knocks), then stops. :attr:`found` stays None when the trigger never came."""

    def __init__(self, pid: int, log_path: Path, trigger: str, interval_s: float = 0.5, knock: bool = False) -> None:
        super().__init__(daemon=True, name="tree-listeners")
        self.pid, self.log_path, self.trigger, self.interval_s = pid, log_path, trigger, interval_s
        self.knock = knock
        self.pids: set[int] = set()
        self.found: list[Listener] | None = None
        self.knocks: list[Knock] | None = None
        self.log_chars_after = 0
        self._halt = threading.Event()

    def _sample(self) -> None:
        try:
            root = psutil.Process(self.pid)
            self.pids |= {self.pid, *(c.pid for c in root.children(recursive=True))}
        except psutil.Error:
            pass
        # A run started in a session of its own (benchmarks/who_listens.py): its daemons that left the tree keep it.
        for other in psutil.pids():
            try:
                if os.getsid(other) == self.pid:
                    self.pids.add(other)
            except OSError:
                pass

    def run(self) -> None:
        while not self._halt.is_set() and psutil.pid_exists(self.pid):
            self._sample()
            if self.trigger in self.log_path.read_text(errors="replace"):
                time.sleep(self.interval_s)
                self._sample()
                self.found = listeners_of(self.pids)
                if self.knock:
                    self.knocks = knock(self.found)
                self.log_chars_after = len(self.log_path.read_text(errors="replace"))
                return
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
