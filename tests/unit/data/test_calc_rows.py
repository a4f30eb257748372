"""The calculator rows are exactly what ``scripts/make_calc_rows.py`` generates (never hand-edited), in Gym's
``math_advanced_calculations`` row format, with validation held out by operands and by family, ground truths that are
the environment's own arithmetic, and no nested row solvable without using what an inner call returned."""

from __future__ import annotations

import json
import math
import re

import pytest

from nemo_gym_adapter.data.rows import validate_row
from nemo_gym_adapter.runtime import paths
from tests.support.row_scripts import assert_regenerated, load_script


def _request(r: dict) -> str:
    return r["responses_create_params"]["input"][0]["content"]


def test_the_committed_rows_are_the_generators_output(tmp_path):
    script = load_script("make_calc_rows")
    assert script.main(["--out", str(tmp_path)]) == 0
    assert_regenerated(script, tmp_path, (script.TRAIN_FILE, script.VAL_FILE, script.GUIDED_FILE))


def test_validation_is_held_out_by_operands_and_by_family():
    script = load_script("make_calc_rows")
    train, val = script.make(240, 50, 2025)
    assert len(train) == 240 and len(val) == 50
    assert not {_request(r) for r in train} & {_request(r) for r in val}
    literals = lambda rows: {float(x) for r in rows for x in script._LITERAL.findall(_request(r))}  # noqa: E731
    assert max(literals(train)) < 10 <= min(literals(val) - {0.0, 1.0, 2.0, 3.0, 4.0})  # powers keep small operands
    assert {r["family"] for r in train} == set(script.TRAIN_FAMILIES)
    held = [r for r in val if r["family"] in script.HELD_OUT_FAMILIES]
    assert len(held) == 20 and {r["family"] for r in held} == set(script.HELD_OUT_FAMILIES)
    assert script.make(24, 50, 2025)[1] == val  # the validation split does not move with the training size


def test_rows_are_the_environments_format():
    script = load_script("make_calc_rows")
    train, val = script.make(240, 50, 2025)
    for i, r in enumerate(train + val):
        assert validate_row(r, f"row {i}") == "math_advanced_calculations_simple_agent"
        tools = r["responses_create_params"]["tools"]
        names = [t["name"] for t in tools]
        assert all(t in script.TOOLS for t in tools) and names == sorted(
            names, key=[t["name"] for t in script.TOOLS].index
        )
        assert len(tools) == script.TOOLS_PER_ROW and script._needed(_request(r)) <= set(names), (_request(r), names)
        values = json.loads(r["ground_truth"])  # the environment json.loads it (a list would crash its verify)
        assert len(values) == r["breadth"] and all(math.isfinite(v) for v in values)
        assert {"id", "depth", "breadth"} <= set(r)


def test_the_tools_a_row_needs_are_read_from_its_text():
    script = load_script("make_calc_rows")
    assert script._needed("((2.0 * cos(3.0)) - 1.0)") == {"multiply", "cos", "subtract"}
    assert script._needed("-((5.0 + 4.0))") == {"negate", "add"} and script._needed("(4.0 - -(8.0))") == {
        "subtract",
        "negate",
    }
    assert script._needed("2.0 ** 1.0") == {"power"} and script._needed("log(12.0, 3.0)") == {"log"}
    assert script._needed("pi") == {"pi"} and script._needed("(9.0 / 2.0)") == {"divide"}


def test_ground_truth_is_the_environments_arithmetic():
    script = load_script("make_calc_rows")
    assert script.BINARY["+"][1](2.0, 3.0) == 6.2 and script.BINARY["*"][1](2.0, 3.0) == 1.1 * 2.0 * 3.0
    assert script.UNARY["sin"][1](1.0) == math.cos(1.0) and script.UNARY["neg"][1](5.0) == 5.0
    assert script.BINARY["**"][1](2.0, 1.0) == 8.0 and script.BINARY["-"][1](5.0, 1.0) == 1.0


def test_no_nested_row_has_a_one_call_shortcut():
    script = load_script("make_calc_rows")
    train, val = script.make(240, 50, 2025)
    nested = [r for r in train + val if r["depth"] >= 2]
    assert len(nested) >= 90
    for r in nested:
        (value,) = json.loads(r["ground_truth"])
        assert value not in script.shortcuts(_request(r)), _request(r)
    # the filter's control: a coincidence it must catch (1.1 * (6 / 2 * 0.5 ...) -- multiply(6.0, 2.0) == 13.2)
    assert script.BINARY["*"][1](script.BINARY["/"][1](6.0, 2.0), 8.0) in script.shortcuts("((6.0 / 2.0) * 8.0)")


def _run_hint(script, hint: str) -> float:
    """Do what a guided row's request says, with the environment's arithmetic: the first call, then the second with
    the first's returned value where the request names it."""
    fn = {script.TOOL_OF[op]: f for op, (_, f) in {**script.BINARY, **script.UNARY}.items()}
    first, second = re.fullmatch(r" First call (.+); then call (.+)\.", hint).groups()
    returned = None
    for call in (first, second):
        name, args = call.split(" with ", 1)
        values = [
            returned if v.startswith("the number ") else float(v) for _, v in (a.split("=") for a in args.split(", "))
        ]
        returned = fn[name](*values)
    return returned


def test_guided_rows_spell_out_the_chain_their_ground_truth_needs():
    script = load_script("make_calc_rows")
    train, val = script.make(240, 50, 2025)
    guided = script.make_guided(60, 2025, train + val)
    assert len(guided) == 60 and {r["family"] for r in guided} == {"guided_chain"}
    assert script.make(240, 50, 2025) == (train, val)  # the guided stream moves neither file
    taken = {_request(r) for r in train + val}
    for i, r in enumerate(guided):
        assert validate_row(r, f"guided row {i}") == "math_advanced_calculations_simple_agent"
        text, hint = _request(r).split(" using only the given tools.")
        expression = text.removeprefix("Get me the value for ")
        assert f"{text} using only the given tools." not in taken  # never a plain training or validation request
        (value,) = json.loads(r["ground_truth"])
        assert _run_hint(script, hint) == value, _request(r)  # the spelled-out calls give the verifier's value
        assert value not in script.shortcuts(expression)  # the second call needs what the first returned
        names = {t["name"] for t in r["responses_create_params"]["tools"]}
        assert script._needed(expression) <= names and r["depth"] == 2 and r["breadth"] == 1
        assert max(float(x) for x in script._LITERAL.findall(expression)) < 10  # training operands


def test_sizes_that_cannot_be_split_evenly_are_an_error():
    script = load_script("make_calc_rows")
    with pytest.raises(ValueError, match="--val 48"):
        script.make(240, 48, 2025)
    with pytest.raises(ValueError, match="--train 250"):
        script.make(250, 50, 2025)


@pytest.mark.parametrize(
    ("rows", "mixed"),
    [("calc_train.jsonl", "calc_train_mixed.jsonl"), ("calc_train_guided.jsonl", "calc_train_guided_mixed.jsonl")],
)
def test_the_mixed_rows_are_training_rows_as_written_in_their_order(rows, mixed):
    """``calc_train_mixed.jsonl`` and ``calc_train_guided_mixed.jsonl`` (the rows the untrained model sometimes
    solves: ``nemo_gym_adapter.data.pass_rates`` over a sampled ``collect``, docs/BENCHMARKS.md) can only be measured,
    not regenerated: each must be a selection of the generator's rows, byte for byte and in their order, never a
    validation row."""
    data = paths.REPO_ROOT / "configs" / "data"
    train = (data / rows).read_text(encoding="utf-8").splitlines()
    kept = (data / mixed).read_text(encoding="utf-8").splitlines()
    position = {line: i for i, line in enumerate(train)}
    assert kept and all(line in position for line in kept)
    assert [position[line] for line in kept] == sorted(position[line] for line in kept)
    assert len(set(kept)) == len(kept)
    assert not set(kept) & set((data / "calc_val.jsonl").read_text(encoding="utf-8").splitlines())
