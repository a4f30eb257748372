"""The tool model's weather rows are exactly what ``scripts/make_weather_rows.py`` generates (never hand-edited), in
Gym's ``example_single_tool_call`` row format, with validation cities the training never names."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.data.rows import validate_row
from tests.support.row_scripts import assert_regenerated, load_script


def _city(script, r: dict) -> str:
    text = r["responses_create_params"]["input"][1]["content"]
    (city,) = [c for c in script.CITIES if f" {c}" in text]
    return city


def test_the_committed_rows_are_the_generators_output(tmp_path):
    script = load_script("make_weather_rows")
    assert script.main(["--out", str(tmp_path)]) == 0
    assert_regenerated(script, tmp_path, (script.TRAIN_FILE, script.VAL_FILE))


def test_validation_cities_are_never_in_training_and_rows_are_gyms_format():
    script = load_script("make_weather_rows")
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
    script = load_script("make_weather_rows")
    with pytest.raises(ValueError, match="distinct val rows"):
        script.make(16, 10_000, 2025)
