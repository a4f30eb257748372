"""The math-with-tools rows are exactly what ``scripts/make_math_rows.py`` generates (never hand-edited), in Gym's
``math_with_code`` row format, with validation held out by numbers and by family, and answers the environment's own
verifier accepts."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.data.rows import validate_row
from tests.support.row_scripts import assert_regenerated, load_script


def test_the_committed_rows_are_the_generators_output(tmp_path):
    script = load_script("make_math_rows")
    assert script.main(["--out", str(tmp_path)]) == 0
    assert_regenerated(script, tmp_path, (script.TRAIN_FILE, script.VAL_FILE))


def test_validation_is_held_out_by_numbers_and_by_family():
    script = load_script("make_math_rows")
    train, val = script.make(240, 48, 2025)
    assert len(train) == 240 and len(val) == 48
    question = lambda r: r["responses_create_params"]["input"][1]["content"]  # noqa: E731
    assert not {question(r) for r in train} & {question(r) for r in val}
    train_families = {r["family"] for r in train}
    assert train_families == set(script.TRAIN_FAMILIES)
    held = [r for r in val if r["family"] not in train_families]
    assert {r["family"] for r in held} == set(script.HELD_OUT_FAMILIES) and len(held) == 12
    assert script.make(24, 48, 2025)[1] == val  # the validation split does not move with the training size


def test_rows_are_gyms_format_with_answers_its_verifier_reads():
    script = load_script("make_math_rows")
    train, val = script.make(240, 48, 2025)
    for i, r in enumerate(train + val):
        assert validate_row(r, f"row {i}") == "math_with_code_simple_agent"
        system, user = r["responses_create_params"]["input"]
        assert system == {"role": "system", "content": script.SYSTEM} and user["role"] == "user"
        assert r["responses_create_params"]["tools"] == [script.TOOL]
        answer = r["expected_result"]
        # what the verifier compares after stripping: a number, digits in a base < 10 or a weekday's name
        assert answer == answer.strip() and answer
        assert answer in script.WEEKDAYS or float(answer) == float(answer)


@pytest.mark.parametrize("family", ["product", "modular_power", "days_between", "compound_interest", "base_conversion"])
def test_each_answer_is_what_the_question_asks(family):
    import random

    script = load_script("make_math_rows")
    question, answer = script.TRAIN_FAMILIES[family](random.Random(7), 0)
    if family == "product":
        a, b = [int(w) for w in question.rstrip("?").split() if w.isdigit()]
        assert answer == str(a * b)
    elif family == "modular_power":
        a, e, m = [int(w.rstrip("?")) for w in question.split() if w.rstrip("?").isdigit()]
        assert answer == str(pow(a, e, m))
    elif family == "base_conversion":
        n, base = [int(w.rstrip(".")) for w in question.split() if w.rstrip(".").isdigit()][:2]
        assert int(answer, base) == n
    else:
        assert answer  # computed by the standard library in the generator; shape checked above


def test_sizes_that_cannot_be_split_evenly_are_an_error():
    script = load_script("make_math_rows")
    with pytest.raises(ValueError, match="--val 50"):
        script.make(240, 50, 2025)
    with pytest.raises(ValueError, match="--train 250"):
        script.make(250, 48, 2025)
