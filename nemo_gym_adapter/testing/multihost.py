"""A multi-host test bed on one machine: network namespaces as hosts, a real Ray cluster spanning them.

Host 1 is this process's own network namespace (the trainer, the Ray head); hosts 2..n are network namespaces joined
to it by veth pairs on a bridge, each with its own address (``10.77.0.<i>``; host 1 holds ``.1`` on the bridge)::

    root namespace = host 1 (10.77.0.1 on bridge ngv<pid>br) -- veth -- netns ngv<pid>h2 (10.77.0.2 on "ngv0")
                                                              \\- veth -- netns ngv<pid>h3 (10.77.0.3 on "ngv0")

A namespace reaches only the bridge's subnet and its own loopback: a server bound to 127.0.0.1 on one host is not
reachable from another, which is what makes a wrong address fail here as it would on a cluster. Each namespace's
default route points at host 1, whose kernel does not forward (``ip_forward`` stays as it is, 0 here), so nothing
leaves the machine. Where namespaces cannot be made (not root, no ``ip``), hosts fall back to the loopback addresses
127.77.0.1..n in one namespace (not 127.0.0.1, which Ray swaps for the machine's address) -- addresses stay distinct
but nothing isolates them; ``mode`` and the log say which.

Ray: ``ray start --head --block`` on host 1 and ``ray start --block --address`` inside each namespace, every node
advertising its host address (``--node-ip-address``) with its own temp dir and a custom resource ``host<i>``; a
driver joins with ``ray.init(address=bed.ray_address)``. Processes on a host are ``SessionProcess``
(own session, log file, stopped by pid tree and session). :meth:`MultiHostBed.close` -- also at exit and on SIGTERM
-- stops every process, kills whatever is still inside a namespace (by pid, ``ip netns pids``), deletes namespaces
and links, and returns what it found left over (:class:`Leftovers`, empty when clean).

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
from dataclasses import dataclass, field
from pathlib import Path

from nemo_gym_adapter import paths
from nemo_gym_adapter.errors import SetupError
from nemo_gym_adapter.gym_servers import SessionProcess, session_members
from nemo_gym_adapter.procs import free_port, kill_tree

logger = logging.getLogger(__name__)

SUBNET = "10.77.0"  # host i gets SUBNET.i
LOOPBACK_SUBNET = "127.77.0"  # the same without namespaces
NS_LINK = "ngv0"  # the link's name inside every namespace: GLOO_SOCKET_IFNAME for processes there
_NAME = re.compile(r"^ngv(\d+)(h\d+|br|v\d+)$")  # our namespaces and links; the number is the owner's pid


@dataclass(frozen=True)
class Host:
    """One "host" of the bed: its index (1-based), address and network namespace (None: this process's own)."""

    index: int
    address: str
    netns: str | None

    @property
    def name(self) -> str:
        return f"host{self.index}"

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host (``ip netns exec`` execs it: same pid, so it is stopped by pid like any other)."""
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)


@dataclass
class Leftovers:
    """What teardown found still there (each one is killed/removed when found). Empty means clean."""

    pids: dict[str, list[int]] = field(default_factory=dict)  # host name -> live pids of ours on it
    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(any(self.pids.values()) or self.namespaces or self.links)


def _ip(*args: str, netns: str | None = None, check: bool = True) -> str:
    cmd = ["ip", "netns", "exec", netns, "ip", *args] if netns else ["ip", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise SetupError(f"multi-host bed: `{' '.join(cmd)}` failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def _our_names() -> tuple[list[str], list[str]]:
    """Namespaces and links named like ours (any owner)."""
    namespaces = [line.split()[0] for line in _ip("netns", "list", check=False).splitlines() if line.strip()]
    links = [m.group(1) for m in re.finditer(r"^\d+: ([^:@\s]+)", _ip("-o", "link", "show", check=False), re.M)]
    return [n for n in namespaces if _NAME.match(n)], [n for n in links if _NAME.match(n)]


def namespace_pids(netns: str) -> list[int]:
    """Pids of the processes inside ``netns`` (``ip netns pids``)."""
    return [int(p) for p in _ip("netns", "pids", netns, check=False).split()]


def sweep_stale(all_owners: bool = False) -> list[str]:
    """Remove the namespaces and links of beds whose owner process is gone (every bed with ``all_owners``),
    killing the processes still inside them (by pid). Returns what was removed."""
    import psutil

    removed = []
    namespaces, links = _our_names()
    for name in namespaces + links:
        owner = int(_NAME.match(name).group(1))
        if owner == os.getpid() or (psutil.pid_exists(owner) and not all_owners):
            continue
        if name in namespaces:
            kill_tree(namespace_pids(name), timeout=5)
            _ip("netns", "del", name, check=False)
        else:
            _ip("link", "del", name, check=False)
        removed.append(name)
    return removed


class HostNetwork:
    """The hosts and the links between them (see the module docstring)."""

    def __init__(self, n_hosts: int, tag: str, mode: str, hosts: list[Host]) -> None:
        self.n_hosts, self.tag, self.mode, self.hosts = n_hosts, tag, mode, hosts

    @classmethod
    def create(cls, n_hosts: int = 3, mode: str = "auto") -> HostNetwork:
        """``mode``: ``netns``, ``loopback`` or ``auto`` (namespaces when they can be made)."""
        if not 2 <= n_hosts <= 9:
            raise SetupError(f"multi-host bed: {n_hosts} hosts; 2..9 supported")
        tag = f"ngv{os.getpid()}"
        if mode in ("auto", "netns"):
            why_not = _netns_unavailable()
            if why_not is None:
                return cls._create_netns(n_hosts, tag)
            if mode == "netns":
                raise SetupError(f"multi-host bed: network namespaces unavailable: {why_not}")
            logger.warning("multi-host bed: network namespaces unavailable (%s); hosts are loopback addresses", why_not)
        hosts = [Host(i, f"{LOOPBACK_SUBNET}.{i}", None) for i in range(1, n_hosts + 1)]
        logger.info("multi-host bed: mode loopback, hosts %s (one namespace: no isolation)", [h.address for h in hosts])
        return cls(n_hosts, tag, "loopback", hosts)

    @classmethod
    def _create_netns(cls, n_hosts: int, tag: str) -> HostNetwork:
        removed = sweep_stale()
        if removed:
            logger.warning("multi-host bed: removed a dead bed's leftovers: %s", removed)
        if f"inet {SUBNET}.1/" in _ip("-o", "addr", "show", check=False):
            raise SetupError(f"multi-host bed: {SUBNET}.1 is already on a link here (another live bed?)")
        net = cls(n_hosts, tag, "netns", [Host(1, f"{SUBNET}.1", None)])
        try:
            bridge = f"{tag}br"
            _ip("link", "add", bridge, "type", "bridge")
            _ip("addr", "add", f"{SUBNET}.1/24", "dev", bridge)
            _ip("link", "set", bridge, "up")
            for i in range(2, n_hosts + 1):
                ns, outer, inner = f"{tag}h{i}", f"{tag}v{i}", f"{tag}p{i}"
                _ip("netns", "add", ns)
                net.hosts.append(Host(i, f"{SUBNET}.{i}", ns))
                _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
                _ip("link", "set", inner, "netns", ns)
                _ip("link", "set", outer, "master", bridge)
                _ip("link", "set", outer, "up")
                _ip("link", "set", "lo", "up", netns=ns)
                _ip("link", "set", inner, "name", NS_LINK, netns=ns)
                _ip("addr", "add", f"{SUBNET}.{i}/24", "dev", NS_LINK, netns=ns)
                _ip("link", "set", NS_LINK, "up", netns=ns)
                # Address discovery (Ray, vLLM, gloo) asks the kernel for a route to a public address.
                _ip("route", "add", "default", "via", f"{SUBNET}.1", netns=ns)
        except BaseException:
            net.destroy()
            raise
        logger.info("multi-host bed: mode netns, hosts %s", [(h.address, h.netns or "root") for h in net.hosts])
        return net

    def destroy(self) -> Leftovers:
        """Kill what is still inside each namespace (reported), delete namespaces and links, verify they are gone."""
        found = Leftovers()
        if self.mode != "netns":
            return found
        for host in self.hosts[1:]:
            inside = namespace_pids(host.netns)
            if inside:
                found.pids[host.name] = inside
                kill_tree(inside, timeout=5)
            # Deleting one end deletes the pair; a namespace's deletion alone may leave our end behind (seen here).
            _ip("link", "del", f"{self.tag}v{host.index}", check=False)
            _ip("netns", "del", host.netns, check=False)
        _ip("link", "del", f"{self.tag}br", check=False)
        deadline = time.monotonic() + 5  # link removal can trail the command by a moment
        while True:
            namespaces, links = (list(filter(lambda n: n.startswith(self.tag), names)) for names in _our_names())
            if not (namespaces or links) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        found.namespaces, found.links = namespaces, links
        return found


def _netns_unavailable() -> str | None:
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if os.geteuid() != 0:
        return "not root"
    probe = f"ngv{os.getpid()}h0"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return done.stderr.strip() or f"`ip netns add` exited {done.returncode}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


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
        self._sessions: set[int] = set()
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
        self._sessions.add(proc.pid)
        self._seen.setdefault(host.name, set()).add(proc.pid)
        return proc

    def processes_on(self, host: Host) -> set[int]:
        """Live pids of ours on ``host``: what the bed started there, their descendants and session members (plus,
        in a namespace, anything inside it)."""
        self._remember()
        pids = {p for p in self._seen.get(host.name, set()) if _alive(p)}
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
        for host_name, pids in self._seen.items():
            alive = sorted(p for p in pids | _session_pids(self._sessions) if _alive(p))
            if alive:
                found.pids[host_name] = alive
                kill_tree(alive, timeout=5)
        if self.network is not None:
            net = self.network.destroy()
            for name, pids in net.pids.items():
                found.pids[name] = sorted(set(found.pids.get(name, [])) | set(pids))
            found.namespaces, found.links = net.namespaces, net.links
        shutil.rmtree(self.temp_root, ignore_errors=True)
        self.timings["teardown_s"] = time.perf_counter() - t0
        self.leftovers = found
        level = logging.WARNING if found else logging.INFO
        logger.log(level, "multi-host bed down in %.1fs; leftovers: %s", self.timings["teardown_s"], found or "none")
        return found

    def __enter__(self) -> MultiHostBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _session_pids(sessions: set[int]) -> set[int]:
    return {p for sid in sessions for p in session_members(sid)}


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


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
        from nemo_gym_adapter import procs

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
