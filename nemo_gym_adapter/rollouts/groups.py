"""Prompt groups and their learning signal: which groups a group-baseline estimator (GRPO, GDPO, RLOO, ...) can learn
from, what verl's group filter should drop, and the metrics that say how many and why. Pure: no I/O.

A *group* is the ``n`` samples of one prompt (verl's ``uid``). What decides it is the **outcome** of its valid
(unmasked) samples: Gym's own ``reward``, never a shaped score (filtering on a shaped or KL-penalised score trains on
phantom differences; verl-recipe #125). A masked sample has no outcome (its reward is not a measurement) and must never
decide a group. :class:`GroupVerdict`:

* ``signal``: two or more valid samples whose outcomes differ -- the only groups with a non-zero advantage;
* ``same_outcome``: two or more valid samples, all with the same outcome: every advantage is zero (the groups DAPO's
  dynamic sampling drops);
* ``too_few_valid``: exactly one valid sample: no baseline (masked estimators give it zero advantage);
* ``all_masked``: no valid sample.

verl's v1 replay buffer drops a finished group iff it has more than one trajectory and the configured metric
(``algorithm.filter_groups.metric``, read from each sample's ``extra_fields.reward_extra_info``) has zero standard
deviation (``verl/trainer/ppo/v1/replay_buffer.py`` ``_dapo_filtered_keys``). The managers put ``gym_outcome`` (and each
reward component) there; :func:`masked_fill` is what a group's *masked* samples carry instead of their own zero, so
that verl's rule sees the valid samples only: a group is kept exactly when its verdict is ``signal``.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from nemo_gym_adapter.rollouts.metrics import ALL_SCOPE, scope_name
from nemo_gym_adapter.rollouts.trajectory import Trajectory
from nemo_gym_adapter.wire.payloads import reward_components

OUTCOME_KEY = "gym_outcome"
"""``reward_extra_info`` key of Gym's reward for a sample; the shipped ``algorithm.filter_groups.metric``."""


class GroupVerdict(str, enum.Enum):
    """What a group's valid samples can teach (module docstring); low cardinality: safe as a metric key."""

    SIGNAL = "signal"
    SAME_OUTCOME = "same_outcome"
    TOO_FEW_VALID = "too_few_valid"
    ALL_MASKED = "all_masked"


def outcomes(members: Iterable[Trajectory]) -> list[float]:
    """Gym's reward of each valid member (a valid trajectory always has one)."""
    return [float(t.gym_reward if t.gym_reward is not None else t.reward) for t in members if not t.masked]


def verdict_of(values: Sequence[float]) -> GroupVerdict:
    """The verdict of a group whose valid samples have outcomes ``values``."""
    if not values:
        return GroupVerdict.ALL_MASKED
    if len(values) == 1:
        return GroupVerdict.TOO_FEW_VALID
    return GroupVerdict.SAME_OUTCOME if float(np.std(values)) == 0.0 else GroupVerdict.SIGNAL


def classify(members: Iterable[Trajectory]) -> GroupVerdict:
    """The verdict of one group of trajectories."""
    return verdict_of(outcomes(members))


def reward_extra_info(t: Trajectory) -> dict[str, float]:
    """What a *valid* sample tells verl per sample (``reward_extra_info``): its outcome and each reward component."""
    return {OUTCOME_KEY: float(t.gym_reward if t.gym_reward is not None else t.reward), **reward_components(t.numeric)}


def masked_fill(members: Sequence[Trajectory], keys: Iterable[str] = ()) -> dict[str, float]:
    """The ``reward_extra_info`` a group's masked samples carry instead of their own: every key the valid members
    carry, with the first valid member's value (a spread of zero stays zero, a spread above zero stays above zero:
    masked samples never change verl's decision), plus ``keys`` (e.g. the configured filter metric) at 0 where no
    valid member has them. An all-masked group carries 0 for ``gym_outcome`` and ``keys`` (dropped and refilled, as it
    should be)."""
    fill: dict[str, float] = {}
    for t in members:
        if not t.masked:
            for key, value in reward_extra_info(t).items():
                fill.setdefault(key, value)
    for key in (OUTCOME_KEY, *keys):
        fill.setdefault(key, 0.0)
    return fill


def group_metrics(verdicts: Iterable[tuple[str, GroupVerdict]], prefix: str = "gym") -> dict[str, float]:
    """Counts of settled groups by verdict, overall and per environment (``env`` as in :mod:`metrics`):
    ``<prefix>/<scope>/groups/{finished,signal,same_outcome,too_few_valid,all_masked}`` and ``no_signal_rate``."""
    by_scope: dict[str, Counter[GroupVerdict]] = {}
    for env, verdict in verdicts:
        for scope in (ALL_SCOPE, scope_name(env)):
            by_scope.setdefault(scope, Counter())[verdict] += 1
    out: dict[str, float] = {}
    for scope, counts in sorted(by_scope.items()):
        total = sum(counts.values())
        out[f"{prefix}/{scope}/groups/finished"] = float(total)
        for verdict in GroupVerdict:
            out[f"{prefix}/{scope}/groups/{verdict.value}"] = float(counts[verdict])
        out[f"{prefix}/{scope}/groups/no_signal_rate"] = 1.0 - counts[GroupVerdict.SIGNAL] / total
    return out


def batch_signal(
    uids: Sequence[object], scores: Sequence[float], valid: Sequence[bool], prefix: str = "gym/train"
) -> dict[str, float]:
    """For the batch a trainer is about to learn from (one entry per sample: its group id, the score its advantage
    sees, whether it is valid): ``<prefix>/groups`` and ``<prefix>/groups_without_signal_rate``, the share of the
    batch's groups whose every advantage is zero (verdict other than ``signal``). With verl's group filter on it is 0."""
    by_group: dict[object, list[float]] = {}
    for uid, score, ok in zip(uids, scores, valid, strict=True):
        values = by_group.setdefault(uid, [])
        if ok:
            values.append(float(score))
    if not by_group:
        return {}
    silent = sum(verdict_of(values) is not GroupVerdict.SIGNAL for values in by_group.values())
    return {f"{prefix}/groups": float(len(by_group)), f"{prefix}/groups_without_signal_rate": silent / len(by_group)}
