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
import select
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

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
KNOCK_TIMEOUT_S = 2.0
"""How long one knock waits to connect and for an answer. An HTTP server on loopback answers well within it (the
guard's 401 comes before any route runs: the run's HTTP servers answered in milliseconds at load ~1.5); a listener
that stays silent that long does not speak HTTP (the vLLM engine core's 13 sockets, one of a verl worker's: they
neither greet nor answer a request) and is not asked again. A whole knock takes about this long: it has to end
while a CPU e2e run still trains (steps of ~2 s there)."""
FIRST_WORD_S = 0.3
"""How long a knock, connected, waits for the listener to speak first: no HTTP server ever does; ZMQ (ZMTP's greeting)
and other binary protocols do. Such a listener is told apart without a request sent, in a fraction of a second."""
NOT_ASKED = "no HTTP (silent: not asked again)"


@dataclass(frozen=True)
class Knock:
    """What one listener answered each of :data:`KNOCKS`: an HTTP status (``"401"``), or ``"no HTTP (<why>)"`` --
    it spoke first in another protocol, hung up, reset, answered something that is not HTTP, or stayed silent (then
    the knocks after are :data:`NOT_ASKED`); ``ours``: a 401 came from this project's guard
    (``nemo_gym_adapter.access.guard``); ``seconds``: how long the knocks on it took."""

    listener: Listener
    answers: tuple[str, ...]
    ours: bool = False
    seconds: float = 0.0

    @property
    def opened(self) -> bool:
        """Did any request get a 2xx?"""
        return any(answer.startswith("2") for answer in self.answers)

    @property
    def speaks_http(self) -> bool:
        """Did any request get an HTTP answer at all?"""
        return not all(answer.startswith("no HTTP") for answer in self.answers)


def _connect_host(host: str) -> str:
    host = host.strip("[]")
    if host in ("*", "0.0.0.0"):
        return "127.0.0.1"
    return "::1" if host == "::" else host


def _first_word(sock: socket.socket) -> bytes | None:
    """What the listener sends before it is asked anything (:data:`FIRST_WORD_S`): None if nothing, b"" if it hung up."""
    ready, _, _ = select.select([sock], [], [], FIRST_WORD_S)
    if not ready:
        return None
    try:
        return sock.recv(16)
    except OSError:
        return b""


def _protocol(first: bytes) -> str:
    """Names what a listener said first: ZMTP's greeting (ZMQ: 0xff, 8 bytes, 0x7f), an HTTP/2 server's SETTINGS frame
    (gRPC: a frame of type 4 on stream 0), else its first bytes in hex."""
    if len(first) >= 10 and first[0] == 0xFF and first[9] == 0x7F:
        return "ZMTP greeting (ZMQ)"
    if len(first) >= 9 and first[3] == 0x04 and first[5:9] == bytes(4):
        return "HTTP/2 SETTINGS (gRPC)"
    return first[:10].hex()


def _knock_one(item: Listener, timeout_s: float) -> Knock:
    started = time.monotonic()
    answers: list[str] = []
    ours = False
    for method, path in KNOCKS:
        conn = http.client.HTTPConnection(_connect_host(item.host), item.port, timeout=timeout_s)
        try:
            conn.connect()
            if not answers and conn.sock is not None:
                first = _first_word(conn.sock)
                if first is not None:  # no HTTP server speaks first or hangs up unasked: nothing more to ask it
                    why = f"speaks first: {_protocol(first)}" if first else "hung up unasked"
                    answers = [f"no HTTP ({why})"] * len(KNOCKS)
                    break
            body = b"{}" if method == "POST" else None
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
            response = conn.getresponse()
            text = response.read(4096)
            answers.append(str(response.status))
            ours |= response.status == 401 and b"nemo-gym-verl" in text
        except TimeoutError:
            answers.append("no HTTP (timeout)")
            answers += [NOT_ASKED] * (len(KNOCKS) - len(answers))
            break
        except (OSError, http.client.HTTPException) as e:
            answers.append(f"no HTTP ({type(e).__name__})")
        finally:
            conn.close()
    return Knock(item, tuple(answers), ours, time.monotonic() - started)


def knock(items: Iterable[Listener], timeout_s: float = KNOCK_TIMEOUT_S) -> list[Knock]:
    """:data:`KNOCKS` to every distinct socket of ``items``, all sockets at once (one thread each, up to 64), one
    :class:`Knock` per listener. Bounded: a socket costs at most one connect and one answer's ``timeout_s`` (a silent
    listener is asked once), so the whole knock takes about ``timeout_s`` plus :data:`FIRST_WORD_S` at worst."""
    items = list(items)
    unique = {(i.host, i.port): i for i in items}
    if not unique:
        return []
    with ThreadPoolExecutor(max_workers=min(64, len(unique))) as pool:
        done = pool.map(lambda item: _knock_one(item, timeout_s), unique.values())
        answered = dict(zip(unique, done, strict=True))
    return [replace(answered[(i.host, i.port)], listener=i) for i in items]


def _answers(k: Knock) -> str:
    answers = [a.replace("no HTTP ", "-") for a in k.answers]
    return f"{answers[0]} x{len(answers)}" if len(set(answers)) == 1 else " ".join(answers)


def knock_table(knocks: Iterable[Knock]) -> str:
    """One line per listener: ``host:port  pid  answers  seconds  command`` (answers in :data:`KNOCKS`' order; the
    same answer to every knock once, ``x3``)."""
    return "\n".join(
        f"  {f'{k.listener.host}:{k.listener.port}':24s} {k.listener.pid:7d} {_answers(k):34s}"
        f"{' (ours)' if k.ours else '':7s} {k.seconds:4.1f}s {k.listener.process[:80]}"
        for k in knocks
    )


Trigger = str | Callable[[], bool]
"""When :class:`TreeListeners` lists: a text that has appeared in the run's log, or a check that has come true (e.g. a
step in the run's metrics file)."""


@dataclass
class Round:
    """One listing of :class:`TreeListeners`: the listeners first seen then (:attr:`found`), what each answered a
    stranger (:attr:`knocks`; None without ``knock``), the run's ``progress()`` just before the listing and just after
    the knocks, and how long listing and knocking took."""

    found: list[Listener]
    knocks: list[Knock] | None
    before: Any
    after: Any
    seconds: float


class TreeListeners(threading.Thread):
    """The listeners of a process tree (a recipe run), taken while it runs, and what they answer a stranger.

    Start it with the run's pid and log; it samples the tree every ``interval_s`` (pids that re-parent away stay
    counted once seen). When ``trigger`` (or each of several, in order) fires, it lists every TCP listener held by a
    pid of the tree (psutil, :func:`listeners_of`) and, with ``knock``, knocks on the ones not seen at an earlier
    trigger (:func:`knock`): one :class:`Round` each in :attr:`rounds`, with ``progress()`` (default: the log's
    length) before and after, so a test can tell what the run did after the knocks. :attr:`found` and
    :attr:`knocks` gather every round's; :attr:`found` stays None when no trigger came. It stops after the last
    trigger, or when the run ends."""

    def __init__(
        self,
        pid: int,
        log_path: Path,
        trigger: Trigger | Sequence[Trigger],
        interval_s: float = 0.5,
        knock: bool = False,
        progress: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(daemon=True, name="tree-listeners")
        self.pid, self.log_path, self.interval_s = pid, log_path, interval_s
        self.triggers: list[Trigger] = [trigger] if isinstance(trigger, str) or callable(trigger) else list(trigger)
        self.knock = knock
        self.progress = progress or (lambda: len(self.log_path.read_text(errors="replace")))
        self.pids: set[int] = set()
        self.rounds: list[Round] = []
        self.error: BaseException | None = None
        self._halt = threading.Event()

    @property
    def found(self) -> list[Listener] | None:
        return [item for r in self.rounds for item in r.found] if self.rounds else None

    @property
    def knocks(self) -> list[Knock] | None:
        done = [k for r in self.rounds if r.knocks is not None for k in r.knocks]
        return done if self.rounds and self.knock else None

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

    def _fired(self, trigger: Trigger) -> bool:
        if isinstance(trigger, str):
            return trigger in self.log_path.read_text(errors="replace")
        return trigger()

    def _round(self) -> Round:
        started, before = time.monotonic(), self.progress()
        self._sample()
        seen = {(item.host, item.port, item.pid) for r in self.rounds for item in r.found}
        new = [item for item in listeners_of(self.pids) if (item.host, item.port, item.pid) not in seen]
        knocks = knock(new) if self.knock else None
        return Round(new, knocks, before, self.progress(), time.monotonic() - started)

    def run(self) -> None:
        try:
            self._watch()
        except BaseException as e:  # kept for the test to report: a thread's exception is otherwise only printed
            self.error = e
            raise

    def _watch(self) -> None:
        pending = list(self.triggers)
        while pending and not self._halt.is_set() and psutil.pid_exists(self.pid):
            self._sample()
            if self._fired(pending[0]):
                pending.pop(0)
                self._halt.wait(self.interval_s)  # the tree once more: what the trigger's step started
                self.rounds.append(self._round())
                continue
            self._halt.wait(self.interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
