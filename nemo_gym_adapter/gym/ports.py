"""Which ports Gym's servers get, and what a port lost at start-up looks like (component 3).

The race this avoids: NeMo Gym 0.7 gives each server a port by binding a random port of ``port_range_low..high``
(default 10001-20000, ``nemo_gym/global_config.py`` ``_find_open_port_using_range``) on a throwaway socket and
releasing it; the server binds it seconds later, after its imports. Ray started with ``ray start`` and no
``--min/max-worker-port`` hands every driver and worker a gRPC port from 10002-19999 (``ray/scripts/scripts.py``) --
the same band, on every node, in every run. Our own early Gym Ray head is such a ``ray start``; so is a GPU cluster's
Ray, usually. One CI run ended at start-up when a server found its port taken (``[Errno 98] address already in
use``): Gym's launcher then stops everything.

Two defences:

1. :func:`safe_port_range`: Gym's servers (and its head server) draw from a band nobody else hands out -- outside
   Ray's CLI worker band and outside the kernel's ephemeral range (read from ``/proc``, so a node that widened it is
   handled): 20000-32767 on Linux's defaults (``nemo_gym.port_range`` overrides it). Our Gym Ray head also gives
   its workers ephemeral ports (``ray_head.head_command``), as ``ray.init()`` of a local cluster does.
2. What still collides (another program on the node) is found in Gym's launcher log (:func:`port_collisions`: Gym
   copies each server's output there as ``(<server>) ...``; the head server, a thread of the launcher, logs it
   unprefixed) and ``GymServers.start`` relaunches with new ports, a bounded number of times
   (``nemo_gym.port_retries``), logging the server and the port.
"""

from __future__ import annotations

import random
import re
import socket
from pathlib import Path

from nemo_gym_adapter.errors import GymServerError

# Ray's worker ports for a node started with `ray start` and no --min/max-worker-port (ray/scripts/scripts.py:516;
# `ray.init()` of a new local cluster uses 0 = ephemeral instead, ray/_private/services.py:1852).
RAY_CLI_WORKER_PORTS = (10002, 19999)
GYM_DEFAULT_PORTS = (10001, 20000)  # Gym 0.7's own port_range_low/high
LINUX_EPHEMERAL_PORTS = (32768, 60999)  # when /proc cannot be read
EPHEMERAL_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
MIN_BAND = 1000  # a gap with fewer free ports is too crowded to draw from at random
HEAD_SERVER = "head server"  # the name port_collisions gives Gym's head server (a thread of the launcher)


def ephemeral_port_range(path: Path = EPHEMERAL_FILE) -> tuple[int, int]:
    """The kernel's ephemeral range (every ``bind(0)``, every outgoing connection); Linux's default if unreadable."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL_PORTS
    return low, high


def safe_port_range(ephemeral: tuple[int, int] | None = None) -> tuple[int, int]:
    """The widest band of 1024-65535 outside Ray's CLI worker ports and the ephemeral range (``ephemeral``, default
    :func:`ephemeral_port_range`): 20000-32767 on Linux's defaults. Gym's own default (10001-20000) when no band of
    :data:`MIN_BAND` ports is left -- the start-up retry is then the only defence."""
    taken = sorted([RAY_CLI_WORKER_PORTS, ephemeral or ephemeral_port_range()])
    gaps, start = [], 1024
    for low, high in taken:
        if low > start:
            gaps.append((start, low - 1))
        start = max(start, high + 1)
    if start <= 65535:
        gaps.append((start, 65535))
    best = max(gaps, key=lambda g: g[1] - g[0], default=None)
    if best is None or best[1] - best[0] + 1 < MIN_BAND:
        return GYM_DEFAULT_PORTS
    return best


def free_port_in(host: str, low: int, high: int, tries: int = 100) -> int:
    """A TCP port of ``low..high`` free right now on ``host`` (random probes, as Gym picks its servers' ports).
    Raises ``GymServerError`` when ``tries`` probes find none."""
    for _ in range(tries):
        port = random.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise GymServerError(f"no free port in {low}-{high} on {host} after {tries} tries (nemo_gym.port_range)")


# uvicorn's message when its bind fails (the server then exits 1), as Gym's launcher log carries it.
_BIND_FAILED = re.compile(
    r"^(?:\((?P<server>[^)\s]+)\) )?.*error while attempting to bind on address \('[^']*', (?P<port>\d+)\)"
    r".*address already in use",
    re.MULTILINE | re.IGNORECASE,
)
BIND_FAILED_MARKER = b"address already in use"  # what wakes the launcher-log watch (readiness.READY_MARKERS)


def port_collisions(log_text: str) -> list[tuple[str, int]]:
    """``(server, port)`` for every bind that failed with "address already in use" in Gym's launcher log, in order;
    the head server is :data:`HEAD_SERVER`."""
    return [(m.group("server") or HEAD_SERVER, int(m.group("port"))) for m in _BIND_FAILED.finditer(log_text)]


class GymPortInUseError(GymServerError):
    """A Gym server (or the head server) could not bind the port it was given: another process took it after Gym
    probed it free. ``server``: Gym's process name (:data:`HEAD_SERVER` for the head); ``port``; ``run_dir``: the
    launch's run directory."""

    def __init__(self, message: str, server: str, port: int, run_dir: Path | None = None) -> None:
        super().__init__(message)
        self.server, self.port, self.run_dir = server, port, run_dir
