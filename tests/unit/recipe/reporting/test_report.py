"""Unit tests of run reporting (recipe/nemo_gym/reporting/report.py): table, summary, command; synthetic verl file-logger output
(``tests/support/metrics_files.py``).

The synthetic files are written the way verl 0.9.1's ``FileLogger.log`` writes them: one
``orjson.dumps({"step": step, "data": metrics}, option=OPT_SERIALIZE_NUMPY)`` line per ``Tracking.log`` call, with
numpy scalars among the values and validation metrics on their own line with the same step.
"""

from __future__ import annotations

import numpy as np
import pytest

from recipe.nemo_gym.reporting.curve import load_reward_curve, window_summary
from recipe.nemo_gym.reporting.report import format_table, main, summary_text
from tests.support.metrics_files import ENV_A, ENV_B, rising_run, training_metrics, validated_run, write_log


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
    assert f"{bad}:2: invalid JSON" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_summary_prints_each_environments_first_and_last_window(tmp_path):
    records = [(s, training_metrics(s, 0.2 + 0.05 * s, prefix="gym")) for s in range(1, 11)]
    text = summary_text(load_reward_curve(write_log(tmp_path / "m.jsonl", records)), window=5)
    a = [line for line in text.splitlines() if line.strip().startswith(f"{ENV_A}:")]
    assert a == [f"  {ENV_A}: first 5 0.400 -> last 5 0.650 (+0.250)"]
    assert any(line.strip().startswith(f"{ENV_B}:") for line in text.splitlines())


def test_validation_rows_beside_training_ones_in_the_table_and_the_report(tmp_path, capsys):
    curve = load_reward_curve(validated_run(tmp_path))
    table = format_table(curve).splitlines()
    header = table[0].split()
    assert header[:2] == ["step", "reward[all]"] and header[-3:] == [
        "val_success[all]",
        f"val_success[{ENV_B}]",
        f"val_success[{ENV_A}]",
    ]
    rows = {int(line.split()[0]): line.split() for line in table[1:]}
    assert sorted(rows) == [0, 1, 2, 3, 4]  # step 0: validation only, training columns "-"
    assert rows[0][1] == "-" and rows[0][-1] == "0.000" and rows[1][-1] == "-" and rows[4][-1] == "0.500"
    text = summary_text(curve)
    assert f"validation success at step 2: all 0.625, {ENV_B} 1.000, {ENV_A} 0.250" in text
    assert f"  {ENV_A}: validation success 0.000 (step 0) -> 0.500 (step 4)" in text
    assert main([str(validated_run(tmp_path, name="cli.jsonl"))]) == 0
    assert "validation success at step 4:" in capsys.readouterr().out
