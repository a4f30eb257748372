"""The SmolLM2 learning run's committed rows are exactly what ``scripts/make_arith_data.py`` generates (never
hand-edited), in math_with_judge's row format, with a validation split the training never sees."""

from __future__ import annotations

import json

from tests.support.row_scripts import assert_regenerated, load_script


def test_the_committed_rows_are_the_generators_output(tmp_path):
    script = load_script("make_arith_data")
    assert script.main(["--out", str(tmp_path)]) == 0
    assert_regenerated(script, tmp_path, (script.TRAIN_FILE, script.VAL_FILE))


def test_validation_is_disjoint_from_training_and_rows_are_gym_rows():
    script = load_script("make_arith_data")
    train, val = script.make(512, 96, 2025)
    assert len(train) == 512 and len(val) == 96
    assert not {r["question"] for r in train} & {r["question"] for r in val}
    assert script.make(64, 96, 2025)[1] == val  # the validation split does not move with the training size
    for r in train + val:
        messages = r["responses_create_params"]["input"]
        assert messages[-1] == {"role": "user", "content": r["question"]}
        assert r["agent_ref"]["name"] == "math_with_judge_simple_agent"
        assert r["expected_answer"].isdigit() and "\\boxed" in messages[2]["content"]
    assert json.loads(json.dumps(train[0])) == train[0]
