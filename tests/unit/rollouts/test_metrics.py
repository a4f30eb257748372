"""Unit tests of the flat per-environment rollout metrics."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from nemo_gym_adapter.rollouts.metrics import MAX_RESULT_KEYS, compute_metrics
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory


def traj(
    env="a", reward=1.0, masked=None, turns=1, spans=((0, 3),), truncated=False, contig=False, kind=None, lat=None
):
    n = sum(e - s for s, e in spans) if masked is None else 0
    return Trajectory(
        env_name=env,
        response_ids=np.zeros(max((e for _, e in spans), default=0) if masked is None else 0, dtype=np.int64),
        sampled_spans=tuple(spans) if masked is None else (),
        sampled_logprobs=np.zeros(n, dtype=np.float32),
        reward=0.0 if masked else reward,
        gym_reward=reward,
        num_turns=turns,
        masked_reason=masked,
        truncated=truncated,
        contiguity_failure=contig,
        failure_kind=kind,
        latency_s=lat,
    )


def test_reward_and_success_over_unmasked_samples_only():
    trajs = [traj(reward=1.0), traj(reward=0.0), traj(reward=0.5), traj(reward=1.0, masked=MaskReason.MASK_SAMPLE)]
    m = compute_metrics(trajs)
    assert m["gym/all/num_samples"] == 4
    assert m["gym/all/reward_mean"] == pytest.approx(0.5)  # the masked 1.0 is not a measurement
    assert m["gym/all/success_rate"] == pytest.approx(2 / 3)  # reward > 0
    assert compute_metrics(trajs, success_threshold=1.0)["gym/all/success_rate"] == pytest.approx(1 / 3)
    assert m["gym/all/masked_rate"] == 0.25 and m["gym/all/valid_rate"] == 0.75


def test_per_environment_scopes_and_stable_mask_reason_keys():
    trajs = [traj("weather"), traj("weather", masked=MaskReason.TIMEOUT), traj("math/v2", reward=0.0)]
    m = compute_metrics(trajs)
    assert m["gym/weather/masked_rate/timeout"] == 0.5 and m["gym/math_v2/masked_rate/timeout"] == 0.0
    assert m["gym/all/masked_rate/timeout"] == pytest.approx(1 / 3)
    for reason in MaskReason:
        for scope in ("all", "weather", "math_v2"):
            assert f"gym/{scope}/masked_rate/{reason.value}" in m
    assert m["gym/math_v2/reward_mean"] == 0.0 and m["gym/weather/reward_mean"] == 1.0
    assert all(isinstance(v, float) for v in m.values())


def test_scope_without_valid_samples_has_no_reward_keys():
    m = compute_metrics([traj("dead", masked=MaskReason.REQUEST_FAILED), traj("ok")])
    assert "gym/dead/reward_mean" not in m and "gym/dead/success_rate" not in m
    assert m["gym/dead/masked_rate/request_failed"] == 1.0 and m["gym/ok/reward_mean"] == 1.0


def test_turns_tokens_truncation_contiguity_failure_kinds():
    trajs = [
        traj(turns=1, spans=((0, 2),)),
        traj(turns=3, spans=((0, 2), (5, 9), (12, 13)), truncated=True, contig=True, kind="judge_failed"),
        traj(masked=MaskReason.NON_CONTIGUOUS, contig=True),
        traj(masked=MaskReason.TIMEOUT, kind="client:timeout"),
    ]
    m = compute_metrics(trajs)
    assert m["gym/all/num_turns_mean"] == 2.0
    assert m["gym/all/generated_tokens_mean"] == 4.5 and m["gym/all/generated_tokens_max"] == 7.0
    assert m["gym/all/truncation_rate"] == 0.5
    assert m["gym/all/contiguity_failure_rate"] == 0.5
    assert m["gym/all/contiguity_rate"] == 0.5
    assert m["gym/all/failure_kind_rate"] == 0.25  # client failures are counted as masked reasons, not kinds


def test_latency_percentiles():
    trajs = [traj(lat=float(s)) for s in range(1, 101)] + [traj()]
    m = compute_metrics(trajs)
    assert m["gym/all/latency_p50"] == pytest.approx(50.5)
    assert m["gym/all/latency_p95"] == pytest.approx(95.05)
    assert m["gym/all/latency_max"] == 100.0
    assert "gym/all/latency_p50" not in compute_metrics([traj()])


def test_env_named_all_does_not_shadow_the_overall_scope_and_empty_input():
    m = compute_metrics([traj("all", reward=0.0), traj("b", reward=1.0)], prefix="x")
    assert m["x/all/num_samples"] == 2 and m["x/env_all/num_samples"] == 1
    assert compute_metrics([]) == {}
    assert not any(math.isnan(v) for v in m.values())


def test_every_numeric_result_field_and_reward_component_per_environment_over_unmasked_samples():
    def with_fields(env, numeric, masked=None):
        return replace(traj(env, masked=masked), numeric=numeric)

    trajs = [
        with_fields("tools", {"reward_components/correct": 1.0, "reward_components/format": 0.0, "accuracy": 1.0}),
        with_fields("tools", {"reward_components/correct": 0.0, "reward_components/format": 1.0, "accuracy": 0.5}),
        with_fields("tools", {"reward_components/correct": 1.0, "accuracy": 9.0}, masked=MaskReason.MASK_SAMPLE),
        with_fields("quiz", {"set_overlap": 0.25}),
        traj("quiz"),  # a result without the field: not counted in its mean
    ]
    m = compute_metrics(trajs)
    assert m["gym/tools/reward_components/correct"] == 0.5 and m["gym/tools/reward_components/format"] == 0.5
    assert m["gym/tools/result/accuracy"] == 0.75  # the masked sample's 9.0 is not a measurement
    assert m["gym/quiz/result/set_overlap"] == 0.25
    assert not [k for k in m if k.startswith("gym/all/result") or k.startswith("gym/all/reward_components")]
    assert "gym/tools/result/set_overlap" not in m and "gym/tools/result_keys_dropped" not in m


def test_result_fields_are_bounded_per_environment_components_first():
    numeric = {f"field_{i:03d}": float(i) for i in range(MAX_RESULT_KEYS + 5)} | {"reward_components/z": 1.0}
    m = compute_metrics([replace(traj("big"), numeric=numeric)])
    logged = [k for k in m if k.startswith("gym/big/result/") or k.startswith("gym/big/reward_components/")]
    assert len(logged) == MAX_RESULT_KEYS and "gym/big/reward_components/z" in m
    assert m["gym/big/result_keys_dropped"] == 6.0
