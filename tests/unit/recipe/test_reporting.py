"""Unit tests of run reporting (recipe/nemo_gym/reporting.py) on synthetic verl file-logger output.

The synthetic files are written the way verl 0.9.1's ``FileLogger.log`` writes them: one
``orjson.dumps({"step": step, "data": metrics}, option=OPT_SERIALIZE_NUMPY)`` line per ``Tracking.log`` call, with
numpy scalars among the values and validation metrics on their own line with the same step.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import orjson
import pytest

from recipe.nemo_gym.reporting import (
    MetricsFileError,
    format_table,
    load_reward_curve,
    load_step_metrics,
    main,
    plot_reward_curve,
    window_summary,
)

ENV_A, ENV_B = "toy_choice_simple_agent", "example_single_tool_call_simple_agent"


def write_log(path: Path, records: list[tuple[int, dict]]) -> Path:
    with open(path, "wb") as f:
        for step, data in records:
            f.write(orjson.dumps({"step": step, "data": data}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return path


def training_metrics(step: int, reward: float, prefix: str = "timing_s/gym") -> dict:
    """One step as the recipe logs it: adapter metrics (via meta_info["timing"]) + verl's own."""
    return {
        f"{prefix}/all/reward_mean": np.float64(reward),
        f"{prefix}/all/masked_rate": 0.1 if step % 4 == 0 else 0.0,
        f"{prefix}/{ENV_A}/reward_mean": reward + 0.05,
        f"{prefix}/{ENV_B}/reward_mean": reward - 0.05,
        "critic/score/mean": np.float32(reward * 0.9),
        "timing_s/step": 4.0 + step / 10,
        "training/global_step": step,
        "actor/lr": [1e-4],  # not a number: ignored
    }


def rising_run(tmp_path: Path, steps: int = 20, name: str = "run.jsonl") -> Path:
    records = [(s, training_metrics(s, 0.25 + 0.5 * (s - 1) / (steps - 1))) for s in range(1, steps + 1)]
    records.insert(10, (10, {"val-core/toy/reward/mean@1": 0.5}))  # validation: own line, same step
    return write_log(tmp_path / name, records)


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


def test_window_summary_and_table(tmp_path):
    curve = load_reward_curve(rising_run(tmp_path))
    s = window_summary(curve, k=5)
    first = np.mean([0.25 + 0.5 * i / 19 for i in range(5)])
    last = np.mean([0.25 + 0.5 * i / 19 for i in range(15, 20)])
    assert s["first_mean"] == pytest.approx(first) and s["last_mean"] == pytest.approx(last)
    assert s["difference"] == pytest.approx(last - first) and s["ratio"] == pytest.approx(last / first)
    table = format_table(curve).splitlines()
    assert len(table) == 21 and table[0].split()[:2] == ["step", "reward[all]"]
    assert table[1].split()[:2] == ["1", "0.250"] and table[-1].split()[-1] == "6.0"  # step_s of step 20


def test_ratio_is_nan_when_the_first_window_is_zero(tmp_path):
    curve = load_reward_curve(write_log(tmp_path / "m.jsonl", [(1, {"gym/all/reward_mean": 0.0})]))
    assert math.isnan(window_summary(curve)["ratio"])


def _ink(png: Path) -> tuple[tuple[int, ...], float]:
    """Image shape and the share of pixels that are coloured (lines), not white/grey (background, grid, text)."""
    import matplotlib.image

    img = matplotlib.image.imread(png)[..., :3]
    chroma = img.max(axis=-1) - img.min(axis=-1)
    return img.shape, float((chroma > 0.2).mean())


def test_png_is_written_and_shows_the_series(tmp_path):
    curve = load_reward_curve(rising_run(tmp_path))
    out = plot_reward_curve(curve, tmp_path / "sub" / "curve.png")
    assert out.is_file() and out.stat().st_size > 10_000
    shape, ink = _ink(out)
    assert shape[0] > 400 and shape[1] > 600
    assert ink > 0.003  # coloured curves present
    # A different run gives a different picture (the plot depends on the data, not just on the axes).
    flat = [(s, {"gym/all/reward_mean": 0.5}) for s in range(1, 21)]
    other = plot_reward_curve(load_reward_curve(write_log(tmp_path / "flat.jsonl", flat)), tmp_path / "flat.png")
    assert _ink(other)[1] < ink and other.read_bytes() != out.read_bytes()


@pytest.mark.parametrize(
    ("content", "where", "says"),
    [
        ('{"step": 1, "data": {}}\n{"step": 2, "data": {}\n', ":2:", "not JSON"),
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


def test_cli_writes_the_png_and_reports_errors(tmp_path, capsys):
    out = tmp_path / "c.png"
    assert main([str(rising_run(tmp_path)), "-o", str(out), "--table"]) == 0
    printed = capsys.readouterr().out
    assert out.is_file() and "20 steps" in printed and "reward[all]" in printed and "first 5 steps mean" in printed
    assert main([str(rising_run(tmp_path))]) == 0  # default PNG: next to the metrics file
    assert (tmp_path / "reward_curve.png").is_file()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1, "data": {}}\nnot json\n')
    assert main([str(bad), "-o", str(tmp_path / "x.png")]) == 1
    assert f"{bad}:2: not JSON" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_summary_prints_each_environments_first_and_last_window(tmp_path):
    from recipe.nemo_gym.reporting import summary_text

    records = [(s, training_metrics(s, 0.2 + 0.05 * s, prefix="gym")) for s in range(1, 11)]
    text = summary_text(load_reward_curve(write_log(tmp_path / "m.jsonl", records)), window=5)
    a = [line for line in text.splitlines() if line.strip().startswith(f"{ENV_A}:")]
    assert a == [f"  {ENV_A}: first 5 0.400 -> last 5 0.650 (+0.250)"]
    assert any(line.strip().startswith(f"{ENV_B}:") for line in text.splitlines())


def test_a_validation_only_step_is_not_a_training_step(tmp_path):
    records = [(0, {"val-core/e/gym/reward_mean": 0.3}), *[(s, {"gym/all/reward_mean": 0.5}) for s in (1, 2)]]
    assert load_reward_curve(write_log(tmp_path / "m.jsonl", records)).steps == [1, 2]
