"""A run's metrics file -> its curves (``recipe.nemo_gym.reporting.curve``), on synthetic verl file-logger output
(``tests/support/metrics_files.py``)."""

from __future__ import annotations

import math

import pytest

from recipe.nemo_gym.reporting.curve import MetricsFileError, load_reward_curve, load_step_metrics, window_summary
from tests.support.metrics_files import ENV_A, ENV_B, rising_run, validated_run, write_log


def test_loads_merges_steps_and_keeps_numbers_only(tmp_path):
    steps = load_step_metrics(rising_run(tmp_path))
    assert list(steps) == list(range(1, 21))
    assert steps[10]["val-core/toy/reward/mean@1"] == 0.5 and "timing_s/step" in steps[10]
    assert "actor/lr" not in steps[1]
    assert steps[1]["timing_s/gym/all/reward_mean"] == pytest.approx(0.25)


def test_curve_per_environment_masked_rate_and_step_time(tmp_path):
    curve = load_reward_curve(rising_run(tmp_path))
    assert curve.steps == list(range(1, 21))
    assert list(curve.reward) == ["all", ENV_B, ENV_A]  # overall first, then environments by name
    assert curve.source == "timing_s/gym/all/reward_mean"
    assert curve.overall[0] == pytest.approx(0.25) and curve.overall[-1] == pytest.approx(0.75)
    assert curve.reward[ENV_A][0] == pytest.approx(0.30)
    assert curve.masked_rate[3] == pytest.approx(0.1) and curve.masked_rate[0] == 0.0
    assert curve.step_time_s[0] == pytest.approx(4.1)
    assert curve.extra["critic/score/mean"][0] == pytest.approx(0.225)


def test_plain_prefix_wins_over_the_timing_spelling_and_missing_steps_are_nan(tmp_path):
    records = [
        (1, {"gym/all/reward_mean": 0.2, "timing_s/gym/all/reward_mean": 0.9}),
        (2, {"timing_s/step": 3.0}),  # a step without the metric
        (3, {"gym/all/reward_mean": 0.4}),
    ]
    curve = load_reward_curve(write_log(tmp_path / "m.jsonl", records))
    assert curve.source == "gym/all/reward_mean"
    assert curve.overall[0] == 0.2 and math.isnan(curve.overall[1]) and curve.overall[2] == 0.4
    assert curve.masked_rate is None
    s = window_summary(curve, k=5)  # 3 steps: windows of 1, never overlapping
    assert (s["k"], s["first_mean"], s["last_mean"]) == (1, 0.2, 0.4)
    assert window_summary(curve, k=1)["difference"] == pytest.approx(0.2)
    nan_first = load_reward_curve(write_log(tmp_path / "n.jsonl", [(1, {"timing_s/step": 1.0}), *records]))
    assert window_summary(nan_first, k=2)["first_mean"] == 0.2  # NaN steps are skipped


def test_falls_back_to_verls_score_without_adapter_metrics(tmp_path):
    records = [(s, {"critic/score/mean": 0.1 * s, "timing_s/step": 2.0}) for s in range(1, 4)]
    curve = load_reward_curve(write_log(tmp_path / "m.jsonl", records))
    assert curve.source == "critic/score/mean" and curve.masked_rate is None and not curve.extra
    assert curve.overall == pytest.approx([0.1, 0.2, 0.3])


def test_ratio_is_nan_when_the_first_window_is_zero(tmp_path):
    curve = load_reward_curve(write_log(tmp_path / "m.jsonl", [(1, {"gym/all/reward_mean": 0.0})]))
    assert math.isnan(window_summary(curve)["ratio"])


@pytest.mark.parametrize(
    ("content", "where", "says"),
    [
        ('{"step": 1, "data": {}}\n{"step": 2, "data": {}\n', ":2:", "invalid JSON"),
        ('{"step": 1, "data": {}}\n\n[1, 2]\n', ":3:", "got list"),
        ('{"step": "1", "data": {}}\n', ":1:", "'step' must be an integer"),
        ('{"step": 1, "data": [1]}\n', ":1:", "'data' must be an object"),
        ("", "", "no metrics"),
        ('{"step": 1, "data": {"actor/lr": 0.1}}\n', "", "no reward metric"),
    ],
)
def test_bad_input_names_the_file_and_line(tmp_path, content, where, says):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(MetricsFileError) as err:
        load_reward_curve(path)
    assert f"{path}{where}" in str(err.value) and says in str(err.value)


def test_missing_file_is_a_metrics_file_error(tmp_path):
    with pytest.raises(MetricsFileError, match="cannot read"):
        load_step_metrics(tmp_path / "nope.jsonl")


def test_a_validation_only_step_is_not_a_training_step(tmp_path):
    records = [(0, {"val-core/e/gym/reward_mean": 0.3}), *[(s, {"gym/all/reward_mean": 0.5}) for s in (1, 2)]]
    assert load_reward_curve(write_log(tmp_path / "m.jsonl", records)).steps == [1, 2]


def test_validation_success_per_environment_at_the_steps_validation_ran(tmp_path):
    curve = load_reward_curve(validated_run(tmp_path))
    assert curve.steps == [1, 2, 3, 4] and curve.val_steps == [0, 2, 4]  # step 0: before training
    assert list(curve.val_success) == ["all", ENV_B, ENV_A]  # overall first, then environments by name
    assert curve.val_success[ENV_A] == [0.0, 0.25, 0.5] and curve.val_success[ENV_B] == [1.0, 1.0, 1.0]
    assert curve.val_success["all"] == pytest.approx([0.5, 0.625, 0.75])
    plain = load_reward_curve(rising_run(tmp_path))  # verl's val-core/<ds>/reward/mean@1 only: no success series
    assert plain.val_steps == [] and plain.val_success == {}
