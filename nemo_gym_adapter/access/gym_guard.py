"""Gym's own servers answer only the run's clients: the run's key required by every server Gym starts, sent by every
Gym process to the others and by the trainer's clients of Gym (``nemo_gym.access.guard_gym``).

Why: NeMo Gym 0.7 has no authentication. Its servers listen on 127.0.0.1 on one host (``access.listen``), but any
other user of that host reaches them there: a stranger's ``/run`` makes an agent call the run's model server, which
generates with the run's weights -- it holds the rollout key, so the replicas' own guard (:mod:`.guard`) lets it in --
and the resources servers' routes change environment state.

How, with Gym in its own venv (Python 3.13) that the trainer never imports: Gym's processes start with ``PYTHONPATH``
naming :data:`BOOT_DIR` (a ``sitecustomize.py`` and nothing else, so no module of ours can shadow one of Gym's), which
every interpreter of Gym's process tree imports at start-up (its launcher, every server, its Ray's workers). With the
key in :data:`KEY_ENV` it runs :func:`boot`, which applies each patch when its library is first imported:

- incoming: :mod:`.guard` (loaded by path: this package is not importable there) requires ``X-NGV-Run-Key: <key>``
  on every request of every Starlette app of the process -- every Gym server is a FastAPI app --, 401 before routing;
- outgoing: every ``aiohttp`` and ``requests`` call of the process to one of Gym's addresses (:data:`HOSTS_ENV`:
  loopback and Gym's host; :data:`PORTS_ENV`: Gym's port band) carries the header. Gym's servers call each other
  through one aiohttp client (``nemo_gym.server_utils.request``); a judge or an external API elsewhere never sees the
  key.

The trainer's clients of Gym (the rollout client, the liveness probes, the head server reads) add
:func:`client_headers`, set by :func:`use_key` when a Gym is started with a key (``GymServers.start``).

A header of its own, not ``Authorization``: Gym uses that one for its token-capture control routes. Stdlib only, so a
Gym process can load this file by path (``gym_boot/sitecustomize.py``).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

HEADER = "X-NGV-Run-Key"
KEY_ENV = "NGV_GYM_ACCESS_KEY"  # the key, in the environment of Gym's processes only (never argv, a file or a log)
HOSTS_ENV = "NGV_GYM_KEY_HOSTS"  # comma-separated hosts whose Gym ports get the header from Gym's processes
PORTS_ENV = "NGV_GYM_KEY_PORTS"  # "low-high[,port...]": Gym's port band (its servers and its head server)
BOOT_DIR = Path(__file__).resolve().parent / "gym_boot"
LOOPBACK = ("127.0.0.1", "localhost", "::1")
SENTINEL = "__ngv_gym_key_original__"

_CLIENT: dict[str, str | None] = {"key": None}  # the trainer side: the key of the Gym this process started


# ------------------------------------------------------------------------------------------------ the trainer's side


def launch_env(key: str, host: str, port_band: tuple[int, int], extra_ports: Iterable[int] = ()) -> dict[str, str]:
    """The variables that make Gym's processes require and send ``key`` (:func:`boot`): added to Gym's environment
    after the trainer's ``PYTHONPATH`` was scrubbed (``gym.launch``). ``host``: where Gym listens (loopback is always
    in); ``port_band``: Gym's ``port_range_low/high``; ``extra_ports``: a head port pinned outside it."""
    if not key:
        raise ValueError("the Gym access key must not be empty (it would let everyone in)")
    hosts = dict.fromkeys([*LOOPBACK, host])
    ports = [f"{port_band[0]}-{port_band[1]}", *(str(p) for p in extra_ports)]
    return {KEY_ENV: key, HOSTS_ENV: ",".join(hosts), PORTS_ENV: ",".join(ports), "PYTHONPATH": str(BOOT_DIR)}


def use_key(key: str | None) -> None:
    """Send ``key`` on this process's requests to Gym from now on (None: stop)."""
    _CLIENT["key"] = key or None


def client_headers() -> dict[str, str]:
    """The header the trainer's clients of Gym send (empty while no guarded Gym was started here)."""
    key = _CLIENT["key"]
    return {HEADER: key} if key else {}


# ------------------------------------------------------------------------------------------------ Gym's side


class Destinations:
    """Which URLs get the key: a host of :data:`HOSTS_ENV` on a port of :data:`PORTS_ENV`."""

    def __init__(self, hosts: Iterable[str], ports: str) -> None:
        self.hosts = {h.strip().strip("[]").lower() for h in hosts if h.strip()}
        self.ranges: list[tuple[int, int]] = []
        for part in (p.strip() for p in ports.split(",")):
            if part:
                low, _, high = part.partition("-")
                self.ranges.append((int(low), int(high or low)))

    def __contains__(self, url: object) -> bool:
        try:
            parts = urllib.parse.urlsplit(str(url))
            host, port = (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return False
        return host in self.hosts and any(low <= port <= high for low, high in self.ranges)


def _pairs(headers: Any) -> list[tuple[str, str]]:
    if headers is None:
        return []
    items = headers.items() if hasattr(headers, "items") else headers
    return [(str(k), str(v)) for k, v in items]


def _sends_key(headers: Any) -> bool:
    return any(k.lower() == HEADER.lower() for k, _ in _pairs(headers))


def _wrap_once(owner: Any, name: str, wrap: Any) -> None:
    """``owner.name = wrap(owner.name)`` unless already wrapped here (the original kept under :data:`SENTINEL`)."""
    original = getattr(owner, name)
    if getattr(original, SENTINEL, None) is None:
        wrapped = functools.wraps(original)(wrap(original))
        setattr(wrapped, SENTINEL, original)
        setattr(owner, name, wrapped)


def patch_aiohttp(client: Any, key: str, destinations: Destinations) -> None:
    """Every ``aiohttp.ClientSession`` request of this process to ``destinations`` carries the key (``client``: the
    ``aiohttp.client`` module)."""

    def wrap(original: Any) -> Any:
        async def _request(self: Any, method: str, str_or_url: Any, **kwargs: Any) -> Any:
            if str_or_url in destinations and not _sends_key(kwargs.get("headers")):
                kwargs["headers"] = [*_pairs(kwargs.get("headers")), (HEADER, key)]  # aiohttp takes pairs
            return await original(self, method, str_or_url, **kwargs)

        return _request

    _wrap_once(client.ClientSession, "_request", wrap)


def patch_requests(sessions: Any, key: str, destinations: Destinations) -> None:
    """The same for ``requests`` (``sessions``: ``requests.sessions``; Gym's processes read the head's config with it)."""

    def wrap(original: Any) -> Any:
        def request(self: Any, method: str, url: Any, *args: Any, **kwargs: Any) -> Any:
            if url in destinations and not _sends_key(kwargs.get("headers")):
                kwargs["headers"] = {**dict(_pairs(kwargs.get("headers"))), HEADER: key}
            return original(self, method, url, *args, **kwargs)

        return request

    _wrap_once(sessions.Session, "request", wrap)


def _guard_module() -> Any:
    """:mod:`.guard`: imported when this package is importable (tests), else loaded by path (a Gym process)."""
    try:
        from nemo_gym_adapter.access import guard

        return guard
    except ImportError:
        name = "_ngv_access_guard"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / "guard.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``hooks[name](module)`` right after ``name`` is first imported in this process (a finder at the front of
    ``sys.meta_path`` that lets the others find the module and wraps the found loader's ``exec_module``): an
    interpreter that never imports a library pays nothing for its patch."""

    def __init__(self, hooks: Mapping[str, Any]) -> None:
        self.hooks = dict(hooks)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        hook = self.hooks.get(name)
        if hook is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if finder is not self and find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        del self.hooks[name]
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            hook(module)

        loader.exec_module = exec_module  # this spec's own loader instance
        return spec


def boot(environ: Mapping[str, str] | None = None) -> list[str]:
    """In a Gym process: require the key on its servers and send it to Gym's others (the module docstring), each patch
    applied now if its library is already imported, else right after its first import (:class:`AfterImport`).
    Returns the libraries patched now; nothing without :data:`KEY_ENV`."""
    env = os.environ if environ is None else environ
    key = env.get(KEY_ENV, "")
    if not key:
        return []
    destinations = Destinations(env.get(HOSTS_ENV, ",".join(LOOPBACK)).split(","), env.get(PORTS_ENV, ""))
    hooks = {
        "starlette.applications": lambda _: _guard_module().install_guard([key], header=HEADER),
        "aiohttp.client": lambda module: patch_aiohttp(module, key, destinations),
        "requests.sessions": lambda module: patch_requests(module, key, destinations),
    }
    done = [name for name in hooks if name in sys.modules]
    for name in done:
        hooks.pop(name)(sys.modules[name])
    if hooks and not any(isinstance(f, AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, AfterImport(hooks))
    return [name.partition(".")[0] for name in done]


def check_guarded(base_urls: Mapping[str, str], timeout_s: float = 10.0) -> None:
    """Raise ``GymServerError`` naming every server of ``base_urls`` (name -> ``http://host:port``) that does not answer
    a keyless ``GET /`` with this guard's 401, and what it answered. Run once Gym is up: a server that did not get the
    guard (an interpreter that skipped ``sitecustomize``) stops the launch instead of serving everyone."""
    from nemo_gym_adapter.errors import GymServerError
    from nemo_gym_adapter.runtime.http_get import http_get

    open_ = []
    for name, url in base_urls.items():
        try:
            status, body = http_get(url.rstrip("/") + "/", timeout=timeout_s, limit=4096)
        except OSError as e:
            open_.append(f"{name} ({url}): no answer ({type(e).__name__})")
            continue
        if status != 401 or b"nemo-gym-verl" not in body:
            open_.append(f"{name} ({url}): HTTP {status} without the key")
    if open_:
        raise GymServerError(
            "nemo_gym.access.guard_gym: these Gym servers do not refuse a request without the run's key: "
            + "; ".join(open_)
            + " (started without nemo_gym_adapter/access/gym_boot on their PYTHONPATH?)"
        )
