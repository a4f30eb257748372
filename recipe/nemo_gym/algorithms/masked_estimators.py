"""Masked samples kept out of verl's own outcome advantage estimators: one rule, not one GRPO copy per estimator.

A failed Gym rollout is a row with an all-zero ``response_mask`` (``nemo_gym_adapter.rollouts.padding`` /
``samples``). Its reward is not a measurement, so it must not enter any group statistic. :func:`exclude_masked` wraps
a verl estimator so that:

* verl's estimator runs on the valid rows only (every per-row argument -- tensors, numpy arrays, GDPO's
  ``non_tensor_batch`` columns and ``batch`` TensorDict -- is sliced to them), and its result is scattered back: every
  group statistic (GRPO's mean/std, each GDPO component's mean/std and GDPO's batch whitening, RLOO's leave-one-out
  mean, ...) sees valid samples only;
* a masked row gets advantage 0;
* a group that masking left with fewer than two valid samples gets advantage 0 (it has no baseline; verl would give a
  lone sample mean 0 and std 1, i.e. its raw reward). A group that small before masking keeps verl's behaviour;
* with nothing masked, verl's estimator is called with the very same arguments: its numbers, bit for bit.

:func:`install` wraps the registry entries of :data:`~recipe.nemo_gym.config.checks.MASKABLE_ESTIMATORS` in
``verl.trainer.ppo.core_algos.ADV_ESTIMATOR_REGISTRY`` and the module attribute
``core_algos.compute_grpo_outcome_advantage`` (``ray_trainer.compute_advantage`` calls it directly for ``grpo``, and
GDPO calls it once per component). The names stay verl's on purpose: verl hands GDPO its ``non_tensor_batch`` and
``batch`` only when ``algorithm.adv_estimator`` *is* ``gdpo`` (``ray_trainer.compute_advantage``); a new name
(``masked_gdpo``) would lose them. verl has no public way to replace a registered estimator, so this is a patch of its
registry dict: done once per process (a sentinel on ``core_algos``), logged once, in the process that computes
advantages -- verl's TaskRunner actor on both trainers (``task_runner.NemoGymTaskRunnerImpl.run``,
``task_runner_v1.NemoGymTaskRunnerV1Impl.run``).

Not wrapped: ``gae`` (values, no groups: a masked row's zero mask already zeroes it), ``reinforce_plus_plus``/``remax``
(no groups), the optimal-token-baseline estimators (token-level), and ``masked_grpo`` (``recipe.nemo_gym.algorithms.masked_grpo``,
kept for the shipped configs: it also counts a rollout split into several samples once per group on the v1 trainer,
choosing its last *valid* segment, where verl's v1 GRPO takes the last segment).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from recipe.nemo_gym.config.checks import MASKABLE_ESTIMATORS

logger = logging.getLogger(__name__)

MIN_VALID = 2
"""A group needs this many valid samples for a baseline; a group masking left smaller gets advantage 0."""

NOTICE = "masked samples kept out of verl's advantage estimators (recipe.nemo_gym.algorithms.masked_estimators)"
_WRAPPED = "__ngv_exclude_masked__"
_INSTALLED = "__ngv_exclude_masked_installed__"


def _take(value: Any, rows: torch.Tensor, n: int) -> Any:
    """``value`` restricted to ``rows`` when it is per-row (first dimension ``n``); anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value[rows.to(value.device)] if value.dim() > 0 and value.shape[0] == n else value
    if isinstance(value, np.ndarray):
        return value[rows.cpu().numpy()] if value.ndim > 0 and value.shape[0] == n else value
    if isinstance(value, dict):
        return {k: _take(v, rows, n) for k, v in value.items()}
    batch_size = getattr(value, "batch_size", None)  # a TensorDict (DataProto.batch)
    if batch_size is not None and hasattr(value, "keys") and len(batch_size) and batch_size[0] == n:
        return value[rows]
    return value


def rows_to_keep(
    valid: torch.Tensor, index: Sequence[Any] | np.ndarray | None, min_valid: int = MIN_VALID
) -> torch.Tensor:
    """The rows verl's estimator sees: valid rows, minus every member of a group that masking left with fewer than
    ``min_valid`` valid samples (groups without a masked member are kept whatever their size)."""
    keep = valid.clone()
    if index is None or bool(valid.all()):
        return keep
    ids = np.asarray(index, dtype=object)
    invalid = (~valid).cpu().numpy()
    for uid in set(ids[invalid].tolist()):  # groups that masking shrank
        members = torch.as_tensor(ids == uid, device=valid.device)
        if int((members & valid).sum()) < min_valid:
            keep &= ~members
    return keep


def as_keywords(fn: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], dict[str, Any]]:
    """``(args, kwargs) -> kwargs`` for calls of ``fn``: positional arguments named by ``fn``'s signature (verl calls
    its estimators with keywords, other callers may not; a wrapper reads the arguments by name)."""
    positional = [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]

    def named(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        return {**dict(zip(positional, args, strict=False)), **kwargs} if args else kwargs

    return named


def exclude_masked(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]], min_valid: int = MIN_VALID) -> Any:
    """``fn`` (a verl outcome estimator) over the rows whose ``response_mask`` is not all zero (module docstring).
    Idempotent: an already wrapped ``fn`` is returned as it is."""
    if getattr(fn, _WRAPPED, False):
        return fn
    named = as_keywords(fn)

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        kwargs = named(args, kwargs)
        mask = kwargs["response_mask"]
        n = mask.shape[0]
        valid = mask.sum(dim=-1) > 0
        if bool(valid.all()):
            return fn(**kwargs)
        keep = rows_to_keep(valid, kwargs.get("index"), min_valid)
        advantages = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
        returns = torch.zeros_like(advantages)
        rows = torch.nonzero(keep, as_tuple=True)[0]
        if rows.numel():
            adv, ret = fn(**{k: _take(v, rows, n) for k, v in kwargs.items()})
            advantages = advantages.to(adv.dtype)
            returns = returns.to(ret.dtype)
            advantages[rows] = adv
            returns[rows] = ret
        return advantages, returns

    setattr(wrapped, _WRAPPED, True)
    return wrapped


def installed() -> bool:
    """Whether :func:`install` ran in this process."""
    from verl.trainer.ppo import core_algos

    return bool(getattr(core_algos, _INSTALLED, False))


def install(names: Sequence[str] = MASKABLE_ESTIMATORS) -> str | None:
    """Wrap verl's registered estimators ``names`` and its directly called GRPO with :func:`exclude_masked`, once per
    process (a second call does nothing and returns None). Returns the one-line notice of what was wrapped (logged;
    the task runners print it, since verl's TaskRunner shows no INFO logging)."""
    from verl.trainer.ppo import core_algos

    if getattr(core_algos, _INSTALLED, False):
        return None
    wrapped = []
    for name in names:
        fn = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
        if fn is not None:
            core_algos.ADV_ESTIMATOR_REGISTRY[name] = exclude_masked(fn)
            wrapped.append(name)
    core_algos.compute_grpo_outcome_advantage = exclude_masked(core_algos.compute_grpo_outcome_advantage)
    setattr(core_algos, _INSTALLED, True)
    notice = f"{NOTICE}: {', '.join(wrapped)}"
    logger.info(notice)
    return notice
