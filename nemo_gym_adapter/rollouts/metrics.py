"""Per-environment and overall rollout metrics as one flat ``dict[str, float]`` for verl's trainer logger.

Keys are ``<prefix>/<scope>/<name>`` with scope ``all`` (every sample) or an environment name (``/`` in a name is
replaced by ``_`` so loggers do not nest it). Definitions:

* ``num_samples``: rows in scope, masked included. ``valid_rate``: share not masked.
* ``reward_mean``, ``success_rate``: over *unmasked* samples only (a masked sample's reward is not a measurement),
  using Gym's reward. Success = ``reward > 0`` by default, or ``reward >= success_threshold`` when one is given.
  Both are omitted when a scope has no unmasked sample (a fake 0 would read as a real score).
* ``masked_rate``, ``masked_rate/<reason>``: share of samples masked, overall and for every
  :class:`~nemo_gym_adapter.rollouts.trajectory.MaskReason` (always present, so charts have stable keys).
* ``num_turns_mean``, ``generated_tokens_mean``/``_max`` (sampled tokens), ``truncation_rate``: over unmasked;
  ``forced_token_rate``: the share of their sampled tokens left out of the loss (``rollouts.forced``).
* ``contiguity_failure_rate``: share of samples whose token history broke (masked or truncated because of it);
  ``contiguity_rate`` is its complement (the on-policy health number people watch).
* ``failure_kind_rate``: share of results on which Gym named a ``failure_kind`` (masked or not).
* ``latency_p50``/``_p95``/``_max`` (seconds, linear interpolation): samples with a known latency.
* ``segments_mean``, ``split_rate``: training samples per rollout and the share of rollouts that became several
  (``nemo_gym.trajectory.contiguity: split``; 1 and 0 otherwise).

A *sample* here is one rollout: a rollout split into segments (a tuple of trajectories in the input) counts once,
masked only when every segment is, with its turns, generated tokens and truncation summed over its unmasked segments.

Per environment only (each environment's verifier has its own fields), means over the unmasked samples that carry
the field: ``reward_components/<name>`` for each component of Gym's multi-reward results, ``result/<key>`` for every
other numeric field of Gym's result (``Trajectory.numeric``; NeMo RL logs them all as ``{agent}/{key}``). Bounded:
at most :data:`MAX_RESULT_KEYS` per environment (components first, then by name); when more exist,
``result_keys_dropped`` counts the rest. In an environment whose results carry reward components, over its results
masked or not: ``reward_components_sum_mismatch_rate`` (reward not the sum of the components) and
``reward_components_incomplete_rate`` (a component another result carries is missing;
:mod:`~nemo_gym_adapter.rollouts.reward_components`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from nemo_gym_adapter.data.pass_rates import is_solved  # the one success rule: offline selection and metrics
from nemo_gym_adapter.rollouts.reward_components import component_metrics
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory

ALL_SCOPE = "all"
MAX_RESULT_KEYS = 64  # numeric result fields logged per environment (a verifier may return many)
_COMPONENT = "reward_components/"


def scope_name(name: str) -> str:
    """The metric-key part of an environment name (``/`` → ``_``; never the overall scope's name)."""
    part = name.replace("/", "_") or "unknown"
    return "env_all" if part == ALL_SCOPE else part  # never shadow the overall scope


def _scope_metrics(
    rollouts: Sequence[Trajectory | tuple[Trajectory, ...]], threshold: float | None
) -> dict[str, float]:
    n = len(rollouts)
    out: dict[str, float] = {}
    segments = [len(t) if isinstance(t, tuple) else 1 for t in rollouts]
    out["segments_mean"] = float(np.mean(segments))
    out["split_rate"] = sum(k > 1 for k in segments) / n
    trajs = [_one_rollout(t) if isinstance(t, tuple) else t for t in rollouts]
    valid = [t for t in trajs if not t.masked]
    out.update({"num_samples": float(n), "valid_rate": len(valid) / n, "masked_rate": 1 - len(valid) / n})
    reasons = [t.masked_reason for t in trajs if t.masked]
    for reason in MaskReason:
        out[f"masked_rate/{reason.value}"] = reasons.count(reason) / n
    if valid:
        rewards = np.array([t.gym_reward for t in valid], dtype=np.float64)
        out["reward_mean"] = float(rewards.mean())
        out["success_rate"] = float(np.mean([is_solved(r, threshold) for r in rewards]))
        out["num_turns_mean"] = float(np.mean([t.num_turns for t in valid]))
        generated = [t.num_generated for t in valid]
        out["generated_tokens_mean"] = float(np.mean(generated))
        out["generated_tokens_max"] = float(max(generated))
        out["truncation_rate"] = float(np.mean([t.truncated for t in valid]))
        # sampled tokens left out of the loss as forced by constrained decoding (rollouts.forced)
        out["forced_token_rate"] = sum(t.num_forced for t in valid) / max(1, sum(generated))
        # trained tokens the model never generated (train_tokens: measure_retemplated; 0 otherwise: rollouts.retemplate)
        out["never_generated_rate"] = sum(t.num_never_generated for t in valid) / max(1, sum(generated))
    out["contiguity_failure_rate"] = float(np.mean([t.contiguity_failure for t in trajs]))
    out["contiguity_rate"] = 1.0 - out["contiguity_failure_rate"]
    gym_kinds = [t.failure_kind for t in trajs if t.failure_kind and not t.failure_kind.startswith("client:")]
    out["failure_kind_rate"] = len(gym_kinds) / n
    latencies = np.array([t.latency_s for t in trajs if t.latency_s is not None], dtype=np.float64)
    if latencies.size:
        p50, p95 = np.percentile(latencies, [50, 95])
        out["latency_p50"], out["latency_p95"], out["latency_max"] = float(p50), float(p95), float(latencies.max())
    return out


def _one_rollout(segments: tuple[Trajectory, ...]) -> Trajectory:
    """A split rollout as one sample (the module docstring): its first unmasked segment carrying the sums."""
    valid = [t for t in segments if not t.masked]
    if not valid:
        return segments[0]
    spans = tuple(span for t in valid for span in t.sampled_spans)  # only their lengths count here
    return replace(
        valid[0],
        num_turns=sum(t.num_turns for t in valid),
        sampled_spans=spans,
        truncated=any(t.truncated for t in valid),
        contiguity_failure=True,
        forced=np.concatenate([np.zeros(t.num_generated, bool) if t.forced is None else t.forced for t in valid]),
        never_generated=None,  # a split rollout trains each segment's own generation only
    )


def compute_metrics(
    trajectories: Sequence[Trajectory | tuple[Trajectory, ...]],
    *,
    prefix: str = "gym",
    success_threshold: float | None = None,
) -> dict[str, float]:
    """Flat metrics of one batch of rollouts (definitions in the module docstring); ``{}`` for no input. Each item
    is a rollout's trajectory, or the tuple of its segments' trajectories when it was split."""
    if not trajectories:
        return {}
    by_env: dict[str, list[Trajectory | tuple[Trajectory, ...]]] = defaultdict(list)
    for t in trajectories:
        by_env[scope_name((t[0] if isinstance(t, tuple) else t).env_name)].append(t)
    scopes = {ALL_SCOPE: list(trajectories), **{env: by_env[env] for env in sorted(by_env)}}
    metrics: dict[str, float] = {}
    for scope, trajs in scopes.items():
        for name, value in _scope_metrics(trajs, success_threshold).items():
            metrics[f"{prefix}/{scope}/{name}"] = value
    for env in sorted(by_env):
        rollouts = [_one_rollout(t) if isinstance(t, tuple) else t for t in by_env[env]]  # a split one counts once
        for name, value in result_field_metrics(rollouts).items():
            metrics[f"{prefix}/{env}/{name}"] = value
        for name, value in component_metrics(rollouts).items():
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
