"""Gym's multi-reward results, one sample at a time: which components a result carries, which the trainer needs, and
whether the scalar ``reward`` is their sum. Pure: no I/O (one warning per environment is logged).

Gym 0.7's ``BaseMultiRewardVerifyResponse`` returns ``reward_components: {name: value}`` next to the scalar
``reward`` ("the scalar aggregate expected by single-reward consumers"; its example environment and NeMo RL make it
the sum). The adapter never invents a component and never overwrites either side:

* **A missing component** (a result without a name the trainer reads: an ``algorithm.gdpo_reward_keys`` entry, or a
  component used as ``algorithm.filter_groups.metric``) is not borrowed from a group-mate nor read as 0: the sample is
  masked ``missing_reward_component`` (no gradient, out of every group statistic, counted in
  ``masked_rate/missing_reward_component``; :func:`missing`). A result lacking a component that other results of its
  environment carry, where the trainer does not read it, is trained as it is and counted
  (``reward_components_incomplete_rate``).
* **A reward that is not the sum of its components** (beyond NeMo RL's tolerance, :func:`sum_mismatch`) is trained as
  the environment returned it -- the scalar where an estimator reads rewards (GRPO, the group filter's
  ``gym_outcome``, success rates), the components where GDPO reads them -- counted
  (``reward_components_sum_mismatch_rate``) and warned about once per environment with the first example. NeMo RL
  raises instead (``validate_reward_components_match_scalar``); the adapter does not, because Gym documents the scalar
  as an aggregate, and an environment weighting its components is a design, not a failure.

:func:`component_metrics` gives both rates for one environment's rollouts.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from nemo_gym_adapter.wire.payloads import reward_components

logger = logging.getLogger(__name__)

# NeMo RL's tolerance for reward == sum(reward_components) (nemo_rl/environments/nemo_gym.py).
SUM_REL_TOL = 1e-5
SUM_ABS_TOL = 1e-6

SUM_MISMATCH_RATE = "reward_components_sum_mismatch_rate"
INCOMPLETE_RATE = "reward_components_incomplete_rate"


def missing(numeric: Mapping[str, float], required: Iterable[str]) -> list[str]:
    """The ``required`` component names a result's numeric fields (``GymRunResult.numeric_fields``) lack, in order."""
    carried = reward_components(numeric)
    return [name for name in required if name not in carried]


def sum_mismatch(reward: float, components: Mapping[str, float]) -> bool:
    """Whether a result with ``components`` has a ``reward`` other than their sum (False without components)."""
    if not components:
        return False
    return not math.isclose(reward, math.fsum(components.values()), rel_tol=SUM_REL_TOL, abs_tol=SUM_ABS_TOL)


class ResultLike(Protocol):
    """What :func:`component_metrics` reads of a sample (``trajectory.Trajectory`` has it): ``env_name``,
    ``gym_reward`` (None without a Gym result) and ``numeric`` (its result's numeric fields)."""

    @property
    def env_name(self) -> str: ...

    @property
    def gym_reward(self) -> float | None: ...

    @property
    def numeric(self) -> Mapping[str, float]: ...


def component_metrics(results: Sequence[ResultLike]) -> dict[str, float]:
    """For the rollouts of one environment: ``reward_components_sum_mismatch_rate`` (over results carrying
    components) and ``reward_components_incomplete_rate`` (over results with a Gym result: the share lacking a name
    another result here carries); ``{}`` when no result carries components. Masked samples count too: a sample
    masked for a missing component is exactly what the second rate is about."""
    scored = [(r, reward_components(r.numeric)) for r in results if r.gym_reward is not None]
    names = {name for _, comps in scored for name in comps}
    if not names:
        return {}
    with_components = [(r, comps) for r, comps in scored if comps]
    mismatched = [(r, comps) for r, comps in with_components if sum_mismatch(float(r.gym_reward or 0.0), comps)]
    if mismatched:
        warn_sum_mismatch(*mismatched[0])
    incomplete = sum(1 for _, comps in scored if names - set(comps))
    return {
        SUM_MISMATCH_RATE: len(mismatched) / len(with_components),
        INCOMPLETE_RATE: incomplete / len(scored),
    }


_WARNED: set[str] = set()
_WARNED_LOCK = threading.Lock()


def warn_sum_mismatch(result: ResultLike, components: Mapping[str, float]) -> bool:
    """Log, once per environment and process, that its reward is not the sum of its components (True when logged)."""
    with _WARNED_LOCK:
        if result.env_name in _WARNED:
            return False
        _WARNED.add(result.env_name)
    logger.warning(
        "environment %r returned reward %r with reward_components %s (sum %r): the reward is not their sum. Trained as "
        "returned (the reward where an estimator reads rewards, the components where GDPO reads them); counted as "
        "gym/<env>/%s. Logged once per environment.",
        result.env_name,
        result.gym_reward,
        dict(components),
        math.fsum(components.values()),
        SUM_MISMATCH_RATE,
    )
    return True
