"""The tool model's weather rows are exactly what ``scripts/make_weather_rows.py`` generates (never hand-edited), in
Gym's ``example_single_tool_call`` row format, with validation cities the training never names."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nemo_gym_adapter.data.rows import validate_row

REPO = Path(__file__).resolve().parents[3]


def _script():
    spec = importlib.util.spec_from_file_location("make_weather_rows", REPO / "scripts" / "make_weather_rows.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _city(script, r: dict) -> str:
    text = r["responses_create_params"]["input"][1]["content"]
    (city,) = [c for c in script.CITIES if f" {c}" in text]
    return city


def test_the_committed_rows_are_the_generators_output(tmp_path):
    script = _script()
    assert script.main(["--out", str(tmp_path)]) == 0
    for name in (script.TRAIN_FILE, script.VAL_FILE):
        assert (tmp_path / name).read_bytes() == (REPO / "configs" / "data" / name).read_bytes(), name


def test_validation_cities_are_never_in_training_and_rows_are_gyms_format():
    script = _script()
    train, val = script.make(256, 32, 2025)
    assert len(train) == 256 and len(val) == 32
    assert not {_city(script, r) for r in train} & {_city(script, r) for r in val}
    assert len({r["responses_create_params"]["input"][1]["content"] for r in train + val}) == 288  # all distinct
    assert script.make(64, 32, 2025)[1] == val  # the validation split does not move with the training size
    for i, r in enumerate(train + val):
        assert validate_row(r, f"row {i}") == "example_single_tool_call_simple_agent"
        developer, user = r["responses_create_params"]["input"]
        assert developer == {"content": script.DEVELOPER, "role": "developer"} and user["role"] == "user"
        assert r["responses_create_params"]["tools"] == [script.TOOL]


def test_more_rows_than_the_phrasings_allow_is_an_error():
    script = _script()
    with pytest.raises(ValueError, match="distinct val rows"):
        script.make(16, 10_000, 2025)
