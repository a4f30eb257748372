"""Who listens where: the TCP listening sockets of given processes, read with ``ss -ltnp`` (in a network namespace
with ``ip netns exec``), for the tests that check a run exposes nothing beyond what docs/CLUSTER.md lists.

:func:`listeners` returns one :class:`Listener` per (socket, owning pid); :func:`scope` tells loopback, one address
(the node's) and every interface apart; :func:`table` prints them for a test's log; :class:`TreeListeners` takes
them for a whole process tree (a recipe run) once it trains.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import threading
import time
from collections.abc import Collection, Iterable
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


def table(items: Iterable[Listener]) -> str:
    """One line per listener: ``host:port  scope  pid  command``."""
    return "\n".join(f"  {f'{i.host}:{i.port}':28s} {i.scope:8s} {i.pid:7d} {i.process}" for i in items)


class TreeListeners(threading.Thread):
    """The listeners of a process tree (a recipe run), taken once its log says it is training.

    Start it with the run's pid and log; it samples the tree every ``interval_s`` (pids that re-parent away stay
    counted once seen), and when ``trigger`` first appears in the log it lists every TCP listener held by a pid of
    the tree into :attr:`found`, then stops. :attr:`found` stays None when the trigger never came."""

    def __init__(self, pid: int, log_path: Path, trigger: str, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True, name="tree-listeners")
        self.pid, self.log_path, self.trigger, self.interval_s = pid, log_path, trigger, interval_s
        self.pids: set[int] = set()
        self.found: list[Listener] | None = None
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
                self.found = listeners(pids=self.pids)
                return
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
