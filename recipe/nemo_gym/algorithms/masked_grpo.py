"""Masked-GRPO advantage estimator, registered with verl as ``algorithm.adv_estimator=masked_grpo``.

Why: a NeMo Gym rollout can fail (server error, context overflow, broken token contiguity). The older
verl recipe turned such rollouts into a 1-token dummy with reward 0 that still entered its group's
mean/std, so every failure dragged the baseline of its prompt's group down and gave the surviving
samples a fake positive advantage (verl-recipe #138 saw 1172 of 1280 samples fail). Here a failed
rollout is marked by an all-zero ``response_mask`` row and this estimator leaves it out completely:

* a masked sample gets zero advantage (and, through the mask, zero gradient);
* masked samples do not enter their group's mean or standard deviation;
* a group with fewer than two valid samples has no baseline, so all its samples get zero advantage.
  (verl's own GRPO gives a size-1 group mean 0 and std 1, i.e. advantage = raw reward; we do not.)

Otherwise it is verl's ``compute_grpo_outcome_advantage``: outcome score = sum of the row's token-level
rewards; advantage = (score - group mean) / (group std + epsilon) with the unbiased std, or
score - group mean when std normalisation is off (Dr.GRPO); broadcast over the response tokens.

How verl 0.9.1 calls it (``verl.trainer.ppo.ray_trainer.compute_advantage``, legacy trainer, on the
driver/TaskRunner process): every estimator other than ``gae``/``grpo`` is looked up with
``core_algos.get_adv_estimator_fn(config.algorithm.adv_estimator)`` and called with keyword arguments
``token_level_rewards``, ``response_mask``, ``config`` (= ``config.algorithm``), plus ``index``
(= ``non_tensor_batch["uid"]``) and ``reward_baselines`` when present. ``norm_adv_by_std_in_grpo`` and
``epsilon`` are NOT passed, so they are read from the config:

* ``algorithm.norm_adv_by_std_in_grpo`` (verl's own key, default true);
* ``algorithm.masked_grpo_epsilon`` (ours, default 1e-6 like GRPO; add it with ``+algorithm.…``).

Explicit keyword arguments win over the config (tests and direct callers).

Several samples per rollout (``nemo_gym.trajectory.contiguity: split``, v1 trainer only): verl's v1
``_compute_advantage`` puts a session's samples under keys ``{uid}_{session}_{i}`` and hands GRPO, and only GRPO, to
``compute_advantage_for_multi_trajectories`` (one member per session); every other estimator, this one included, gets
every row as a group member, so a rollout split in three would count three times in its prompt's baseline. The v1
trainer mixin therefore sets :data:`SESSION_KEYS` to the batch's keys around ``_compute_advantage``
(``task_runner_v1.NemoGymTrainerMixin``), and when a session has several rows this estimator computes masked GRPO
over one representative per session (its last unmasked sample) and gives each representative's advantage to every
sample of its session (times their masks), as verl does for GRPO: each rollout counts once, however it was split.

Registration: importing this module registers the estimator (idempotent). It must happen in the
process that computes advantages: verl's TaskRunner is a Ray actor, so import it there through
``VERL_USE_EXTERNAL_MODULES=recipe.nemo_gym.algorithms.masked_grpo`` (verl imports those modules in every process
that imports verl) or a ``verl.plugins`` entry point.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

import numpy as np
import torch

from nemo_gym_adapter.errors import AdapterConfigError, AdapterError

MASKED_GRPO = "masked_grpo"
"""Name to put in ``algorithm.adv_estimator``."""

DEFAULT_EPSILON = 1e-6
EPSILON_KEY = "masked_grpo_epsilon"
NORM_BY_STD_KEY = "norm_adv_by_std_in_grpo"
SESSION_KEYS: ContextVar[Sequence[str] | None] = ContextVar("ngv_session_keys", default=None)
"""The batch's ``{uid}_{session}_{i}`` keys, row by row, while verl's v1 trainer computes advantages (module doc)."""


def compute_masked_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | Sequence[Any],
    epsilon: float | None = None,
    norm_adv_by_std_in_grpo: bool | None = None,
    config: Any = None,
    **unused: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage computed over the valid (not fully masked) samples of each group only.

    Args:
        token_level_rewards: ``(bs, response_length)``; a row's score is its sum.
        response_mask: ``(bs, response_length)``; a row that is all zero is a masked (failed) sample.
        index: ``(bs,)`` group ids (verl's ``uid``); rows with equal ids form a group.
        epsilon: added to the group std before dividing; ``None`` → ``config.masked_grpo_epsilon`` or 1e-6.
        norm_adv_by_std_in_grpo: divide by the group std; ``None`` → ``config.norm_adv_by_std_in_grpo`` or True.
        config: verl's ``config.algorithm`` (DictConfig / AlgoConfig / dict) or None.
        unused: other keyword arguments verl may pass (e.g. ``reward_baselines``); ignored.

    Returns:
        ``(advantages, returns)``, both ``(bs, response_length)`` and equal, zero on masked tokens, on
        masked samples and on groups with fewer than two valid samples. With :data:`SESSION_KEYS` naming several
        rows of one session: computed over one row per session (the module docstring).
    """
    eps, norm_by_std = _resolve_options(epsilon, norm_adv_by_std_in_grpo, config)
    _check_shapes(token_level_rewards, response_mask, index)
    keys = SESSION_KEYS.get()
    if keys is not None and len(keys) == len(index):
        sessions = session_rows(keys, (response_mask.sum(dim=-1) > 0).tolist())
        if sessions is not None:
            session_of, reps = sessions
            rep_adv, _ = _masked_grpo(
                token_level_rewards[reps], response_mask[reps], [index[r] for r in reps], eps, norm_by_std
            )
            first = response_mask[reps].argmax(dim=-1)  # a masked representative's advantage is 0 everywhere
            scalar = rep_adv[torch.arange(len(reps)), first]
            advantages = scalar[torch.as_tensor(session_of, device=scalar.device)].unsqueeze(-1) * response_mask
            return advantages, advantages
    return _masked_grpo(token_level_rewards, response_mask, index, eps, norm_by_std)


def session_rows(keys: Sequence[str], valid: Sequence[bool]) -> tuple[list[int], list[int]] | None:
    """For batch ``keys`` (``{uid}_{session}_{i}``): each row's session number and, per session, the row that stands
    for it (its last valid sample by ``i``, else its last sample); None when every session has one row."""
    numbers: dict[str, int] = {}
    session_of: list[int] = []
    best: list[tuple[bool, int, int]] = []  # per session: (valid, i, row), the max wins
    for row, key in enumerate(keys):
        session, _, i = key.rpartition("_")
        s = numbers.setdefault(session, len(numbers))
        candidate = (bool(valid[row]), int(i), row)
        if s == len(best):
            best.append(candidate)
        elif candidate > best[s]:
            best[s] = candidate
        session_of.append(s)
    if len(best) == len(keys):
        return None
    return session_of, [row for _, _, row in best]


def _masked_grpo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | Sequence[Any],
    eps: float,
    norm_by_std: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked GRPO over the rows' ``index`` groups (the module docstring's rules)."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        dtype = scores.dtype
        valid = response_mask.sum(dim=-1) > 0
        group = torch.as_tensor(_group_ids(index), dtype=torch.long, device=scores.device)
        n_groups = int(group.max().item()) + 1 if group.numel() else 0

        valid_f = valid.to(dtype)
        counts = torch.zeros(n_groups, dtype=dtype, device=scores.device).index_add_(0, group, valid_f)
        # Masked scores are zeroed before summing so they cannot leak into the group statistics.
        valid_scores = torch.where(valid, scores, torch.zeros_like(scores))
        sums = torch.zeros_like(counts).index_add_(0, group, valid_scores)
        mean = sums / counts.clamp(min=1)
        centered = torch.where(valid, scores - mean[group], torch.zeros_like(scores))
        # Unbiased variance (n - 1), like torch.std in verl's GRPO; only used where n >= 2.
        var = torch.zeros_like(counts).index_add_(0, group, centered.square()) / (counts - 1).clamp(min=1)
        std = var.sqrt()

        advantage = centered / (std[group] + eps) if norm_by_std else centered
        has_baseline = valid & (counts[group] >= 2)
        advantage = torch.where(has_baseline, advantage, torch.zeros_like(advantage))
        advantages = advantage.unsqueeze(-1) * response_mask
    return advantages, advantages


def register() -> None:
    """Register :func:`compute_masked_grpo_outcome_advantage` under :data:`MASKED_GRPO` (idempotent).

    verl's ``register_adv_est`` raises when a name is registered twice with different functions; a second
    import of this module under another name (or a reload) yields a new function object, so we accept an
    existing registration of the same function by module and qualified name and refuse anything else.
    """
    from verl.trainer.ppo import core_algos

    try:
        existing = core_algos.get_adv_estimator_fn(MASKED_GRPO)
    except ValueError:  # not registered yet: verl's documented "unknown estimator" error
        core_algos.register_adv_est(MASKED_GRPO)(compute_masked_grpo_outcome_advantage)
        return
    ours = compute_masked_grpo_outcome_advantage
    if existing is ours or (
        getattr(existing, "__module__", None) == ours.__module__
        and getattr(existing, "__qualname__", None) == ours.__qualname__
    ):
        return
    raise AdapterError(
        f"verl advantage estimator {MASKED_GRPO!r} is already registered by "
        f"{getattr(existing, '__module__', '?')}.{getattr(existing, '__qualname__', existing)!r}; "
        "remove the other registration or rename one of them"
    )


def _resolve_options(epsilon: float | None, norm_by_std: bool | None, config: Any) -> tuple[float, bool]:
    """Explicit argument > ``config.algorithm`` key > GRPO default; validated once here."""
    if epsilon is None:
        epsilon = _config_get(config, EPSILON_KEY, DEFAULT_EPSILON)
    if norm_by_std is None:
        norm_by_std = _config_get(config, NORM_BY_STD_KEY, True)
    try:
        eps = float(epsilon)
    except (TypeError, ValueError) as e:
        raise AdapterConfigError(f"algorithm.{EPSILON_KEY}={epsilon!r} is not a number; use e.g. 1e-6") from e
    if not eps >= 0.0:  # also rejects NaN
        raise AdapterConfigError(f"algorithm.{EPSILON_KEY}={epsilon!r} must be >= 0; use e.g. 1e-6")
    if not isinstance(norm_by_std, bool | np.bool_):
        raise AdapterConfigError(f"algorithm.{NORM_BY_STD_KEY}={norm_by_std!r} must be true or false")
    return eps, bool(norm_by_std)


def _config_get(config: Any, key: str, default: Any) -> Any:
    if config is None:
        return default
    value = config.get(key, None) if hasattr(config, "get") else getattr(config, key, None)
    return default if value is None else value


def _check_shapes(rewards: torch.Tensor, mask: torch.Tensor, index: Any) -> None:
    if rewards.dim() != 2 or rewards.shape != mask.shape:
        raise AdapterError(
            f"masked_grpo: token_level_rewards {tuple(rewards.shape)} and response_mask {tuple(mask.shape)} "
            "must both be (batch, response_length)"
        )
    if len(index) != rewards.shape[0]:
        raise AdapterError(f"masked_grpo: index has {len(index)} entries for a batch of {rewards.shape[0]} rows")


def _group_ids(index: Any) -> list[int]:
    """Dense group numbers in order of first appearance (uids are usually strings in an object array)."""
    numbering: dict[Any, int] = {}
    return [numbering.setdefault(uid, len(numbering)) for uid in index]


register()
