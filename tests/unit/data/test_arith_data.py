"""The SmolLM2 learning run's committed rows are exactly what ``scripts/make_arith_data.py`` generates (never
hand-edited), in math_with_judge's row format, with a validation split the training never sees."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _script():
    spec = importlib.util.spec_from_file_location("make_arith_data", REPO / "scripts" / "make_arith_data.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_rows_are_the_generators_output(tmp_path):
    script = _script()
    assert script.main(["--out", str(tmp_path)]) == 0
    for name in (script.TRAIN_FILE, script.VAL_FILE):
        assert (tmp_path / name).read_bytes() == (REPO / "configs" / "data" / name).read_bytes(), name


def test_validation_is_disjoint_from_training_and_rows_are_gym_rows():
    script = _script()
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
