"""One step's rollouts, trainer-agnostic: rows → NeMo Gym → outcomes → token trajectories → metrics.

Every trainer path is a thin adapter over :class:`RolloutCore` (it never imports verl): verl's legacy manager pads the
trajectories into a ``DataProto``; the v1 manager puts each row into TransferQueue as it finishes; ``collect`` writes
JSONL. One step::

    async with RolloutCore(routes, TrajectoryConfig(prompt_length=P, response_length=R)) as core:
        step = await core.run_step(rows, envs, {"temperature": 1.0}, on_row=put_into_queue)
    step.rows            # RowResult per input row, in input order: index, env, outcome, trajectory
    step.trajectories    # the same trajectories, in input order
    step.metrics         # metrics.compute_metrics(...) + "<prefix>/timing/{rollout_s,rollouts_per_s}"
                         #   + "<prefix>/client/{resends,resends_total}" (rows sent again after connection errors)

Rows are sent to Gym unmodified (``client.apply_overrides`` copies them), except that a row without routing
(neither ``agent_ref`` nor ``task_source``: Gym's bundled examples, routed by a default agent) is sent with
``agent_ref`` = its environment name. Every input row yields exactly one :class:`RowResult`: a row Gym could not
serve is a masked trajectory with a counted reason (``trajectory.MaskReason``), never an exception.

``on_row`` (sync or async) is called once per row as soon as its trajectory is built, in completion order, inside
the event loop that runs the step. **When it raises**, the step fails loudly: the rows still in flight are
cancelled and awaited (no orphan tasks; Gym may still finish them server-side, their results are dropped) and
:class:`RowCallbackError` is raised, naming the row and chaining the callback's exception. The same holds for a
``TokenAlignmentError`` from ``contiguity="raise"``. Concurrent ``run_step`` calls on one core are allowed (each has
its own concurrency bound; they share the HTTP connection pool).

While a step's results arrive, Python's automatic cyclic garbage collection is paused process-wide, with a young
collection every :data:`GC_YOUNG_EVERY` rows and at the step's end (:func:`gc_paused`; ``NGV_GC_PAUSE=0`` opts out).

:class:`BlockingRolloutCore` is the same for synchronous callers (verl's legacy ``generate_sequences``): the core on
its own event-loop thread (``loop_thread.LoopThread``), ``on_row`` running in that thread.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from nemo_gym_adapter.data.routing import GymRoutes
from nemo_gym_adapter.errors import AdapterError
from nemo_gym_adapter.gym.liveness import Liveness, StepGuard
from nemo_gym_adapter.rollouts.client import RolloutClient, RolloutClientConfig, RolloutOutcome
from nemo_gym_adapter.rollouts.metrics import compute_metrics
from nemo_gym_adapter.rollouts.outcome import trajectories_from_outcome
from nemo_gym_adapter.rollouts.trajectory import Trajectory, TrajectoryConfig
from nemo_gym_adapter.runtime.loop_thread import BlockingFacade


@dataclass(frozen=True)
class RowResult:
    """One input row after Gym: its position in the step, environment, the client's outcome and the trajectory.

    ``segments``: under ``contiguity="split"``, a rollout whose calls do not form one history is one trajectory per
    segment (``trajectory`` is the first); empty otherwise. ``samples`` is what training gets either way."""

    index: int
    env: str
    outcome: RolloutOutcome
    trajectory: Trajectory
    segments: tuple[Trajectory, ...] = ()

    @property
    def samples(self) -> tuple[Trajectory, ...]:
        return self.segments or (self.trajectory,)


@dataclass(frozen=True)
class StepResult:
    """A step's rows in input order, its metrics (flat, for a trainer's logger) and timings (seconds)."""

    rows: list[RowResult]
    metrics: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def trajectories(self) -> list[Trajectory]:
        return [row.trajectory for row in self.rows]


RowCallback = Callable[[RowResult], "Awaitable[None] | None"]


class RowCallbackError(AdapterError):
    """``on_row`` raised for row ``row_index``; the step was aborted (its ``__cause__`` is the callback's error)."""

    def __init__(self, message: str, row_index: int) -> None:
        super().__init__(message)
        self.row_index = row_index


class RolloutCore:
    """Runs a step's rows through Gym and turns what comes back into trajectories and metrics (module docstring).

    Args:
        routes: the running Gym's routes (``GymServers.routes()`` or ``client.read_routes``).
        trajectory: lengths and masking policy of the trajectories (the trainer's prompt/response lengths).
        client: HTTP knobs (concurrency, timeout, retries, progress bar).
        success_threshold: reward at or above which a sample counts as a success (default: reward > 0).
        metrics_prefix: first part of every metric key.
        liveness: probes the servers before each step and during it (:mod:`nemo_gym_adapter.gym.liveness`): rows bound
            for a dead server become ``server_down`` rows, ``on_server_down`` may restart Gym or fail the step.

    Create it (or at least call :meth:`run_step` first) inside the event loop that will use it: the HTTP session
    belongs to that loop. ``async with`` or :meth:`aclose` closes it.
    """

    def __init__(
        self,
        routes: GymRoutes,
        trajectory: TrajectoryConfig,
        client: RolloutClientConfig | None = None,
        *,
        success_threshold: float | None = None,
        metrics_prefix: str = "gym",
        liveness: Liveness | None = None,
    ) -> None:
        self.routes = routes
        self.liveness = liveness
        self.trajectory = trajectory
        self.success_threshold = success_threshold
        self.metrics_prefix = metrics_prefix
        self.client = RolloutClient(routes, client)

    async def run_step(
        self,
        rows: Sequence[Mapping[str, Any]],
        envs: Sequence[str],
        overrides: Mapping[str, Any] | None = None,
        *,
        on_row: RowCallback | None = None,
        desc: str = "Gym rollouts",
    ) -> StepResult:
        """Run ``rows`` (environment ``envs[i]`` each) with ``responses_create_params`` ``overrides``.

        Returns one :class:`RowResult` per row in input order; raises :class:`RowCallbackError` when ``on_row``
        raises (the step is aborted, see the module docstring) and ``ValueError`` when the lengths differ.
        """
        if len(rows) != len(envs):
            raise ValueError(f"run_step: {len(rows)} rows but {len(envs)} environment names")
        results: list[RowResult | None] = [None] * len(rows)

        async def row_done(outcome: RolloutOutcome) -> None:
            env = envs[outcome.index]
            samples = trajectories_from_outcome(outcome, env_name=env, config=self.trajectory)
            row = RowResult(outcome.index, env, outcome, samples[0], samples if len(samples) > 1 else ())
            results[outcome.index] = row
            gc_row_done()
            if on_row is None:
                return
            try:
                done = on_row(row)
                if inspect.isawaitable(done):
                    await done
            except Exception as e:
                raise RowCallbackError(
                    f"on_row failed for row {row.index} ({env}): {e!r}; the step is aborted and its rows still in "
                    "flight are cancelled",
                    row.index,
                ) from e

        t0 = time.perf_counter()
        sent = [_routed(row, env) for row, env in zip(rows, envs, strict=True)]
        with gc_paused() if os.environ.get(GC_PAUSE_ENV, "1") != "0" else nullcontext():
            if self.liveness is None:
                await self.client.run(sent, overrides=overrides, desc=desc, on_outcome=row_done)
            else:
                guard = await self._before_step()
                watch = asyncio.ensure_future(guard.watch())
                try:
                    await self.client.run(sent, overrides=overrides, desc=desc, on_outcome=row_done, guard=guard)
                finally:
                    watch.cancel()
                    await asyncio.gather(watch, return_exceptions=True)
                if guard.error is not None:
                    raise guard.error
        rollout_s = time.perf_counter() - t0
        done_rows = [row for row in results if row is not None]
        if len(done_rows) != len(rows):  # the client yields one outcome per row; anything else is a bug
            raise AdapterError(f"run_step: {len(rows) - len(done_rows)} of {len(rows)} rows came back without a result")
        metrics = compute_metrics(
            [row.segments or row.trajectory for row in done_rows],
            prefix=self.metrics_prefix,
            success_threshold=self.success_threshold,
        )
        timings = {"rollout_s": rollout_s, "rollouts_per_s": len(rows) / rollout_s if rollout_s > 0 else 0.0}
        metrics.update({f"{self.metrics_prefix}/timing/{k}": v for k, v in timings.items()})
        metrics.update(resend_metrics([row.outcome for row in done_rows], self.client.resends, self.metrics_prefix))
        if self.liveness is not None:
            metrics[f"{self.metrics_prefix}/liveness/restarts"] = float(self.liveness.restarts)
        return StepResult(rows=done_rows, metrics=metrics, timings=timings)

    async def _before_step(self) -> StepGuard:
        """The pre-step check (which may restart Gym: then the step uses the new routes) and the step's guard."""
        assert self.liveness is not None
        routes, dead = await self.liveness.before_step()
        if routes is not None:
            self.routes = self.client.routes = routes
        return self.liveness.guard(dead)

    async def aclose(self) -> None:
        """Close the HTTP sessions (idempotent)."""
        await self.client.close()
        if self.liveness is not None:
            await self.liveness.aclose()

    async def __aenter__(self) -> RolloutCore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class BlockingRolloutCore(BlockingFacade):
    """:class:`RolloutCore` for synchronous callers: the core runs on its own event-loop thread; :meth:`close`
    closes its HTTP session there. ``core`` must not have run a step on another event loop (its HTTP session
    belongs to the first loop it ran in)."""

    def __init__(self, core: RolloutCore) -> None:
        self.core = core
        super().__init__("gym-rollout-core", core.aclose)

    def run_step(
        self,
        rows: Sequence[Mapping[str, Any]],
        envs: Sequence[str],
        overrides: Mapping[str, Any] | None = None,
        *,
        on_row: RowCallback | None = None,
        desc: str = "Gym rollouts",
    ) -> StepResult:
        """Blocking :meth:`RolloutCore.run_step` (``on_row`` runs in the core's loop thread)."""
        return self._loop.run(self.core.run_step(rows, envs, overrides, on_row=on_row, desc=desc))


GC_PAUSE_ENV = "NGV_GC_PAUSE"  # "0": keep automatic cyclic GC running during steps (default: paused, gc_paused)
GC_YOUNG_EVERY = 1024  # rows finished (process-wide) while paused between two young collections
GC_FULL_EVERY = 16  # young collections of one unbroken pause (overlapping steps) between two full ones
_GC_LOCK = threading.Lock()


class _GcPause:
    """The process-wide pause's state (under ``_GC_LOCK``)."""

    steps = 0  # steps in progress
    was_enabled = False  # automatic collection was on before the first of them
    rows = 0  # rows finished since the last young collection
    youngs = 0  # young collections since the pause began


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's automatic cyclic garbage collection (process-wide) while a step's results arrive; the default
    of every step (``NGV_GC_PAUSE=0`` opts out). Reference counting still frees everything outside cycles; cycles
    are freed by a young collection (``gc.collect(0)``: only objects allocated since the previous one) every
    :data:`GC_YOUNG_EVERY` finished rows (:func:`gc_row_done`) and when the last concurrent step ends, when
    automatic collection is switched back on. So cyclic garbage made during a step (by any thread) lives at most
    until the next 1024 rows or the step's end, and no collection walks the whole heap during a step of fewer than
    16k rows. Should steps overlap without a break (a pause that never ends), every :data:`GC_FULL_EVERY`-th of
    those collections is a full one, so no garbage outlives 16k rows. A collector the caller had switched off
    stays off and is never run.

    Why: with automatic collection, a step's surviving objects (each ``/run`` result, its outcome and trajectory)
    trigger full collections that walk the whole process heap (torch, verl, Ray: hundreds of thousands of objects
    and more): 165-183 ms of CPU in a 1024-rollout step of ``benchmarks/bench_rollout_scale.py`` (one gen-2 pass was
    130-150 ms of it), 17-19 ms paused, same peak RSS (352 MB; the padded batch dominates it).
    """
    with _GC_LOCK:
        if _GcPause.steps == 0:
            _GcPause.was_enabled = gc.isenabled()
            _GcPause.rows = _GcPause.youngs = 0
            gc.disable()
        _GcPause.steps += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _GcPause.steps -= 1
            last = _GcPause.steps == 0 and _GcPause.was_enabled
            if last:
                gc.enable()
        if last:
            gc.collect(0)  # the cycles made since the last young collection, now rather than at a random allocation


def gc_row_done() -> None:
    """One row finished: while steps pause the collector (that was on), every :data:`GC_YOUNG_EVERY` rows a young
    collection (the objects allocated since the last one), every :data:`GC_FULL_EVERY`-th of them a full one."""
    with _GC_LOCK:
        if _GcPause.steps == 0 or not _GcPause.was_enabled:
            return
        _GcPause.rows += 1
        due = _GcPause.rows >= GC_YOUNG_EVERY
        if due:
            _GcPause.rows = 0
            _GcPause.youngs += 1
        full = due and _GcPause.youngs % GC_FULL_EVERY == 0
    if due:
        gc.collect(2 if full else 0)


def resends(outcomes: Sequence[RolloutOutcome]) -> int:
    """How many times the client sent these rows again after a connection error (``RolloutOutcome.attempts``)."""
    return sum(max(0, outcome.attempts - 1) for outcome in outcomes)


def resend_metrics(outcomes: Sequence[RolloutOutcome], total: int, prefix: str = "gym") -> dict[str, float]:
    """``<prefix>/client/resends`` (these rows' re-sends after connection errors, :func:`resends`) and
    ``<prefix>/client/resends_total`` (``total``: the client's since it was made). Both trainers log them."""
    return {f"{prefix}/client/resends": float(resends(outcomes)), f"{prefix}/client/resends_total": float(total)}


def _routed(row: Mapping[str, Any], env: str) -> Mapping[str, Any]:
    """The row itself, or -- for rows without routing (Gym's bundled examples, routed by ``default_agent``) --
    a copy naming the environment the dataset resolved. Never mutates ``row``; a non-mapping passes through (the
    client turns it into a ``client_error`` record)."""
    if not isinstance(row, Mapping) or row.get("agent_ref") is not None or row.get("task_source") is not None:
        return row
    return {**row, "agent_ref": {"name": env}}
