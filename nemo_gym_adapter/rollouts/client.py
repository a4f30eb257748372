"""Send a step's rows to NeMo Gym's ``/run`` endpoints and get one outcome back per row, in input order.

Gym runs in its own venv; this module only speaks HTTP (aiohttp) and never imports ``nemo_gym``.

Each row is POSTed to ``/run`` of the environment server fronting its agent (:class:`routing.GymRoutes`, computed
once per Gym); a row that cannot be routed is never sent.

Failure policy (STYLE.md §5): one retry point (:func:`post_with_retries`), retrying connection errors only, capped
and logged. A timeout or an HTTP error answer is never retried: the rollout may have run (and cost minutes), so it
becomes a :class:`RolloutFailure` record and the batch goes on. Every input row yields exactly one
:class:`RolloutOutcome`, handed to the caller's ``on_outcome`` hook as soon as it exists (completion order) and
returned with the others in input order. A hook that raises fails the whole call: the rows still in flight are
cancelled and awaited (no orphan tasks), then the hook's exception propagates.

Every send carries a fresh ``_ng_rollout_id`` (Gym keys token-ID capture and prefix supply by it; a row's own is
replaced), and a row's Gym capture files are removed once its outcome was handed on
(:mod:`~nemo_gym_adapter.gym.capture`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

try:  # parsing token-id-heavy results is most of the client's CPU; orjson does it ~5x faster (Gym's client uses it)
    import orjson
except ImportError:  # pragma: no cover - optional speed-up, same results
    orjson = None  # type: ignore[assignment]  # a module or None: checked before each use

from nemo_gym_adapter.data.routing import GymRoutes, Route, Unroutable
from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.gym import capture
from nemo_gym_adapter.gym.liveness import SERVER_DOWN as SERVER_DOWN  # a reason too: a server the row needs is dead
from nemo_gym_adapter.gym.liveness import StepGuard
from nemo_gym_adapter.loop_thread import BlockingFacade
from nemo_gym_adapter.progress import RolloutProgress
from nemo_gym_adapter.rollouts.gym_errors import GymErrorOrigin, gym_error_origin
from nemo_gym_adapter.rollouts.sampling import request_params

logger = logging.getLogger(__name__)

# Reason codes of RolloutFailure (plus "http_<status>" for any error answer).
TIMEOUT = "timeout"
CONNECTION = "connection"
BAD_JSON = "bad_json"
CLIENT_ERROR = "client_error"

# uvicorn (Gym's servers) closes idle keep-alive connections after 5 s. Reusing one just as the server closes it
# gives a spurious ServerDisconnectedError, so we drop idle connections a little earlier.
_KEEPALIVE_S = 4.0
_DETAIL_CHARS = 600


@dataclass(frozen=True)
class RolloutFailure:
    """Why one row produced no Gym result.

    ``reason`` is low-cardinality and safe to group by (``timeout``, ``connection``, ``http_<status>``,
    ``bad_json``, ``unknown_agent``, ``ambiguous_agent``, ``client_error``, ``server_down``); ``detail`` is the human-readable
    occurrence (it names the server, URL and row); ``status`` is the HTTP status when the server answered.
    """

    reason: str
    detail: str
    status: int | None = None
    origin: GymErrorOrigin | None = None  # for a 5xx: where Gym's error chain started (rollouts.gym_errors)


@dataclass(frozen=True)
class RolloutOutcome:
    """What became of one input row: exactly one of ``result`` (Gym's ``/run`` JSON) and ``failure`` is set.

    ``index`` is the row's position in the batch; ``agent`` the agent it routed to (None if unroutable);
    ``server`` the environment server that served ``/run``; ``latency_s`` the wall time from the first send to the
    last byte (0 for rows never sent); ``attempts`` how many times it was sent (>1 only after connection errors);
    ``rollout_ids`` the ``_ng_rollout_id`` of each send (the last one is what Gym answered, if it did).
    """

    index: int
    agent: str | None
    server: str | None
    latency_s: float
    attempts: int
    result: dict[str, Any] | None = None
    failure: RolloutFailure | None = None
    rollout_ids: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class RolloutClientConfig:
    """Knobs of the client. ``progress=None`` shows the bar only when stderr is a TTY."""

    max_concurrency: int = 64
    timeout_s: float = 900.0
    max_connection_retries: int = 3
    retry_backoff_s: float = 0.5
    progress: bool | None = None
    key_prefix: str = "rollout_client"

    def __post_init__(self) -> None:
        checks = {
            "max_concurrency": self.max_concurrency >= 1,
            "timeout_s": self.timeout_s > 0,
            "max_connection_retries": self.max_connection_retries >= 0,
            "retry_backoff_s": self.retry_backoff_s >= 0,
        }
        for key, ok in checks.items():
            if not ok:
                raise AdapterConfigError(
                    f"{self.key_prefix}.{key}={getattr(self, key)!r} is invalid: "
                    "max_concurrency must be >= 1, timeout_s > 0, the others >= 0"
                )


def apply_overrides(row: Mapping[str, Any], agent: str, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The request body for one row: a copy with ``agent_ref`` stamped and ``responses_create_params`` overridden.

    The input row is never mutated (verl reuses its rows; the older recipe's in-place edits leaked between
    steps). ``None`` override values are skipped, so a trainer can pass ``top_p=None`` to mean "row's own";
    ``max_output_tokens`` caps the row's own and engine fields join its ``metadata.extra_body``
    (:func:`~nemo_gym_adapter.rollouts.sampling.request_params`).
    """
    body = dict(row)
    body["responses_create_params"] = request_params(row.get("responses_create_params"), overrides)
    # Gym's collector stamps the resolved agent too, so results carry it whatever the row routed by.
    body["agent_ref"] = {"name": agent}
    return body


def _dumps(obj: Any) -> bytes:
    # orjson rejects what json accepts in a few corners (non-str keys, ints > 64 bit): fall back rather than fail.
    if orjson is not None:
        try:
            return orjson.dumps(obj)
        except TypeError:
            pass
    return json.dumps(obj).encode()


def _loads(body: bytes) -> Any:
    return orjson.loads(body) if orjson is not None else json.loads(body)


OutcomeHook = Callable[["RolloutOutcome"], "Awaitable[None] | None"]
"""Called once per row as soon as its outcome exists (completion order); may be sync or async."""


class RolloutClient:
    """Async client: ``await client.run(rows)`` → one :class:`RolloutOutcome` per row, in input order.

    One shared ``aiohttp.ClientSession`` per client (create it inside the event loop that will use it; use
    ``async with`` or :meth:`close`). Its connector holds at most ``max_concurrency`` connections; concurrent
    :meth:`run` calls share them, each bounded by ``max_concurrency`` on its own.
    """

    def __init__(self, routes: GymRoutes, config: RolloutClientConfig | None = None) -> None:
        self.routes = routes
        self.config = config or RolloutClientConfig()
        self._session: aiohttp.ClientSession | None = None
        self.resends = 0  # sends after a connection error, since the client was made (rows that were sent again)

    @classmethod
    async def connect(cls, head_url: str, config: RolloutClientConfig | None = None) -> RolloutClient:
        """Fetch the routes from a running Gym's head server and return a ready client."""
        return cls(await GymRoutes.fetch(head_url), config)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = _new_session(self.config.max_concurrency)
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(
        self,
        rows: Sequence[Mapping[str, Any]],
        overrides: Mapping[str, Any] | None = None,
        desc: str = "Gym rollouts",
        on_outcome: OutcomeHook | None = None,
        guard: StepGuard | None = None,
    ) -> list[RolloutOutcome]:
        """Run every row through its environment server's ``/run``; never raises for a single row's failure.

        With a ``guard`` (:class:`liveness.StepGuard`), a row whose servers are (or go) down is not sent (or is cut)
        and fails with reason ``server_down``; a connection error makes the guard probe at once.

        ``overrides`` are applied to each row's ``responses_create_params`` (e.g. ``temperature``, ``top_p``,
        ``max_output_tokens`` from the trainer's rollout config) on a copy. ``on_outcome`` sees each outcome the
        moment it exists; if it raises, the rows still in flight are cancelled and awaited, then the error
        propagates (the module docstring's failure policy).
        """
        session = self._get_session()
        slots = asyncio.Semaphore(self.config.max_concurrency)

        async def one(index: int, row: Mapping[str, Any], progress: RolloutProgress) -> RolloutOutcome:
            outcome = await self._run_one(session, slots, index, row, overrides, guard)
            progress.update(outcome)
            try:
                if on_outcome is not None:
                    done = on_outcome(outcome)
                    if inspect.isawaitable(done):
                        await done
            finally:
                capture.retire(self.routes.capture_dir, outcome.rollout_ids)
            return outcome

        with RolloutProgress(len(rows), self.config.progress, desc) as progress:
            tasks = [asyncio.ensure_future(one(i, row, progress)) for i, row in enumerate(rows)]
            try:
                return list(await asyncio.gather(*tasks))
            except BaseException:
                for task in tasks:  # gather does not cancel the others when one raises
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise

    async def _run_one(
        self,
        session: aiohttp.ClientSession,
        slots: asyncio.Semaphore,
        index: int,
        row: Mapping[str, Any],
        overrides: Mapping[str, Any] | None,
        guard: StepGuard | None = None,
    ) -> RolloutOutcome:
        if not isinstance(row, Mapping):
            failure = RolloutFailure(CLIENT_ERROR, f"row {index} is a {type(row).__name__}, not a JSON object")
            return RolloutOutcome(index, None, None, 0.0, 0, failure=failure)
        resolved = self.routes.resolve(row, index)
        if isinstance(resolved, Unroutable):
            logger.warning("row %d not sent: %s", index, resolved.detail)
            failure = RolloutFailure(resolved.reason, resolved.detail)
            return RolloutOutcome(index, None, None, 0.0, 0, failure=failure)
        agent, route = resolved
        rollout_ids = [capture.new_rollout_id()]
        try:
            body = apply_overrides(row, agent, overrides)
            body[capture.ROLLOUT_ID_KEY] = rollout_ids[0]
            payload = _dumps(body)
        except (TypeError, ValueError) as e:
            failure = RolloutFailure(CLIENT_ERROR, f"row {index} for agent {agent!r} is not JSON-serialisable: {e}")
            return RolloutOutcome(index, agent, route.server, 0.0, 0, failure=failure)

        attempts = [0]
        down = guard.down_reason(agent) if guard is not None else None
        if down is not None:
            return RolloutOutcome(index, agent, route.server, 0.0, 0, failure=RolloutFailure(SERVER_DOWN, down))
        async with slots:  # the deadline starts once a slot is ours, not while queued behind other rows
            t0 = time.monotonic()
            try:
                on_error = guard.suspect if guard is not None else None
                work = post_with_retries(session, route, index, payload, attempts, self.config, on_error, rollout_ids)
                result = await _within(guard.run(agent, work) if guard is not None else work, self.config.timeout_s)
                if isinstance(result, str):
                    result = RolloutFailure(SERVER_DOWN, f"row {index} ({route.server}) cut: {result}")
                elif guard is not None and isinstance(result, RolloutFailure) and _infra(result):
                    why = await guard.confirm(agent)
                    if why is not None:
                        result = RolloutFailure(SERVER_DOWN, f"{result.detail}; {why}")
            except asyncio.TimeoutError:
                result = RolloutFailure(
                    TIMEOUT,
                    f"row {index}: no answer from {route.server} ({route.run_url}) within "
                    f"{self.config.timeout_s:g}s (after {attempts[0]} attempt(s))",
                )
            except aiohttp.ClientError as e:  # anything aiohttp raises that is neither transport nor timeout
                result = RolloutFailure(CLIENT_ERROR, f"row {index}: {route.server} ({route.run_url}): {e!r}")
            latency = time.monotonic() - t0
            self.resends += max(0, attempts[0] - 1)
        ids = tuple(rollout_ids)
        if isinstance(result, RolloutFailure):
            return RolloutOutcome(index, agent, route.server, latency, attempts[0], failure=result, rollout_ids=ids)
        return RolloutOutcome(index, agent, route.server, latency, attempts[0], result=result, rollout_ids=ids)


async def _within(work: Awaitable[Any], timeout_s: float) -> Any:
    """``await work`` with a deadline (``asyncio.TimeoutError`` when it passes; ``work`` is then cancelled).

    ``asyncio.timeout`` (Python >= 3.11) runs ``work`` in the caller's task; ``asyncio.wait_for`` before 3.12 wraps
    it in a task of its own, one more task per rollout for the event loop to create and schedule."""
    timeout = getattr(asyncio, "timeout", None)
    if timeout is None:  # pragma: no cover - Python 3.10
        return await asyncio.wait_for(work, timeout_s)
    async with timeout(timeout_s):
        return await work


def _infra(failure: RolloutFailure) -> bool:
    """A failure a dead server can explain (connection error, 5xx from a relay whose agent died): probe first."""
    return failure.reason == CONNECTION or (failure.status is not None and failure.status >= 500)


def _new_session(max_concurrency: int) -> aiohttp.ClientSession:
    """The client's HTTP session (call inside the event loop that will use it)."""
    connector = aiohttp.TCPConnector(limit=max_concurrency, limit_per_host=0, keepalive_timeout=_KEEPALIVE_S)
    return aiohttp.ClientSession(
        connector=connector,
        # We enforce the per-rollout deadline ourselves (it spans retries), so aiohttp's own is off.
        timeout=aiohttp.ClientTimeout(total=None),
        # Gym's agents answer with session cookies (simple_agent relays the resources server's). A shared
        # jar would send one rollout's session to the next; Gym's own client drops them the same way.
        cookie_jar=aiohttp.DummyCookieJar(),
        headers={"Content-Type": "application/json"},
    )


async def post_with_retries(
    session: aiohttp.ClientSession,
    route: Route,
    index: int,
    payload: bytes,
    attempts: list[int],
    config: RolloutClientConfig,
    on_connection_error: Callable[[], None] | None = None,
    rollout_ids: list[str] | None = None,
) -> dict[str, Any] | RolloutFailure:
    """The one retry point: resend on connection errors only, at most ``max_connection_retries`` times.

    ``attempts[0]`` counts the sends (a list, so the caller still knows it when a deadline cancels this);
    ``on_connection_error`` is told of each connection error (the liveness guard then probes at once);
    ``rollout_ids``: the ``_ng_rollout_id`` in ``payload``; each resend gets a new one, appended (the first send may
    have reached Gym and begun capturing under its id).
    """
    cap = config.max_connection_retries
    while True:
        attempts[0] += 1
        try:
            async with session.post(route.run_url, data=payload) as response:
                status = response.status
                body = await response.read()
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
    if status >= 400:
        text = body[:_DETAIL_CHARS].decode("utf-8", errors="replace")
        origin = gym_error_origin(body.decode("utf-8", errors="replace")) if status >= 500 else None
        detail = f"row {index}: {route.server} ({route.run_url}) answered {status}: {text}"
        return RolloutFailure(f"http_{status}", detail, status, origin)
    try:
        result = _loads(body)
    except ValueError as e:  # orjson.JSONDecodeError is a ValueError too
        result = e
    if not isinstance(result, dict):
        text = body[:200].decode("utf-8", errors="replace")
        return RolloutFailure(
            BAD_JSON, f"row {index}: {route.server} answered {status} without a JSON object ({text!r})", status
        )
    return result


class BlockingRolloutClient(BlockingFacade):
    """Synchronous facade for non-async callers: a :class:`RolloutClient` on its own event-loop thread."""

    def __init__(self, routes: GymRoutes, config: RolloutClientConfig | None = None) -> None:
        self.routes = routes
        self.config = config or RolloutClientConfig()
        self._client = RolloutClient(routes, self.config)
        super().__init__("gym-rollout-client", self._client.close)

    @classmethod
    def connect(cls, head_url: str, config: RolloutClientConfig | None = None) -> BlockingRolloutClient:
        """Fetch the routes from a running Gym's head server (blocking) and return a ready client."""
        return cls(GymRoutes.fetch_blocking(head_url), config)

    def run(
        self,
        rows: Sequence[Mapping[str, Any]],
        overrides: Mapping[str, Any] | None = None,
        desc: str = "Gym rollouts",
        on_outcome: OutcomeHook | None = None,
    ) -> list[RolloutOutcome]:
        """Blocking :meth:`RolloutClient.run` (``on_outcome`` runs in the client's loop thread)."""
        return self._loop.run(self._client.run(rows, overrides=overrides, desc=desc, on_outcome=on_outcome))
