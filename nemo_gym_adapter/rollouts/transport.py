"""One row's ``/run`` over HTTP: the client's knobs, its session, the one retry point and a bounded body read.

What a Gym server sends back is not trusted to be small or to end: :func:`read_body` reads at most
``max_body_mb`` (a declared ``Content-Length`` over it is refused before a byte is read, a streamed body the moment
it passes it) and the connection is then closed, so a 50 MB result, a body that never ends or a server that
streams garbage costs one row (``too_large``) and a bounded buffer, never the process's memory. A body that stops
halfway (connection reset, truncated ``Content-Length``) is a connection error: no result exists, so it is resent
(:func:`post_with_retries`, capped). Imported by :mod:`~nemo_gym_adapter.rollouts.client` only.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

try:  # parsing token-id-heavy results is most of the client's CPU; orjson does it ~5x faster (Gym's client uses it)
    import orjson
except ImportError:  # pragma: no cover - optional speed-up, same results
    orjson = None  # type: ignore[assignment]  # a module or None: checked before each use

from nemo_gym_adapter.access.gym_guard import client_headers
from nemo_gym_adapter.data.routing import Route
from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.gym import capture
from nemo_gym_adapter.rollouts.gym_errors import gym_error_origin
from nemo_gym_adapter.rollouts.records import BAD_JSON, CONNECTION, TOO_LARGE, RolloutFailure

logger = logging.getLogger(__name__)

# uvicorn (Gym's servers) closes idle keep-alive connections after 5 s. Reusing one just as the server closes it
# gives a spurious ServerDisconnectedError, so we drop idle connections a little earlier.
_KEEPALIVE_S = 4.0
_DETAIL_CHARS = 600
MIB = 1024 * 1024


@dataclass(frozen=True)
class RolloutClientConfig:
    """Knobs of the client (``nemo_gym.client``). ``progress=None`` shows the bar only when stderr is a TTY.

    ``max_body_mb``: the largest ``/run`` body read (MiB). A Gym result repeats every model call's prompt ids, so a
    long multi-turn rollout can reach tens of MB; 128 MiB leaves room for those and bounds what one row may buffer
    (at most ``max_concurrency`` x this, all rows at once)."""

    max_concurrency: int = 64
    timeout_s: float = 900.0
    max_connection_retries: int = 3
    retry_backoff_s: float = 0.5
    progress: bool | None = None
    key_prefix: str = "rollout_client"
    max_body_mb: float = 128.0

    def __post_init__(self) -> None:
        checks = {
            "max_concurrency": self.max_concurrency >= 1,
            "timeout_s": self.timeout_s > 0,
            "max_connection_retries": self.max_connection_retries >= 0,
            "retry_backoff_s": self.retry_backoff_s >= 0,
            "max_body_mb": self.max_body_mb > 0,
        }
        for key, ok in checks.items():
            if not ok:
                raise AdapterConfigError(
                    f"{self.key_prefix}.{key}={getattr(self, key)!r} is invalid: "
                    "max_concurrency must be >= 1, timeout_s and max_body_mb > 0, the others >= 0"
                )

    @property
    def max_body_bytes(self) -> int:
        return int(self.max_body_mb * MIB)


@dataclass
class Resends:
    """Sends after a connection error (a row sent again), counted where they happen (:func:`post_with_retries`);
    one per client, so a run's total is visible (``<prefix>/client/resends_total``, ``core.resend_metrics``)."""

    count: int = 0


def dumps(obj: Any) -> bytes:
    # orjson rejects what json accepts in a few corners (non-str keys, ints > 64 bit): fall back rather than fail.
    if orjson is not None:
        try:
            return orjson.dumps(obj)
        except TypeError:
            pass
    return json.dumps(obj).encode()


def loads(body: bytes) -> Any:
    return orjson.loads(body) if orjson is not None else json.loads(body)


def new_session(max_concurrency: int) -> aiohttp.ClientSession:
    """The client's HTTP session (call inside the event loop that will use it)."""
    connector = aiohttp.TCPConnector(limit=max_concurrency, limit_per_host=0, keepalive_timeout=_KEEPALIVE_S)
    return aiohttp.ClientSession(
        connector=connector,
        # We enforce the per-rollout deadline ourselves (it spans retries), so aiohttp's own is off.
        timeout=aiohttp.ClientTimeout(total=None),
        # Gym's agents answer with session cookies (simple_agent relays the resources server's). A shared
        # jar would send one rollout's session to the next; Gym's own client drops them the same way.
        cookie_jar=aiohttp.DummyCookieJar(),
        # the run's key when Gym's servers require it (nemo_gym.access.guard_gym)
        headers={"Content-Type": "application/json", **client_headers()},
    )


async def within(work: Awaitable[Any], timeout_s: float) -> Any:
    """``await work`` with a deadline (``asyncio.TimeoutError`` when it passes; ``work`` is then cancelled).

    ``asyncio.timeout`` (Python >= 3.11) runs ``work`` in the caller's task; ``asyncio.wait_for`` before 3.12 wraps
    it in a task of its own, one more task per rollout for the event loop to create and schedule."""
    timeout = getattr(asyncio, "timeout", None)
    if timeout is None:  # pragma: no cover - Python 3.10
        return await asyncio.wait_for(work, timeout_s)
    async with timeout(timeout_s):
        return await work


def is_infra(failure: RolloutFailure) -> bool:
    """A failure a dead server can explain (connection error, 5xx from a relay whose agent died): probe first."""
    return failure.reason == CONNECTION or (failure.status is not None and failure.status >= 500)


async def read_body(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The whole body, or None as soon as it is known to exceed ``limit`` bytes: a declared ``Content-Length`` over it
    (nothing read), or the first chunk that takes it over (at most ``limit`` + one chunk held). The caller closes the
    connection then (:func:`post_with_retries`); an incomplete body raises ``aiohttp.ClientPayloadError``."""
    declared = response.content_length
    if declared is not None:  # aiohttp reads exactly that much, never more
        return await response.read() if declared <= limit else None
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await response.content.readany()
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)


async def post_with_retries(
    session: aiohttp.ClientSession,
    route: Route,
    index: int,
    payload: bytes,
    attempts: list[int],
    config: RolloutClientConfig,
    on_connection_error: Callable[[], None] | None = None,
    rollout_ids: list[str] | None = None,
    resends: Resends | None = None,
) -> dict[str, Any] | RolloutFailure:
    """The one retry point: resend on connection errors only, at most ``max_connection_retries`` times.

    ``attempts[0]`` counts the sends (a list, so the caller still knows it when a deadline cancels this);
    ``on_connection_error`` is told of each connection error (the liveness guard then probes at once);
    ``rollout_ids``: the ``_ng_rollout_id`` in ``payload``; each resend gets a new one, appended (the first send may
    have reached Gym and begun capturing under its id); ``resends`` counts every send after the first (so it equals
    ``attempts[0] - 1`` summed over rows). A body over ``max_body_mb`` is a ``too_large`` failure, never resent (the
    server answered; it would answer the same).
    """
    cap = config.max_connection_retries
    limit = config.max_body_bytes
    declared: int | None = None
    while True:
        attempts[0] += 1
        if attempts[0] > 1 and resends is not None:
            resends.count += 1
        try:
            async with session.post(route.run_url, data=payload) as response:
                status = response.status
                body = await read_body(response, limit)
                if body is None:
                    declared = response.content_length
                    response.close()  # drop the connection: the rest of the body is never read
            break
        except asyncio.TimeoutError:
            raise  # checked first: aiohttp's ServerTimeoutError is also a ClientConnectionError
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            # Refused, reset, or the server died mid-answer: no result exists, so resending is safe.
            if on_connection_error is not None:
                on_connection_error()
            if attempts[0] > cap:
                return RolloutFailure(
                    CONNECTION,
                    f"row {index}: cannot reach {route.server} ({route.run_url}) after {attempts[0]} attempt(s): {e!r}",
                )
            delay = config.retry_backoff_s * 2 ** (attempts[0] - 1)
            logger.warning(
                "row %d: connection error from %s (%s), retry %d/%d in %.1fs: %r",
                index, route.server, route.run_url, attempts[0], cap, delay, e,
            )  # fmt: skip
            await asyncio.sleep(delay)
            if rollout_ids:  # the id is a unique 36-character token: it occurs once in the payload
                rollout_ids.append(capture.new_rollout_id())
                payload = payload.replace(rollout_ids[-2].encode(), rollout_ids[-1].encode())
    if body is None:
        size = f"declares {declared} bytes" if declared is not None else f"streamed past {limit} bytes"
        return RolloutFailure(
            TOO_LARGE,
            f"row {index}: {route.server} ({route.run_url}) answered {status} with a body that {size}, over "
            f"{config.key_prefix}.max_body_mb={config.max_body_mb:g}; refused while reading (raise the key if this "
            "environment's results are legitimately that large)",
            status,
        )
    if status >= 400:
        text = body[:_DETAIL_CHARS].decode("utf-8", errors="replace")
        origin = gym_error_origin(body.decode("utf-8", errors="replace")) if status >= 500 else None
        detail = f"row {index}: {route.server} ({route.run_url}) answered {status}: {text}"
        return RolloutFailure(f"http_{status}", detail, status, origin)
    try:
        result = loads(body)
    except ValueError as e:  # orjson.JSONDecodeError is a ValueError too
        result = e
    if not isinstance(result, dict):
        text = body[:200].decode("utf-8", errors="replace")
        return RolloutFailure(
            BAD_JSON, f"row {index}: {route.server} answered {status} without a JSON object ({text!r})", status
        )
    return result
