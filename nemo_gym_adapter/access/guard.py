"""Only the run's own clients get into a rollout server: a key checked on every request, before any route runs.

A rollout replica's OpenAI app answers anyone who can reach its port: a stranger's request generates with the run's
weights, fills the engine's queue, or -- on SGLang's admin routes -- changes its weights. So every request must carry
the run's key (``Authorization: Bearer <key>``, what every OpenAI client sends, Gym's model server included), checked
here before routing: a request without it gets a 401 from this guard, its body never read, nothing reaching the
engine.

Why not the engines' own key checks: they leave routes open that this project and Gym call.

============  =========================================================  ==============================================
engine        its own check                                              open without a key
============  =========================================================  ==============================================
vLLM 0.31     ``--api-key``/``VLLM_API_KEY``: paths under ``/v1``,       ``/tokenize``, ``/detokenize``, ``/health``,
              ``/v2``, ``/inference``, ``/cohere`` only                  ``/metrics``, ``/pause``, ``/version``, ...
              (``serve/middleware/authenticate.py`` GUARDED_PREFIX)
vLLM 0.24     the same for ``/v1``, ``/v2``, ``/inference``              the same
              (``serve/utils/server_utils.py``)
SGLang 0.5.12 ``--api-key``: every route but ``/health*`` and            ``/health``, ``/health_generate``, ``/metrics``
              ``/metrics`` (``srt/utils/auth.py`` decide_request_auth)
============  =========================================================  ==============================================

How: Starlette's ``Starlette.__call__`` (FastAPI's calls it for every request; vLLM's and SGLang's apps are FastAPI
apps) is wrapped once per process -- narrowly, visibly, idempotently, like the token-ID patch -- and checks the keys
set by :func:`install_guard`. It guards every Starlette app of the process: in a rollout server's process (verl's
``vllm_server_*``/``sglang_server_*`` actors, ``python -m nemo_gym_adapter.vllm.server``) that is the engine's app
alone. Set before the server answers (the vLLM plugin at engine start, the standalone server before vLLM's main) or
installed live through Ray (:func:`install_on_actors`: the wrapper is looked up per request, so a running app is
guarded from its next request on). Keys are compared as SHA-256 digests in constant time; the key itself is kept
nowhere in the process's state. WebSocket handshakes without the key are closed (uvicorn answers 403).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

try:
    from nemo_gym_adapter.errors import SetupError
except ImportError:  # loaded by path inside a Gym process (access.gym_guard): the trainer's package is not there
    SetupError = RuntimeError  # type: ignore[misc,assignment]

logger = logging.getLogger(__name__)

SENTINEL = "__ngv_original__"  # attribute on the installed wrapper, pointing at Starlette's own __call__
REALM = "nemo-gym-verl"
_LOCK = threading.Lock()
# Process-wide, like the patch: SHA-256 digests of the accepted keys (empty: the guard lets everything through), and
# the header that carries the key (None: ``Authorization: Bearer <key>``; a Gym process: access.gym_guard.HEADER).
_STATE: dict[str, Any] = {"digests": (), "header": None}


@dataclass(frozen=True)
class GuardReport:
    """What :func:`install_guard` did in one process (picklable: it comes back from Ray actors)."""

    pid: int
    keys: int  # how many keys are accepted now
    already_installed: bool  # the wrapper was in place before this call (a key change on a live server)
    actor: str | None = None
    node_ip: str | None = None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8")).digest()


def install_guard(keys: Iterable[str], header: str | None = None) -> GuardReport:
    """Require one of ``keys`` on every HTTP and WebSocket request of every Starlette app in this process (the module
    docstring), as ``Authorization: Bearer <key>`` or, with ``header``, as that header's whole value (Gym's servers:
    their own ``Authorization`` is Gym's business). Idempotent: a second call replaces the accepted keys. Raises
    ``SetupError`` for no key (an empty key would lock nothing out) or a Starlette without ``__call__``."""
    digests = tuple(_digest(k) for k in dict.fromkeys(keys) if k)
    if not digests:
        raise SetupError("the rollout server's access guard needs at least one non-empty key")
    try:
        from starlette.applications import Starlette
    except ImportError as e:
        raise SetupError("the rollout server's access guard needs Starlette (vLLM's and SGLang's web framework)") from e
    with _LOCK:
        current = Starlette.__dict__.get("__call__")
        if current is None:
            raise SetupError("starlette.applications.Starlette has no __call__: the access guard cannot be installed")
        already = getattr(current, SENTINEL, None) is not None
        if not already:
            Starlette.__call__ = _guarded(current)  # type: ignore[method-assign]
            logger.info("nemo-gym-verl access guard installed on starlette.applications.Starlette.__call__")
        _STATE["digests"] = digests
        _STATE["header"] = header.lower().encode("latin-1") if header else None
    return GuardReport(os.getpid(), len(digests), already)


def remove_guard() -> None:
    """Put Starlette's own ``__call__`` back (tests' controls; a server that should answer everyone again)."""
    from starlette.applications import Starlette

    with _LOCK:
        current = Starlette.__dict__.get("__call__")
        original = getattr(current, SENTINEL, None)
        if original is not None:
            Starlette.__call__ = original  # type: ignore[method-assign]
        _STATE["digests"] = ()
        _STATE["header"] = None


def is_guarded() -> bool:
    """True when this process's Starlette apps require a key."""
    try:
        from starlette.applications import Starlette
    except ImportError:
        return False
    return getattr(Starlette.__dict__.get("__call__"), SENTINEL, None) is not None and bool(_STATE["digests"])


def _bearer(scope: Mapping[str, Any]) -> bytes | None:
    """The token of the request's ``Authorization: Bearer <token>`` header (ASGI headers: lower-case bytes)."""
    for name, value in scope.get("headers") or ():
        if name == b"authorization":
            scheme, _, token = bytes(value).strip().partition(b" ")
            return token.strip() if scheme.lower() == b"bearer" and token.strip() else None
    return None


def _presented(scope: Mapping[str, Any]) -> bytes | None:
    """The key the request presents: its bearer token, or the whole value of the guard's own header when one is set."""
    header = _STATE["header"]
    if header is None:
        return _bearer(scope)
    for name, value in scope.get("headers") or ():
        if name == header:
            return bytes(value).strip() or None
    return None


def authorized(scope: Mapping[str, Any]) -> bool:
    """Whether the request of ``scope`` carries an accepted key (always true while no key is set). Every accepted
    digest is compared, in constant time."""
    digests = _STATE["digests"]
    if not digests:
        return True
    token = _presented(scope)
    if token is None:
        return False
    given = hashlib.sha256(token).digest()
    found = False
    for digest in digests:
        found |= hmac.compare_digest(given, digest)
    return found


def refusal(scope: Mapping[str, Any]) -> tuple[int, bytes]:
    """The 401 answer: OpenAI's error shape (``invalid_api_key``: Gym's model client stops retrying a refused key at
    once, as it does for OpenAI), naming what was wrong without echoing anything the client sent."""
    header = _STATE["header"]
    names = [name for name, _ in scope.get("headers") or ()]
    if header is not None:  # a Gym server (access.gym_guard)
        what, send = "server", f"'{header.decode()}: <key>' (docs/CLUSTER.md)"
        why = "the key it carries is not this run's" if header in names else f"it carries no {header.decode()} header"
    else:
        what, send = "rollout server", "'Authorization: Bearer <key>' (Gym's policy_api_key; docs/CLUSTER.md)"
        if _bearer(scope) is not None:
            why = "the key it carries is not this run's"
        elif b"authorization" in names:
            why = "its Authorization header is not 'Bearer <key>'"
        else:
            why = "it carries no Authorization header"
    message = f"{REALM}: this {what} answers only the training run's own clients; {why}. Send the run's key as {send}"
    body = {"error": {"message": message, "type": "authentication_error", "param": None, "code": "invalid_api_key"}}
    return 401, json.dumps(body).encode()


def _guarded(original: Any) -> Any:
    """``Starlette.__call__`` that refuses requests without an accepted key (the module docstring); carries the
    original under :data:`SENTINEL`."""

    @functools.wraps(original)
    async def __call__(self: Any, scope: Any, receive: Any, send: Any) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket") or authorized(scope):
            await original(self, scope, receive, send)
            return
        if kind == "websocket":  # before the handshake is accepted: uvicorn answers 403
            await send({"type": "websocket.close", "code": 1008, "reason": "unauthorized"})
            return
        status, body = refusal(scope)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", f'Bearer realm="{REALM}"'.encode()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    setattr(__call__, SENTINEL, original)
    return __call__


# ------------------------------------------------------------------------------------------------ through Ray


def _install_inside_actor(actor_self: Any, key: str) -> GuardReport:
    """Runs inside a live server actor via ``__ray_call__``."""
    from dataclasses import replace

    from nemo_gym_adapter.runtime.server_actors import actor_identity

    report = install_guard([key])
    name, node_ip = actor_identity(actor_self)
    return replace(report, actor=name, node_ip=node_ip)


def install_on_actors(actor_handles: Mapping[str, Any], key: str, timeout: float = 60.0) -> list[GuardReport]:
    """:func:`install_guard` with ``key`` inside every rollout server actor (verl's ``vllm_server_*`` or
    ``sglang_server_*``, any engine: the guard is Starlette's); one report per actor, or a ``ServerError`` naming the
    actor that failed or did not answer. The key travels as a Ray task argument, never logged."""
    from nemo_gym_adapter.runtime.server_actors import call_on_actors

    return call_on_actors(
        actor_handles, _install_inside_actor, key, timeout=timeout, what="rollout server access guard"
    )
