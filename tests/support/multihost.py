"""A multi-host test bed on one machine: network namespaces as hosts, a real Ray cluster spanning them.

Hosts (``hostnet``): host 1 is this process's own network namespace (the trainer, the Ray head) at 10.77.0.1 on a
bridge; hosts 2..n are network namespaces at 10.77.0.<i>, reachable from each other over the bridge only (loopback
addresses 127.77.0.<i> in one namespace where namespaces cannot be made).

Ray: ``ray start --head --block`` on host 1 and ``ray start --block --address`` inside each namespace, every node
advertising its host address (``--node-ip-address``) with its own temp dir and a custom resource ``host<i>``; a
driver joins with ``ray.init(address=bed.ray_address)``. Processes on a host are ``SessionProcess``
(own session, log file, stopped by pid tree and session). :meth:`MultiHostBed.close` -- also at exit and on SIGTERM
-- stops every process, kills whatever is still inside a namespace (by pid, ``ip netns pids``), deletes namespaces
and links, and returns what it found left over (:class:`Leftovers`, empty when clean); a watchdog process
(``hostnet.reap``) does the same if this process dies without closing it.

    with MultiHostBed(hosts=3, resources={2: {"GPU": 1}, 3: {"GPU": 1}}) as bed:
        ray.init(address=bed.ray_address, runtime_env=...)     # this process: the driver on host 1
        bed.spawn(bed.hosts[2], "gym", [...])                   # a process of your own on host 3
    # or: python scripts/multihost_bed.py up
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from nemo_gym_adapter.runtime import paths
from nemo_gym_adapter.runtime.procs import SessionProcess, free_port, kill_tree, session_members
from tests.support.hostnet import (
    NS_LINK,
    Host,
    HostNetwork,
    Leftovers,
    namespace_pids,
    pid_alive,
    start_reaper,
)

__all__ = ["Host", "HostNetwork", "Leftovers", "MultiHostBed"]
logger = logging.getLogger(__name__)


class MultiHostBed:
    """Hosts + a Ray cluster across them + processes you start on them; a context manager (module docstring).

    ``resources``: extra Ray resources per host index, e.g. ``{2: {"GPU": 1}}`` (logical GPU slots place verl's
    actor workers, and so its rollout replicas, on those hosts). ``num_cpus``: logical CPUs per node (more than the
    machine has, as this project's tests do: placement groups reserve them, the work is light).
    """

    def __init__(
        self,
        hosts: int = 3,
        resources: Mapping[int, Mapping[str, float]] | None = None,
        num_cpus: int = 4,
        run_dir: Path | None = None,
        mode: str = "auto",
        object_store_mb: int = 256,
    ) -> None:
        self.n_hosts, self.mode_wanted, self.num_cpus, self.object_store_mb = hosts, mode, num_cpus, object_store_mb
        self.resources = {int(k): dict(v) for k, v in (resources or {}).items()}
        self.run_dir = run_dir or paths.logs_dir() / "multihost" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.network: HostNetwork | None = None
        self.ray_address: str | None = None
        self.temp_root = Path(tempfile.gettempdir()) / f"ngv{os.getpid()}"  # Ray temp dirs (removed at close)
        self._procs: list[tuple[Host, SessionProcess]] = []  # in start order
        self._seen: dict[str, set[int]] = {}  # host name -> every pid of ours ever seen there
        self._reaper: subprocess.Popen | None = None  # tears the bed down if this process dies without close()
        self._closed = False
        self.leftovers: Leftovers | None = None  # what close() found
        self._closing = threading.Lock()
        self.timings: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------------ set-up
    @property
    def hosts(self) -> list[Host]:
        assert self.network is not None, "bed not started"
        return self.network.hosts

    @property
    def mode(self) -> str | None:
        return self.network.mode if self.network else None

    def start(self) -> MultiHostBed:
        """Build the hosts and the Ray cluster; on any failure everything built so far is torn down."""
        _install_teardown(self.close)
        t0 = time.perf_counter()
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._reaper = start_reaper(self.temp_root, self.run_dir / "reaper.log")
            self.network = HostNetwork.create(self.n_hosts, self.mode_wanted)
            t1 = time.perf_counter()
            head = self.hosts[0]
            port = free_port(head.address)
            self.ray_address = f"{head.address}:{port}"
            nodes = [self._start_ray_node(head, ["--head", f"--port={port}", "--include-dashboard=false"])]
            nodes += [self._start_ray_node(h, [f"--address={self.ray_address}"]) for h in self.hosts[1:]]
            for host, proc, temp_dir in nodes:
                _wait_for(lambda td=temp_dir: (td / "ray_current_cluster").exists(), proc, 180, f"Ray node on {host}")
            self.timings.update(network_s=t1 - t0, ray_s=time.perf_counter() - t1)
        except BaseException:
            self.close()
            raise
        self.timings["setup_s"] = time.perf_counter() - t0
        self._remember()
        logger.info("multi-host bed up in %.1fs: Ray at %s, %s", self.timings["setup_s"], self.ray_address, self.hosts)
        return self

    def _start_ray_node(self, host: Host, args: list[str]) -> tuple[Host, SessionProcess, Path]:
        # One per node (each writes its own address file); short: Ray's socket paths must fit in 107 bytes.
        temp_dir = self.temp_root / host.name
        resources = {host.name: 1.0, **{k: v for k, v in self.resources.get(host.index, {}).items() if k != "GPU"}}
        cmd = [
            str(Path(_venv_bin()) / "ray"),
            "start",
            "--block",
            *args,
            f"--node-ip-address={host.address}",
            f"--num-cpus={self.num_cpus}",
            f"--num-gpus={int(self.resources.get(host.index, {}).get('GPU', 0))}",
            f"--resources={json.dumps(resources)}",
            f"--object-store-memory={self.object_store_mb * 1024 * 1024}",
            f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
        ]
        proc = self.spawn(host, f"ray node {host.name}", cmd)
        return host, proc, temp_dir

    def host_env(self, host: Host) -> dict[str, str]:
        """The environment of processes started on ``host``: ours, minus Ray's address, with Ray's token auth off
        and (in a namespace) the link gloo must use: its default picks the hostname's address, which is on no
        namespace's link.

        Token auth is off because Ray reads ``RAY_AUTH_MODE`` once per process: a driver that imported Ray before
        the bed existed could not switch to the bed's token (a driver in token mode still joins a cluster without).
        The bed's traffic never leaves its namespaces; a real cluster should run with ``RAY_AUTH_MODE=token``."""
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
        env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
        if host.netns:
            env["GLOO_SOCKET_IFNAME"] = NS_LINK
        return env

    def spawn(
        self, host: Host, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None
    ) -> SessionProcess:
        """Start ``argv`` on ``host`` in its own session, logging to ``run_dir/<name>.log``; stopped by :meth:`close`."""
        log = self.run_dir / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.log"
        proc = SessionProcess(
            name=f"{name} ({host.address})",
            cmd=host.command(argv),
            log_path=log,
            env={**self.host_env(host), **(env or {})},
            cwd=cwd,
        )
        self._procs.append((host, proc))
        self._seen.setdefault(host.name, set()).add(proc.pid)
        return proc

    def processes_on(self, host: Host) -> set[int]:
        """Live pids of ours on ``host``: what the bed started there, their descendants and session members (plus,
        in a namespace, anything inside it)."""
        self._remember()
        pids = {p for p in self._seen.get(host.name, set()) if pid_alive(p)}
        if host.netns:
            pids.update(namespace_pids(host.netns))
        return pids

    def _remember(self) -> None:
        """Record every pid of ours now alive, by host: they are checked again at teardown."""
        for host, proc in self._procs:
            proc.remember_descendants()
            self._seen[host.name].update(proc._known_descendants | set(session_members(proc.pid)))
        if self.network and self.network.mode == "netns":
            for host in self.hosts[1:]:
                self._seen.setdefault(host.name, set()).update(namespace_pids(host.netns))

    # ------------------------------------------------------------------------------------------------ teardown
    def close(self) -> Leftovers:
        """Stop everything (last started first), remove namespaces and links; return what was found left over after
        the orderly stop (then killed). Idempotent: later calls return the first call's result."""
        with self._closing:
            if self._closed:
                return self.leftovers or Leftovers()
            self._closed = True
        t0 = time.perf_counter()
        try:
            self._remember()
        except Exception:  # a half-built bed: stop what there is
            logger.exception("multi-host bed: recording pids before teardown failed")
        for _, proc in reversed(self._procs):
            try:
                proc.stop()
            except Exception:
                logger.exception("multi-host bed: stopping %s failed", proc.name)
        found = Leftovers()
        by_host = {name: set(pids) for name, pids in self._seen.items()}
        for host, proc in self._procs:
            by_host[host.name].update(session_members(proc.pid))
        for host_name, pids in by_host.items():
            alive = sorted(p for p in pids if pid_alive(p))
            if alive:
                found.pids[host_name] = alive
                kill_tree(alive, timeout=5)
        if self.network is not None:
            net = self.network.destroy()
            for name, pids in net.pids.items():
                found.pids[name] = sorted(set(found.pids.get(name, [])) | set(pids))
            found.namespaces, found.links = net.namespaces, net.links
        shutil.rmtree(self.temp_root, ignore_errors=True)
        if self._reaper is not None:
            self._reaper.terminate()
            self._reaper.wait(timeout=10)
        self.timings["teardown_s"] = time.perf_counter() - t0
        self.leftovers = found
        level = logging.WARNING if found else logging.INFO
        logger.log(level, "multi-host bed down in %.1fs; leftovers: %s", self.timings["teardown_s"], found or "none")
        return found

    def __enter__(self) -> MultiHostBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _venv_bin() -> str:
    import sys

    return str(Path(sys.executable).parent)


def _wait_for(ready: Callable[[], bool], proc: SessionProcess, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if not proc.alive():
            raise proc.fail(f"{what} exited with code {proc.popen.returncode} before it was up")
        if time.monotonic() > deadline:
            raise proc.fail(f"{what} not up after {timeout:.0f}s")
        time.sleep(0.2)


_TEARDOWNS: list[Callable[[], object]] = []


def _install_teardown(close: Callable[[], object]) -> None:
    """Run ``close`` at exit and on SIGTERM/SIGINT, then the handler that was there before (``procs``': it stops any
    other process it started, then re-raises the signal unless someone else handles it)."""
    if not _TEARDOWNS:
        from nemo_gym_adapter.runtime import procs

        procs._install_handlers()  # theirs first, so ours wraps theirs: the bed goes down first, in its own order
        atexit.register(_run_teardowns)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous = signal.getsignal(sig)

                def handler(signum: int, frame: object, _prev=previous) -> None:
                    _run_teardowns()
                    if callable(_prev):
                        _prev(signum, frame)
                    else:
                        signal.signal(signum, signal.SIG_DFL)
                        os.kill(os.getpid(), signum)

                signal.signal(sig, handler)
    _TEARDOWNS.append(close)


def _run_teardowns() -> None:
    while _TEARDOWNS:
        try:
            _TEARDOWNS.pop()()
        except Exception:
            logger.exception("multi-host bed: teardown failed")
