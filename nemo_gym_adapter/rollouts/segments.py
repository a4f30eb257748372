"""``nemo_gym.trajectory.contiguity: split``: a rollout whose model calls do not form one history becomes one
trajectory per prefix-consistent segment (issue 19 item 6).

Agents that rewrite their context (Gym 0.7's LangGraph reflection agent, which sends its reflection back as user text;
``vllm_model_with_compaction``) make calls whose prompt does not extend the previous prompt + generation. Under
``mask`` such a rollout is one masked sample, so the environment cannot be trained at all. Under ``split``
(:func:`build_trajectories`):

- the calls are grouped by :func:`~nemo_gym_adapter.rollouts.model_calls.prefix_segments` (in call order, a call
  joins the segment whose last call it extends, else starts a new one);
- each segment is built like a whole rollout (:func:`~nemo_gym_adapter.rollouts.builder.build_trajectory` over the
  result restricted to the segment's model calls: its own prompt, response and budgets), with the rollout's reward,
  ``segment``/``segments`` set, ``contiguity_failure`` True and the first break as ``detail``;
- so every generated token is in exactly one segment's sampled spans, and a segment's prompt holds what it shares with
  earlier calls (their generations included) at mask 0: no token is trained twice, none the model did not generate in
  that very call is trained.

Rows masked for another reason (``mask_sample``, missing ids or log-probs, a first prompt too long, client failures)
stay one masked sample. The v1 manager puts the segments as ``{uid}_{session}_{i}`` and ``masked_grpo`` counts the
session once (``recipe.nemo_gym.algorithms.masked_grpo``); the legacy trainer refuses ``split`` at start-up (``config``).

Called by :mod:`nemo_gym_adapter.rollouts.outcome` with the result it parsed (and by tests); imports :mod:`builder`,
:mod:`model_calls` and, for ``train_tokens: measure_retemplated`` (the one other way a result becomes samples),
:mod:`retemplate`.
"""

from __future__ import annotations

from dataclasses import replace

from nemo_gym_adapter.rollouts.builder import build_trajectory
from nemo_gym_adapter.rollouts.model_calls import prefix_segments
from nemo_gym_adapter.rollouts.retemplate import retemplated_trajectory
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory, TrajectoryConfig
from nemo_gym_adapter.wire.payloads import GymRunResult


def build_trajectories(
    result: GymRunResult,
    *,
    env_name: str,
    config: TrajectoryConfig,
    row_index: int | None = None,
    latency_s: float | None = None,
) -> tuple[Trajectory, ...]:
    """One parsed ``/run`` result → its trajectories: :func:`build_trajectory`'s one, or under ``split`` one per
    segment of a rollout whose calls do not form one history (module docstring); under ``train_tokens:
    measure_retemplated`` its re-templated one (:mod:`nemo_gym_adapter.rollouts.retemplate`)."""
    if config.train_tokens == "measure_retemplated":
        sample = retemplated_trajectory(
            result, env_name=env_name, config=config, renderer=config.renderer, row_index=row_index, latency_s=latency_s
        )
        return (sample,)
    first = build_trajectory(result, env_name=env_name, config=config, row_index=row_index, latency_s=latency_s)
    if config.contiguity != "split" or first.masked_reason is not MaskReason.NON_CONTIGUOUS:
        return (first,)
    return _split(result, first, env_name, config, row_index, latency_s)


def _split(
    result: GymRunResult,
    whole: Trajectory,
    env_name: str,
    config: TrajectoryConfig,
    row_index: int | None,
    latency_s: float | None,
) -> tuple[Trajectory, ...]:
    calls = result.model_calls()
    output = result.response.output
    segments = prefix_segments(calls)
    out = []
    for s, segment in enumerate(segments):
        items = [output[calls[k][0]] for k in segment]  # the segment's model calls (they carry its ids)
        part = result.model_copy(update={"response": result.response.model_copy(update={"output": items})})
        t = build_trajectory(part, env_name=env_name, config=config, row_index=row_index, latency_s=latency_s)
        calls_of_spans = tuple(segment[: len(t.sampled_spans)])  # a segment cut at its budget keeps its first calls
        out.append(
            replace(
                t,
                segment=s,
                segments=len(segments),
                contiguity_failure=True,
                detail=whole.detail,
                call_indices=calls_of_spans,
            )
        )
    return tuple(out)
