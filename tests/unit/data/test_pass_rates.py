"""Rows by pass rate (nemo_gym_adapter.data.pass_rates): rollouts are hand-written collect --output lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym_adapter.data import pass_rates


def _row(question: str, tools: tuple[str, ...] = ("add", "sin"), **extra) -> dict:
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": question}],
            "tools": [{"type": "function", "name": t, "parameters": {}} for t in tools],
        },
        **extra,
    }


def _rollout(row: dict, reward: float | None, masked: str | None = None) -> dict:
    """A collect --output line as Gym echoes the request: its messages gain ``type`` and ``phase``."""
    params = row["responses_create_params"]
    echoed = {
        "input": [{**m, "type": "message", "phase": None} for m in params["input"]],
        "tools": params["tools"],
        "temperature": 1.0,
    }
    return {"index": 0, "reward": reward, "masked_reason": masked, "result": {"responses_create_params": echoed}}


def _write(path: Path, objs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs), encoding="utf-8")
    return path


ROWS = [
    _row("mixed", family="a"),
    _row("never", family="b"),
    _row("always", family="c"),
    _row("unmeasured", family="d"),
    _row("masked", family="e"),
    _row("mixed", tools=("multiply",), family="f"),  # the same question with other tools: another row
]


def _rollouts() -> list[dict]:
    m, n, a, _, k, other = ROWS
    return [
        _rollout(m, 1.0),
        _rollout(m, 0.0),
        _rollout(m, 0.0),
        _rollout(n, 0.0),
        _rollout(n, 0.0),
        _rollout(a, 1.0),
        _rollout(a, 0.5),
        _rollout(k, None, masked="timeout"),
        _rollout(other, 0.0),
    ]


def test_keeps_the_rows_with_mixed_outcomes_in_file_order_and_says_why_of_every_other_row(tmp_path):
    rows = _write(tmp_path / "rows.jsonl", ROWS)
    out = tmp_path / "kept.jsonl"
    assert pass_rates.main(["--rows", str(rows), "--rollouts", str(_write(tmp_path / "r.jsonl", _rollouts())),
                            "--out", str(out)]) == 0  # fmt: skip
    kept = out.read_text(encoding="utf-8").splitlines()
    assert kept == [rows.read_text(encoding="utf-8").splitlines()[0]]  # byte for byte, as written
    tallies, no_request = pass_rates.tally(_rollouts())
    sel = pass_rates.select([(i + 1, json.dumps(r), r) for i, r in enumerate(ROWS)], tallies)
    assert [(v, None if r is None else round(r, 3)) for _, v, r in sel.verdicts] == [
        ("kept", 0.333),
        ("never_solved", 0.0),
        ("always_solved", 1.0),
        ("not_measured", None),
        ("only_masked", None),
        ("never_solved", 0.0),
    ]
    assert no_request == 0 and sel.unmatched_rollouts == 0


def test_rollouts_are_matched_by_request_across_files_and_repeats_not_by_position(tmp_path):
    first, second = _rollouts()[:2], _rollouts()[2:]
    rows = _write(tmp_path / "rows.jsonl", list(reversed(ROWS)))  # positions differ from the collect run's
    out = tmp_path / "kept.jsonl"
    args = ["--rows", str(rows), "--out", str(out)]
    files = [str(_write(tmp_path / f"r{i}.jsonl", part)) for i, part in enumerate((first, second))]
    assert pass_rates.main(args + ["--rollouts", files[0], "--rollouts", files[1]]) == 0
    assert [json.loads(line)["family"] for line in out.read_text().splitlines()] == ["a"]


def test_the_range_is_exclusive_and_configurable(tmp_path):
    tallies, _ = pass_rates.tally(_rollouts())
    numbered = [(i + 1, json.dumps(r), r) for i, r in enumerate(ROWS)]
    assert pass_rates.select(numbered, tallies, above=0.4).counts["outside_range"] == 1  # the row at 1/3
    wide = pass_rates.select(numbered, tallies, above=0.0, below=1.0)
    assert wide.counts["kept"] == 1 and wide.counts["always_solved"] == 1


def test_unmatched_rollouts_and_lines_without_a_request_are_counted_not_guessed(tmp_path, capsys):
    stray = _rollout(_row("a question no row asks"), 1.0)
    dump_line = {"step": 1, "reward": 1.0, "prompt": "<|im_start|>user\nmixed"}  # a training dump's line
    rows = _write(tmp_path / "rows.jsonl", ROWS)
    roll = _write(tmp_path / "r.jsonl", _rollouts() + [stray, dump_line])
    assert pass_rates.main(["--rows", str(rows), "--rollouts", str(roll), "--out", str(tmp_path / "o.jsonl")]) == 0
    err = capsys.readouterr().err
    assert "of 11 rollouts, 1 asked for no row" in err and "1 carried no request" in err


def test_no_row_in_range_writes_nothing_and_exits_1(tmp_path, capsys):
    rows = _write(tmp_path / "rows.jsonl", ROWS[1:3])
    out = tmp_path / "kept.jsonl"
    code = pass_rates.main(["--rows", str(rows), "--rollouts", str(_write(tmp_path / "r.jsonl", _rollouts())),
                            "--out", str(out)])  # fmt: skip
    assert code == 1 and not out.exists()
    assert "never_solved 1, always_solved 1" in capsys.readouterr().out


def test_a_bad_row_line_is_named_by_file_and_line(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(ROWS[0]) + "\n\n{not json\n", encoding="utf-8")
    roll = _write(tmp_path / "r.jsonl", _rollouts())
    assert pass_rates.main(["--rows", str(rows), "--rollouts", str(roll), "--out", str(tmp_path / "o")]) == 2
    assert f"{rows}:3: invalid JSON" in capsys.readouterr().err


@pytest.mark.parametrize("bounds", [["--above", "0.5", "--below", "0.5"], ["--below", "1.5"]])
def test_an_empty_or_impossible_range_is_refused(tmp_path, bounds):
    with pytest.raises(SystemExit) as e:
        pass_rates.main(["--rows", "r", "--rollouts", "x", "--out", "o", *bounds])
    assert e.value.code == 2


def test_a_shaped_reward_row_always_solved_is_kept_by_reward_as_verls_filter_keeps_it(tmp_path, capsys):
    # the "always" row: rewards 1.0 and 0.5, both solved (> 0), yet its GRPO advantages are not zero
    rows = _write(tmp_path / "rows.jsonl", ROWS)
    roll = _write(tmp_path / "r.jsonl", _rollouts())
    out = tmp_path / "kept.jsonl"
    args = ["--rows", str(rows), "--rollouts", str(roll), "--out", str(out)]
    assert pass_rates.main(args) == 0
    assert [json.loads(line)["family"] for line in out.read_text().splitlines()] == ["a"]
    assert "1 rows never or always solved got different rewards" in capsys.readouterr().err
    assert pass_rates.main(args + ["--by", "reward"]) == 0
    assert [json.loads(line)["family"] for line in out.read_text().splitlines()] == ["a", "c"]
    assert "different rewards" not in capsys.readouterr().err


def test_the_success_threshold_is_the_recipes_rule(tmp_path):
    tallies, _ = pass_rates.tally(_rollouts(), threshold=0.75)  # the "always" row's 0.5 is now a failure
    numbered = [(i + 1, json.dumps(r), r) for i, r in enumerate(ROWS)]
    sel = pass_rates.select(numbered, tallies)
    assert [v for _, v, _ in sel.verdicts][:3] == ["kept", "never_solved", "kept"]
    assert not pass_rates.is_solved(0.5, 0.75) and pass_rates.is_solved(0.75, 0.75) and not pass_rates.is_solved(0.0)
