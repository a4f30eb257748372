"""Send a step's rows to NeMo Gym's ``/run`` endpoints and get one outcome back per row, in input order.

Gym runs in its own venv; this module only speaks HTTP (aiohttp) and never imports ``nemo_gym``.

Each row is POSTed to ``/run`` of the environment server fronting its agent (:class:`routing.GymRoutes`, computed
once per Gym); a row that cannot be routed is never sent.

Failure policy (STYLE.md §5): one retry point (:func:`transport.post_with_retries`), retrying connection errors only,
capped and logged; a body is read up to ``max_body_mb`` and no further (:func:`transport.read_body`). A timeout or an HTTP error answer is never retried: the rollout may have run (and cost minutes), so it
becomes a :class:`RolloutFailure` record and the batch goes on. Every input row yields exactly one
:class:`RolloutOutcome`, handed to the caller's ``on_outcome`` hook as soon as it exists (completion order) and
returned with the others in input order. A hook that raises fails the whole call: the rows still in flight are
cancelled and awaited (no orphan tasks), then the hook's exception propagates.

A result that echoes another row's verifier fields (``row_echo.other_row_fields``: Gym's resources servers return the
request's fields as they got them) is a ``wrong_row`` failure, never trained as this row's reward.

The records live in :mod:`~nemo_gym_adapter.rollouts.records`, the HTTP side in :mod:`~nemo_gym_adapter.rollouts.transport`;
both are re-exported here. Every send carries a fresh ``_ng_rollout_id`` (Gym keys token-ID capture and prefix supply by it; a row's own is
replaced), and a row's Gym capture files are removed once its outcome was handed on
(:mod:`~nemo_gym_adapter.gym.capture`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from nemo_gym_adapter.console.progress import RolloutProgress
from nemo_gym_adapter.data.routing import GymRoutes, Unroutable
from nemo_gym_adapter.errors import GymServerError
from nemo_gym_adapter.gym import capture
from nemo_gym_adapter.gym.head import GymHead
from nemo_gym_adapter.gym.liveness import StepGuard
from nemo_gym_adapter.rollouts.records import (
    BAD_JSON,
    CLIENT_ERROR,
    CONNECTION,
    SERVER_DOWN,
    TIMEOUT,
    TOO_LARGE,
    WRONG_ROW,
    OutcomeHook,
    RolloutFailure,
    RolloutOutcome,
)
from nemo_gym_adapter.rollouts.row_echo import other_row_fields
from nemo_gym_adapter.rollouts.sampling import request_params
from nemo_gym_adapter.rollouts.transport import (
    Resends,
    RolloutClientConfig,
    dumps,
    is_infra,
    new_session,
    post_with_retries,
    within,
)
from nemo_gym_adapter.runtime.loop_thread import BlockingFacade

logger = logging.getLogger(__name__)

__all__ = [  # the records and knobs callers import from here (records, transport)
    "BAD_JSON",
    "CLIENT_ERROR",
    "CONNECTION",
    "SERVER_DOWN",
    "TIMEOUT",
    "TOO_LARGE",
    "WRONG_ROW",
    "BlockingRolloutClient",
    "GymRoutes",
    "OutcomeHook",
    "RolloutClient",
    "RolloutClientConfig",
    "RolloutFailure",
    "RolloutOutcome",
    "apply_overrides",
    "read_routes",
]


def read_routes(head_url: str) -> GymRoutes:
    """The routes of the Gym whose head server is ``head_url``, read through :class:`~nemo_gym_adapter.gym.head.GymHead`
    (its config and server instances, with the run's key; its token-ID capture directory). ``GymServerError`` naming
    the head server when nothing answers there."""
    try:
        return GymHead(head_url).routes()
    except OSError as e:
        raise GymServerError(f"Gym head server {head_url}: not reachable ({e})") from e


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
        self._resends = Resends()  # counted by transport.post_with_retries

    @property
    def resends(self) -> int:
        """Sends after a connection error since the client was made (rows sent again; ``core.resend_metrics``)."""
        return self._resends.count

    @classmethod
    async def connect(cls, head_url: str, config: RolloutClientConfig | None = None) -> RolloutClient:
        """Read the routes from a running Gym's head server (:func:`read_routes`) and return a ready client."""
        return cls(await asyncio.to_thread(read_routes, head_url), config)

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = new_session(self.config.max_concurrency)
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
            payload = dumps(body)
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
                work = post_with_retries(
                    session, route, index, payload, attempts, self.config, on_error, rollout_ids, self._resends
                )
                result = await within(guard.run(agent, work) if guard is not None else work, self.config.timeout_s)
                if isinstance(result, str):
                    result = RolloutFailure(SERVER_DOWN, f"row {index} ({route.server}) cut: {result}")
                elif guard is not None and isinstance(result, RolloutFailure) and is_infra(result):
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
        if isinstance(result, dict):
            clash = other_row_fields(row, result)
            if clash:
                result = RolloutFailure(
                    WRONG_ROW, f"row {index}: {route.server} answered with another row's result: {'; '.join(clash)}"
                )
        ids = tuple(rollout_ids)
        if isinstance(result, RolloutFailure):
            return RolloutOutcome(index, agent, route.server, latency, attempts[0], failure=result, rollout_ids=ids)
        return RolloutOutcome(index, agent, route.server, latency, attempts[0], result=result, rollout_ids=ids)


class BlockingRolloutClient(BlockingFacade):
    """Synchronous facade for non-async callers: a :class:`RolloutClient` on its own event-loop thread."""

    def __init__(self, routes: GymRoutes, config: RolloutClientConfig | None = None) -> None:
        self.routes = routes
        self.config = config or RolloutClientConfig()
        self._client = RolloutClient(routes, self.config)
        super().__init__("gym-rollout-client", self._client.close)

    @classmethod
    def connect(cls, head_url: str, config: RolloutClientConfig | None = None) -> BlockingRolloutClient:
        """Read the routes from a running Gym's head server (blocking, :func:`read_routes`) and return a ready client."""
        return cls(read_routes(head_url), config)

    def run(
        self,
        rows: Sequence[Mapping[str, Any]],
        overrides: Mapping[str, Any] | None = None,
        desc: str = "Gym rollouts",
        on_outcome: OutcomeHook | None = None,
    ) -> list[RolloutOutcome]:
        """Blocking :meth:`RolloutClient.run` (``on_outcome`` runs in the client's loop thread)."""
        return self._loop.run(self._client.run(rows, overrides=overrides, desc=desc, on_outcome=on_outcome))
