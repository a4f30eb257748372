"""Per-environment and overall rollout metrics as one flat ``dict[str, float]`` for verl's trainer logger.

Keys are ``<prefix>/<scope>/<name>`` with scope ``all`` (every sample) or an environment name (``/`` in a name is
replaced by ``_`` so loggers do not nest it). Definitions:

* ``num_samples``: rows in scope, masked included. ``valid_rate``: share not masked.
* ``reward_mean``, ``success_rate``: over *unmasked* samples only (a masked sample's reward is not a measurement),
  using Gym's reward. Success = ``reward > 0`` by default, or ``reward >= success_threshold`` when one is given.
  Both are omitted when a scope has no unmasked sample (a fake 0 would read as a real score).
* ``masked_rate``, ``masked_rate/<reason>``: share of samples masked, overall and for every
  :class:`~nemo_gym_adapter.rollouts.trajectory.MaskReason` (always present, so charts have stable keys).
* ``num_turns_mean``, ``generated_tokens_mean``/``_max`` (sampled tokens), ``truncation_rate``: over unmasked.
* ``contiguity_failure_rate``: share of samples whose token history broke (masked or truncated because of it);
  ``contiguity_rate`` is its complement (the on-policy health number people watch).
* ``failure_kind_rate``: share of results on which Gym named a ``failure_kind`` (masked or not).
* ``latency_p50``/``_p95``/``_max`` (seconds, linear interpolation): samples with a known latency.

Per environment only (each environment's verifier has its own fields), means over the unmasked samples that carry
the field: ``reward_components/<name>`` for each component of Gym's multi-reward results, ``result/<key>`` for every
other numeric field of Gym's result (``Trajectory.numeric``; NeMo RL logs them all as ``{agent}/{key}``). Bounded:
at most :data:`MAX_RESULT_KEYS` per environment (components first, then by name); when more exist,
``result_keys_dropped`` counts the rest.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory

ALL_SCOPE = "all"
MAX_RESULT_KEYS = 64  # numeric result fields logged per environment (a verifier may return many)
_COMPONENT = "reward_components/"


def scope_name(name: str) -> str:
    """The metric-key part of an environment name (``/`` → ``_``; never the overall scope's name)."""
    part = name.replace("/", "_") or "unknown"
    return "env_all" if part == ALL_SCOPE else part  # never shadow the overall scope


def _is_success(reward: float, threshold: float | None) -> bool:
    return reward > 0 if threshold is None else reward >= threshold


def _scope_metrics(trajs: Sequence[Trajectory], threshold: float | None) -> dict[str, float]:
    n = len(trajs)
    valid = [t for t in trajs if not t.masked]
    out: dict[str, float] = {"num_samples": float(n), "valid_rate": len(valid) / n, "masked_rate": 1 - len(valid) / n}
    reasons = [t.masked_reason for t in trajs if t.masked]
    for reason in MaskReason:
        out[f"masked_rate/{reason.value}"] = reasons.count(reason) / n
    if valid:
        rewards = np.array([t.gym_reward for t in valid], dtype=np.float64)
        out["reward_mean"] = float(rewards.mean())
        out["success_rate"] = float(np.mean([_is_success(r, threshold) for r in rewards]))
        out["num_turns_mean"] = float(np.mean([t.num_turns for t in valid]))
        generated = [t.num_generated for t in valid]
        out["generated_tokens_mean"] = float(np.mean(generated))
        out["generated_tokens_max"] = float(max(generated))
        out["truncation_rate"] = float(np.mean([t.truncated for t in valid]))
    out["contiguity_failure_rate"] = float(np.mean([t.contiguity_failure for t in trajs]))
    out["contiguity_rate"] = 1.0 - out["contiguity_failure_rate"]
    gym_kinds = [t.failure_kind for t in trajs if t.failure_kind and not t.failure_kind.startswith("client:")]
    out["failure_kind_rate"] = len(gym_kinds) / n
    latencies = np.array([t.latency_s for t in trajs if t.latency_s is not None], dtype=np.float64)
    if latencies.size:
        p50, p95 = np.percentile(latencies, [50, 95])
        out["latency_p50"], out["latency_p95"], out["latency_max"] = float(p50), float(p95), float(latencies.max())
    return out


def compute_metrics(
    trajectories: Sequence[Trajectory], *, prefix: str = "gym", success_threshold: float | None = None
) -> dict[str, float]:
    """Flat metrics of one batch of trajectories (definitions in the module docstring); ``{}`` for no input."""
    if not trajectories:
        return {}
    by_env: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_env[scope_name(t.env_name)].append(t)
    scopes = {ALL_SCOPE: list(trajectories), **{env: by_env[env] for env in sorted(by_env)}}
    metrics: dict[str, float] = {}
    for scope, trajs in scopes.items():
        for name, value in _scope_metrics(trajs, success_threshold).items():
            metrics[f"{prefix}/{scope}/{name}"] = value
    for env in sorted(by_env):
        for name, value in result_field_metrics(by_env[env]).items():
            metrics[f"{prefix}/{env}/{name}"] = value
    return metrics


def result_field_metrics(trajs: Sequence[Trajectory], limit: int = MAX_RESULT_KEYS) -> dict[str, float]:
    """Means of Gym's numeric result fields over the unmasked ``trajs`` carrying each (the module docstring)."""
    values: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        if not t.masked:
            for key, value in t.numeric.items():
                values[key].append(value)
    keys = sorted(values, key=lambda k: (not k.startswith(_COMPONENT), k))
    out = {(k if k.startswith(_COMPONENT) else f"result/{k}"): float(np.mean(values[k])) for k in keys[:limit]}
    if len(keys) > limit:
        out["result_keys_dropped"] = float(len(keys) - limit)
    return out
