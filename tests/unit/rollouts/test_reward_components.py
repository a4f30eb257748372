"""Gym's multi-reward results per sample (``nemo_gym_adapter.rollouts.reward_components``): missing components, a
reward that is not the sum of its components, and both rates in the per-environment metrics."""

from __future__ import annotations

import logging

import pytest

from nemo_gym_adapter.rollouts import reward_components as rc
from nemo_gym_adapter.rollouts.metrics import compute_metrics
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory


def result(reward, components=None, env="multi", masked=None):
    numeric = {f"reward_components/{k}": v for k, v in (components or {}).items()}
    return Trajectory(
        env_name=env, reward=0.0 if masked else reward, gym_reward=reward, numeric=numeric, masked_reason=masked
    )


def test_missing_names_the_required_components_a_result_lacks_in_order():
    numeric = {"reward_components/format": 1.0, "steps": 3.0}
    assert rc.missing(numeric, ["correctness", "format", "schema_valid"]) == ["correctness", "schema_valid"]
    assert rc.missing(numeric, []) == []


@pytest.mark.parametrize(
    ("reward", "components", "mismatch"),
    [
        (3.0, {"a": 1.0, "b": 2.0}, False),
        (0.3, {"a": 0.1, "b": 0.2}, False),  # float rounding of the sum is not a mismatch
        (1.0 + 5e-7, {"a": 1.0}, False),  # within NeMo RL's tolerance
        (2.0, {"a": 1.0, "b": 0.5}, True),
        (1.5, {"a": 1.0, "b": 1.0}, True),  # a weighted aggregate: not the sum
        (7.0, {}, False),  # no components: nothing to compare
    ],
)
def test_sum_mismatch_uses_nemo_rls_tolerance(reward, components, mismatch):
    assert rc.sum_mismatch(reward, components) is mismatch


def test_component_metrics_count_mismatches_and_incomplete_results(caplog):
    rc._WARNED.discard("weighted")
    rows = [
        result(2.0, {"correctness": 1.0, "format": 1.0}, env="weighted"),
        result(1.5, {"correctness": 1.0, "format": 1.0}, env="weighted"),  # not the sum
        result(1.0, {"correctness": 1.0}, env="weighted"),  # lacks format, another result carries it
        result(0.0, {"format": 0.0}, env="weighted", masked=MaskReason.MISSING_REWARD_COMPONENT),  # counts too
        Trajectory(env_name="weighted", masked_reason=MaskReason.TIMEOUT),  # no result: not counted
    ]
    with caplog.at_level(logging.WARNING, logger=rc.__name__):
        m = rc.component_metrics(rows)
        rc.component_metrics(rows)
    assert m == {rc.SUM_MISMATCH_RATE: 0.25, rc.INCOMPLETE_RATE: 0.5}
    warnings = [r for r in caplog.records if "not their sum" in r.getMessage()]
    assert len(warnings) == 1 and "'weighted'" in warnings[0].getMessage() and "1.5" in warnings[0].getMessage()


def test_no_components_no_component_metrics():
    assert rc.component_metrics([result(1.0), result(0.0)]) == {}


def test_compute_metrics_reports_them_per_environment_only_where_components_exist():
    rows = [result(2.0, {"a": 1.0, "b": 1.0}, env="multi"), result(1.0, {"a": 1.0}, env="multi"), result(1.0, env="q")]
    m = compute_metrics(rows)
    assert m["gym/multi/reward_components_sum_mismatch_rate"] == 0.0
    assert m["gym/multi/reward_components_incomplete_rate"] == 0.5
    assert "gym/q/reward_components_incomplete_rate" not in m and "gym/all/reward_components_incomplete_rate" not in m
