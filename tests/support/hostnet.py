"""Hosts on one machine for the multi-host bed: network namespaces joined by veth pairs on a bridge.

Host 1 is this process's own network namespace; hosts 2..n are namespaces ``ngv<owner pid>h<i>``, each with its own
address on a link named ``ngv0``, joined to a bridge ``ngv<owner pid>br`` that holds host 1's address::

    root namespace = host 1 (10.77.0.1 on bridge ngv<pid>br) -- veth -- netns ngv<pid>h2 (10.77.0.2 on "ngv0")
                                                              \\- veth -- netns ngv<pid>h3 (10.77.0.3 on "ngv0")

A namespace reaches only the bridge's subnet and its own loopback: a server bound to 127.0.0.1 on one host is not
reachable from another, which is what makes a wrong address fail here as it would on a cluster. Each namespace's
default route points at host 1, whose kernel does not forward (``ip_forward`` stays as it is, 0 here), so nothing
leaves the machine. Where namespaces cannot be made (not root, no ``ip``), hosts fall back to the loopback addresses
127.77.0.1..n in one namespace (not 127.0.0.1, which Ray swaps for the machine's address) -- addresses stay distinct
but nothing isolates them; ``mode`` and the log say which.

Names carry the owner's pid: :func:`sweep_stale` removes the namespaces of dead owners, and :func:`reap` (run as a
watchdog process by the bed) tears down after an owner that died without closing its bed.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nemo_gym_adapter.errors import SetupError
from nemo_gym_adapter.runtime.procs import kill_tree, session_members

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


def pid_alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _started_at(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time() if pid_alive(pid) else None
    except psutil.Error:
        return None


# ------------------------------------------------------------------------------------------------ reaper


def start_reaper(temp_root: Path, log: Path) -> subprocess.Popen:
    """A watchdog in its own session: when this process dies without :meth:`MultiHostBed.close` (SIGKILL; SIGTERM
    once ``ray.init`` has replaced every SIGTERM handler with ``sys.exit``, which can abort inside Ray's C++), it
    kills what this process had started and removes the bed's namespaces and links. ``close`` stops it first."""
    import sys

    cmd = [sys.executable, "-m", __name__, "--reap", str(os.getpid()), str(temp_root)]
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )


def reap(owner: int, temp_root: Path, interval: float = 1.0) -> list[int]:
    """Until ``owner`` dies, remember its descendants every ``interval`` s (pid and start time, so a reused pid is
    never touched); then kill those still alive, the members of the sessions they led and whatever is inside the
    owner's namespaces, and remove the namespaces, links and ``temp_root``. Returns the pids killed."""
    import psutil

    try:
        me = psutil.Process(owner)
        started = me.create_time()
    except psutil.Error:
        return []
    known: dict[int, float] = {}
    while True:
        try:
            if me.status() == psutil.STATUS_ZOMBIE or me.create_time() != started:
                break
            children = me.children(recursive=True)
        except psutil.Error:  # gone
            break
        for child in children:
            try:
                known.setdefault(child.pid, child.create_time())
            except psutil.Error:
                continue
        time.sleep(interval)
    known.pop(os.getpid(), None)
    victims = {pid for pid, ct in known.items() if _started_at(pid) == ct}
    victims |= {p for sid in known for p in session_members(sid)}  # sessions led by its children (Ray agents)
    tag = f"ngv{owner}"
    namespaces, links = _our_names()
    for ns in (n for n in namespaces if n.startswith(tag)):
        victims |= set(namespace_pids(ns))
    victims.discard(os.getpid())
    kill_tree(victims, timeout=5)
    for ns in (n for n in namespaces if n.startswith(tag)):
        _ip("netns", "del", ns, check=False)
    for link in (n for n in links if n.startswith(tag)):
        _ip("link", "del", link, check=False)
    shutil.rmtree(temp_root, ignore_errors=True)
    return sorted(victims)


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 4 and sys.argv[1] == "--reap":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # close() stops us: nothing to do then
        killed = reap(int(sys.argv[2]), Path(sys.argv[3]))
        print(f"owner {sys.argv[2]} died without closing its bed; killed {killed}, removed its namespaces", flush=True)
