"""The rollout client's outcome for one row (a ``/run`` result or a failure) → its trajectories, the result parsed once.

A failure (timeout, request failed, unroutable, server down, aborted, an environment's own 5xx) becomes one masked
trajectory with its counted reason (:func:`failed_trajectory`); a result is parsed once (``wire.payloads.parse_run_result``)
and handed on to :func:`~nemo_gym_adapter.rollouts.builder.build_trajectory` -- or, under ``contiguity: split``, to
:func:`~nemo_gym_adapter.rollouts.segments.build_trajectories` -- and a result that does not parse, or whose ids do
not fit in int64, is one masked ``invalid_result`` trajectory naming the JSON path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from nemo_gym_adapter.errors import AdapterError, GymServerError
from nemo_gym_adapter.rollouts.builder import build_trajectory
from nemo_gym_adapter.rollouts.segments import build_trajectories
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory, TrajectoryConfig
from nemo_gym_adapter.wire.payloads import GENERATION_ABORTED, parse_run_result

# The rollout client's RolloutFailure.reason codes that are not plain request failures.
_CLIENT_REASONS = {
    "timeout": MaskReason.TIMEOUT,
    "unknown_agent": MaskReason.UNROUTABLE,
    "ambiguous_agent": MaskReason.UNROUTABLE,
    "server_down": MaskReason.SERVER_DOWN,
    "too_large": MaskReason.INVALID_RESULT,  # a body over nemo_gym.client.max_body_mb, refused while it streamed
    "wrong_row": MaskReason.INVALID_RESULT,  # a result that echoes another row's verifier fields
}


class FailureRecord(Protocol):
    """What the rollout client reports for a row without a result (``client.RolloutFailure``)."""

    @property
    def reason(self) -> str: ...  # "timeout", "connection", "http_<status>", "bad_json", "unknown_agent", ...

    @property
    def detail(self) -> str: ...


class OutcomeLike(Protocol):
    """One row's outcome from the rollout client (``client.RolloutOutcome``)."""

    @property
    def index(self) -> int: ...

    @property
    def latency_s(self) -> float: ...

    @property
    def result(self) -> Mapping[str, Any] | None: ...

    @property
    def failure(self) -> FailureRecord | None: ...


def failed_trajectory(
    failure: FailureRecord, *, env_name: str, row_index: int | None = None, latency_s: float | None = None
) -> Trajectory:
    """The masked trajectory of a row the rollout client could not get a result for."""
    reason = _CLIENT_REASONS.get(failure.reason, MaskReason.REQUEST_FAILED)
    if reason is MaskReason.REQUEST_FAILED and GENERATION_ABORTED in failure.detail:
        reason = MaskReason.ABORTED
    elif reason is MaskReason.REQUEST_FAILED and getattr(failure, "origin", None) == "environment":
        reason = MaskReason.VERIFIER_ERROR  # the environment's own code raised (no tokens came back: stays masked)
    return Trajectory(
        env_name=env_name,
        masked_reason=reason,
        detail=f"{failure.reason}: {failure.detail}",
        failure_kind=f"client:{failure.reason}",
        latency_s=latency_s,
        row_index=row_index,
    )


def trajectory_from_outcome(outcome: OutcomeLike, *, env_name: str, config: TrajectoryConfig) -> Trajectory:
    """The rollout client's outcome for one row → its trajectory (:func:`build_trajectory`'s one; a rollout whose
    calls do not form one history stays one masked sample, whatever ``config.contiguity``)."""
    return _from_outcome(outcome, env_name, config, lambda result, **kw: (build_trajectory(result, **kw),))[0]


def trajectories_from_outcome(
    outcome: OutcomeLike, *, env_name: str, config: TrajectoryConfig
) -> tuple[Trajectory, ...]:
    """The rollout client's outcome for one row → its trajectories (:func:`segments.build_trajectories`: under
    ``split``, one per segment of a rollout whose calls do not form one history; else one)."""
    return _from_outcome(outcome, env_name, config, build_trajectories)


def _from_outcome(
    outcome: OutcomeLike,
    env_name: str,
    config: TrajectoryConfig,
    build: Callable[..., tuple[Trajectory, ...]],
) -> tuple[Trajectory, ...]:
    """Parse the outcome's ``/run`` JSON once and hand the parsed result to ``build``.

    A row that was never sent (``attempts == 0``: unroutable, not serialisable) has no latency, not 0 s.
    """
    latency = outcome.latency_s if getattr(outcome, "attempts", 1) else None
    if outcome.failure is not None:
        return (failed_trajectory(outcome.failure, env_name=env_name, row_index=outcome.index, latency_s=latency),)
    if outcome.result is None:
        raise AdapterError(f"row {outcome.index}: rollout outcome has neither a result nor a failure")
    where = f"row {outcome.index}: /run result"
    try:
        result = parse_run_result(outcome.result, where=where)
    except GymServerError as e:
        detail = str(e)
    else:
        try:
            return build(result, env_name=env_name, config=config, row_index=outcome.index, latency_s=latency)
        except OverflowError:  # pydantic's StrictInt accepts any Python int, int64 does not
            detail = f"{where}: {result.first_id_beyond_int64()} does not fit in int64"
    return (
        Trajectory(
            env_name=env_name,
            masked_reason=MaskReason.INVALID_RESULT,
            detail=detail,
            failure_kind="client:invalid_result",
            latency_s=latency,
            row_index=outcome.index,
        ),
    )
