"""What a finished Gym rollout tells verl's trainer besides its tokens, the same on both trainers.

* **Per sample**: ``gym_outcome`` (Gym's verified reward) and each reward component of Gym's multi-reward results
  (``reward_components: {name: value}``, Gym 0.7's ``BaseMultiRewardVerifyResponse``) -- on v1 as the sample's
  ``extra_fields.reward_extra_info`` (what verl's replay-buffer group filter reads: ``algorithm.filter_groups.metric``),
  on the legacy trainer as ``non_tensor_batch`` columns named in ``meta_info["reward_extra_keys"]`` (what verl's GDPO
  reads through ``algorithm.gdpo_reward_keys``, and its rollout dump and ``gdpo/<key>/*`` metrics); on v1 verl's GDPO
  gets them from ``recipe.nemo_gym.algorithms.gdpo``. A valid sample carries only what its own result returned; a masked sample
  carries its group's :func:`~nemo_gym_adapter.rollouts.groups.masked_fill` instead of its own zeros, so it never
  decides a group (and would not move a per-component baseline even where masking is not applied). A valid sample
  never gets a group-mate's value: one lacking a component the trainer reads was masked ``missing_reward_component``
  when its trajectory was built (``nemo_gym_adapter.rollouts.reward_components``).
* **Per group**: its verdict (``groups.classify``: signal, same outcome, too few valid, all masked), counted per metrics
  window by :class:`GroupLedger` as ``gym/<scope>/groups/...`` -- with verl's filter on, what was dropped and why.
* **GDPO's keys**: :func:`check_gdpo_components`, the first time an environment's results reach the trainer (both
  trainers), refuses an ``algorithm.gdpo_reward_keys`` entry none of them carries (every sample of that environment
  would be masked ``missing_reward_component``).
* **Per rollout**: the readable dump (``rollouts.dump``, ``nemo_gym.rollout_dump``): :func:`rollout_dump` builds it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np

from nemo_gym_adapter.errors import AdapterConfigError, AdapterError
from nemo_gym_adapter.rollouts.dump import DumpConfig, RolloutDump
from nemo_gym_adapter.rollouts.groups import GroupVerdict, classify, group_metrics, masked_fill, reward_extra_info
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory
from nemo_gym_adapter.wire.payloads import reward_components
from recipe.nemo_gym.config.load import RecipeConfig

logger = logging.getLogger(__name__)


def rollout_dump(recipe: RecipeConfig, tokenizer: Any) -> RolloutDump | None:
    """The readable-rollout writer of ``nemo_gym.rollout_dump``, or None when it is off."""
    root = recipe.rollout_dump_dir
    if root is None:
        return None
    settings = recipe.gym.rollout_dump
    config = DumpConfig(root, settings.validation, settings.max_text_chars, settings.queue_size)
    logger.info("readable rollouts go to %s (nemo_gym.rollout_dump)", root)
    return RolloutDump(config, lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False))


def sample_extras(t: Trajectory, fill: dict[str, float] | None = None) -> dict[str, float]:
    """One sample's ``reward_extra_info``: its own values, or ``fill`` (its group's masked fill) when it is masked."""
    if t.masked:
        return dict(fill) if fill is not None else {"gym_outcome": 0.0}
    return reward_extra_info(t)


class GroupLedger:
    """Verdicts of the groups settled since the last :meth:`drain` (thread-safe: v1 settles groups on its event-loop
    thread and drains on the trainer's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verdicts: list[tuple[str, GroupVerdict]] = []

    def add(self, env: str, members: Sequence[Trajectory]) -> GroupVerdict:
        verdict = classify(members)
        with self._lock:
            self._verdicts.append((env, verdict))
        return verdict

    def drain(self, prefix: str = "gym") -> dict[str, float]:
        with self._lock:
            verdicts, self._verdicts = self._verdicts, []
        return group_metrics(verdicts, prefix)


def batch_group_metrics(
    trajectories: Sequence[Trajectory], uids: Sequence[Any], prefix: str = "gym"
) -> dict[str, float]:
    """``<prefix>/<scope>/groups/...`` of one batch whose rows belong to groups ``uids`` (the legacy trainer's step)."""
    members: dict[Any, list[Trajectory]] = {}
    for t, uid in zip(trajectories, uids, strict=True):
        members.setdefault(uid, []).append(t)
    return group_metrics([(group[0].env_name, classify(group)) for group in members.values()], prefix)


def legacy_extras(
    trajectories: Sequence[Trajectory], uids: Sequence[Any], taken: Collection[str], fill_keys: Sequence[str] = ()
) -> dict[str, np.ndarray]:
    """The legacy batch's per-sample columns (module docstring): ``gym_outcome`` and every reward component any
    sample carries, float32, one value per row. A valid sample has its own values only: a component it did not
    return is NaN in that column -- never a group-mate's value, never 0 (a component the trainer reads cannot be
    missing from a valid sample: that sample is masked ``missing_reward_component``, ``rollouts.reward_components``).
    A masked sample carries its group's fill (:func:`~nemo_gym_adapter.rollouts.groups.masked_fill`, ``fill_keys`` at
    0 when no valid member has them). ``uids``: each row's group; ``taken``: columns the batch already has (a
    component named like one is an error naming both)."""
    groups: dict[Any, list[int]] = {}
    for row, uid in enumerate(uids):
        groups.setdefault(uid, []).append(row)
    values: list[dict[str, float]] = [{} for _ in trajectories]
    for rows in groups.values():
        fill = masked_fill([trajectories[r] for r in rows], fill_keys)
        for r in rows:
            values[r] = sample_extras(trajectories[r], fill)
    names = sorted({k for v in values for k in v})
    clash = sorted(set(names) & set(taken))
    if clash:
        envs = sorted({t.env_name for t, v in zip(trajectories, values, strict=True) if set(v) & set(clash)})
        raise AdapterError(
            f"reward component(s) {clash} of environment(s) {envs} have the name of a batch column verl or the dataset "
            "already uses; rename the component in the environment's verify response"
        )
    return {name: np.array([v.get(name, np.nan) for v in values], dtype=np.float32) for name in names}


def carried_components(trajectories: Sequence[Trajectory]) -> dict[str, set[str]]:
    """Per environment, the reward components its *results* carry: valid samples, and samples masked only because a
    component the trainer reads was missing (their other components are real). Samples without a usable result
    (timeouts, broken histories, ...) say nothing about what the environment returns."""
    carried: dict[str, set[str]] = {}
    for t in trajectories:
        if not t.masked or t.masked_reason is MaskReason.MISSING_REWARD_COMPONENT:
            carried.setdefault(t.env_name, set()).update(reward_components(t.numeric))
    return carried


def check_gdpo_keys(trajectories: Sequence[Trajectory], keys: Sequence[str], checked: set[str]) -> None:
    """:func:`check_gdpo_components` over the environments' results in ``trajectories`` (:func:`carried_components`);
    the legacy trainer calls it for each training batch."""
    check_gdpo_components(carried_components(trajectories), keys, checked)


def check_gdpo_components(carried: Mapping[str, Collection[str]], keys: Sequence[str], checked: set[str]) -> None:
    """Every ``algorithm.gdpo_reward_keys`` entry must be a reward component of at least one result of each
    environment in ``carried`` (``{env: components its results carry}``) not in ``checked`` yet (an environment with
    no result this step is checked later). Raises :class:`AdapterConfigError` naming the key, the environment and the
    components its results carry; environments checked are added to ``checked``. Both trainers call it (the v1 one
    from ``recipe.nemo_gym.algorithms.gdpo``)."""
    todo = {env: set(names) for env, names in carried.items() if env not in checked}
    problems = [
        f"algorithm.gdpo_reward_keys[{i}]={key!r}: no result of environment {env!r} carries reward component {key!r} "
        f"(its results carry {sorted(names) or 'no reward_components'})"
        for env, names in sorted(todo.items())
        for i, key in enumerate(keys)
        if key not in names
    ]
    if problems:
        raise AdapterConfigError(
            "GDPO would have nothing to train these components on:\n  "
            + "\n  ".join(problems)
            + "\nset algorithm.gdpo_reward_keys to names the environments' verify responses put in reward_components"
        )
    checked.update(todo)
