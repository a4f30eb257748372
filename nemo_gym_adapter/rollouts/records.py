"""The rollout client's records: what became of one row sent to NeMo Gym, a ``/run`` result or a counted failure.

The rollout client (:mod:`~nemo_gym_adapter.rollouts.client`) makes exactly one outcome per input row, whatever Gym
did; :mod:`~nemo_gym_adapter.rollouts.trajectory` turns each into a trajectory (a failure becomes a masked one whose
reason is derived from :attr:`RolloutFailure.reason`). Plain records: no I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nemo_gym_adapter.gym.liveness import SERVER_DOWN as SERVER_DOWN  # a reason too: a server the row needs is dead
from nemo_gym_adapter.rollouts.gym_errors import GymErrorOrigin

# Reason codes of RolloutFailure (plus "http_<status>" for any error answer, and the router's "unknown_agent" /
# "ambiguous_agent").
TIMEOUT = "timeout"  # no answer within the rollout's deadline
CONNECTION = "connection"  # refused, reset or cut mid-answer, after the retries
BAD_JSON = "bad_json"  # the body is not a JSON object
CLIENT_ERROR = "client_error"  # the row could not be sent (not an object, not serialisable) or aiohttp failed
TOO_LARGE = "too_large"  # the body is over nemo_gym.client.max_body_mb: refused while it streamed in
WRONG_ROW = "wrong_row"  # the result echoes another row's verifier fields (row_echo.other_row_fields)


@dataclass(frozen=True)
class RolloutFailure:
    """Why one row produced no Gym result.

    ``reason`` is low-cardinality and safe to group by (the codes above, ``http_<status>``, ``unknown_agent``,
    ``ambiguous_agent``, ``server_down``); ``detail`` is the human-readable occurrence (it names the server, URL and
    row); ``status`` is the HTTP status when the server answered.
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


OutcomeHook = Callable[[RolloutOutcome], "Awaitable[None] | None"]
"""Called once per row as soon as its outcome exists (completion order); may be sync or async."""
