"""verl's SGLang server and its own HTTP client with the run's rollout key (loaded in verl's processes).

verl 0.9.1 drives SGLang through its HTTP API from the actor workers (``sglang_rollout.ServerAdapter`` ->
``sglang_rollout.http_server_engine.AsyncHttpServerAdapter``): weight updates, memory release and resume, cache
flushes, aborts, ``v1/models``. It sends no ``Authorization`` header (the adapter's ``ServerArgs.api_key`` is never set
for a server it attaches to), so once the access guard (:mod:`nemo_gym_adapter.access.guard`) is in the SGLang server,
every one of those calls would get a 401 and weight sync would stop. :func:`install` adds the run's key
(``access.key.fetch``: this Ray job's, read once) to both ways the adapter sends a request: the aiohttp sessions of
``AsyncHttpServerAdapter._get_session`` and the module's ``requests`` calls (``HttpServerAdapter._make_request``,
through a stand-in for that module's ``requests`` name only). Without a published key nothing is added.

And the server side: verl's ``SGLangHttpServer.launch_server`` (``async_sglang_server``) installs the access guard
(:mod:`nemo_gym_adapter.access.guard`) with the published key before it starts SGLang's app, so the replica never
answers a request without the key -- what the vLLM plugin does for vLLM; the manager installs it through Ray anyway
and proves it (``recipe.nemo_gym.servers.replicas.guard_replicas``).

Loaded in every verl process through ``VERL_USE_EXTERNAL_MODULES`` (``recipe.nemo_gym.main`` appends it for
``rollout.name=sglang`` with ``nemo_gym.access.require_key``). Importing it costs nothing: verl's modules import
SGLang's server (seconds), so each is wrapped when verl imports it (:class:`_WrapOnImport`, a finder at the front of
``sys.meta_path`` for those module names only), or at once if it already is. Idempotent.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import logging
import sys
from collections.abc import AsyncIterator, Sequence
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

SENTINEL = "__ngv_original__"
_MODULE = "verl.workers.rollout.sglang_rollout.http_server_engine"  # the client (AsyncHttpServerAdapter)
_SERVER_MODULE = "verl.workers.rollout.sglang_rollout.async_sglang_server"  # the server actor (SGLangHttpServer)


def _headers() -> dict[str, str]:
    from nemo_gym_adapter.access.key import fetch

    key = fetch()
    return key.header if key is not None else {}


class KeyedRequests:
    """The ``requests`` module as ``http_server_engine`` uses it, with the run's key on ``get`` and ``post``."""

    def __init__(self, requests: Any) -> None:
        self._requests = requests

    def _send(self, method: str, url: str, **kwargs: Any) -> Any:
        kwargs["headers"] = {**_headers(), **(kwargs.get("headers") or {})}
        return getattr(self._requests, method)(url, **kwargs)

    def get(self, url: str, **kwargs: Any) -> Any:
        return self._send("get", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> Any:
        return self._send("post", url, **kwargs)

    def __getattr__(self, name: str) -> Any:  # exceptions, Session, ...: the real module's
        return getattr(self._requests, name)


def _keyed_session(original: Any) -> Any:
    @functools.wraps(original)
    @contextlib.asynccontextmanager
    async def _get_session(self: Any) -> AsyncIterator[Any]:
        async with original(self) as session:
            session.headers.update(_headers())
            yield session

    setattr(_get_session, SENTINEL, original)
    return _get_session


def wrap(module: ModuleType) -> None:
    """Wrap the adapter of verl's ``http_server_engine`` ``module`` (module docstring). Idempotent."""
    adapter = module.AsyncHttpServerAdapter
    if getattr(adapter.__dict__.get("_get_session"), SENTINEL, None) is None:
        adapter._get_session = _keyed_session(adapter._get_session)
    requests = getattr(module, "requests")  # noqa: B009  (the module's own name, not an attribute of ours)
    if not isinstance(requests, KeyedRequests):
        setattr(module, "requests", KeyedRequests(requests))  # noqa: B010
    logger.info("verl's SGLang HTTP adapter sends the run's rollout key (%s)", _MODULE)


def _guarded_launch(original: Any) -> Any:
    @functools.wraps(original)
    async def launch_server(self: Any, *args: Any, **kwargs: Any) -> Any:
        from nemo_gym_adapter.access.guard import install_guard
        from nemo_gym_adapter.access.key import fetch

        key = fetch()
        if key is not None:  # before SGLang's app exists: it never answers without the key
            install_guard([key.value.get_secret_value()])
        return await original(self, *args, **kwargs)

    setattr(launch_server, SENTINEL, original)
    return launch_server


def wrap_server(module: ModuleType) -> None:
    """Wrap verl's ``SGLangHttpServer.launch_server`` in ``async_sglang_server`` ``module`` (module docstring)."""
    server = module.SGLangHttpServer
    if getattr(server.__dict__.get("launch_server"), SENTINEL, None) is None:
        server.launch_server = _guarded_launch(server.launch_server)


WRAPPERS = {_MODULE: wrap, _SERVER_MODULE: wrap_server}


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds verl's SGLang modules (:data:`WRAPPERS`) with the other finders and wraps each once it has executed."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name not in WRAPPERS or name in _SEEN:
            return None
        _SEEN.add(name)  # once per module: the real finders take it from here
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute, wrapper = spec.loader.exec_module, WRAPPERS[name]

        def exec_module(module: ModuleType) -> None:
            execute(module)
            wrapper(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's own loader instance
        return spec


_SEEN: set[str] = set()


def install() -> None:
    """Wrap verl's SGLang modules now where they are imported, else when they are (module docstring)."""
    for name, wrapper in WRAPPERS.items():
        if name in sys.modules:
            wrapper(sys.modules[name])
    if not any(isinstance(f, _WrapOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _WrapOnImport())


install()
