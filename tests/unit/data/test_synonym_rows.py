"""The tool model's committed rows are exactly what ``scripts/make_synonym_rows.py`` generates (never hand-edited), in
Gym's ``example_multi_step`` row format, with a validation split the training never sees and answers the
environment's own tool would give."""

from __future__ import annotations

import json
import re

import pytest

from nemo_gym_adapter.data.rows import validate_row
from tests.support.row_scripts import assert_regenerated, load_script


def test_the_committed_rows_are_the_generators_output(tmp_path):
    script = load_script("make_synonym_rows")
    assert script.main(["--out", str(tmp_path)]) == 0
    assert_regenerated(script, tmp_path, (script.TRAIN_FILE, script.VAL_FILE))


def test_validation_is_disjoint_and_every_row_is_solvable_by_the_tools():
    script = load_script("make_synonym_rows")
    train, val = script.make(256, 32, 2025, 3)
    assert len(train) == 256 and len(val) == 32
    key = lambda r: json.dumps(r["responses_create_params"]["input"], sort_keys=True)  # noqa: E731
    assert not {key(r) for r in train} & {key(r) for r in val}
    assert script.make(64, 32, 2025, 3)[1] == val  # the validation split does not move with the training size
    synonyms = [s for term in script.TERMS.values() for s in term[0]]
    assert len(synonyms) == len(set(synonyms))  # a synonym names one term: the expected list is unambiguous
    for i, r in enumerate(train + val):
        assert validate_row(r, f"row {i}") == "example_multi_step_simple_agent"
        system, user = r["responses_create_params"]["input"]
        listed = [line.split("'")[3] for line in system["content"].splitlines() if line.startswith("The term")]
        target = r["minefield_label"]
        assert r["expected_synonyms"] == [s for s in listed if s in script.TERMS[target][0]]
        assert r["expected_synonym_values"] == [sum(map(ord, s)) for s in r["expected_synonyms"]]
        assert user["content"] in {script.ASK.format(q) for q in script.TERMS[target][1]}
        assert r["agent_ref"]["name"] == "example_multi_step_simple_agent"
        assert {t["name"] for t in r["responses_create_params"]["tools"]} == {
            "get_synonym_value",
            "extract_synonym_values",
        }


def test_settings_with_too_few_distinct_rows_are_an_error_not_a_hang():
    script = load_script("make_synonym_rows")
    # one term with one synonym: 20 terms x 2 questions x 3 synonyms = 120 distinct rows at most
    with pytest.raises(ValueError, match="only 120 distinct rows"):
        script.make(256, 32, 2025, 1, (1,))
    train, val = script.make(64, 32, 2025, 1, (1,))
    assert len(train) == 64 and len(val) == 32


@pytest.mark.parametrize("count", [1, 2, 3])
def test_rows_that_name_the_synonyms_name_exactly_the_expected_ones_in_order(count):
    script = load_script("make_synonym_rows")
    train, val = script.make(32, 8, 7, 2, (count,), ask="synonyms")
    for r in train + val:
        user = r["responses_create_params"]["input"][1]["content"]
        named = re.findall(r"'([^']+)'", user)  # the questions hold no quote of their own
        assert named == r["expected_synonyms"] and len(named) == count, user
        assert user.endswith("with extract_synonym_values.")
        assert ("in that order" in user) == (count > 1)
    # the term-only rows of the same seed ask the same questions about the same terms: only the user turn differs
    plain_train, _ = script.make(32, 8, 7, 2, (count,))
    assert [r["minefield_label"] for r in plain_train] == [r["minefield_label"] for r in train]
    assert [r["responses_create_params"]["input"][0] for r in plain_train] == [
        r["responses_create_params"]["input"][0] for r in train
    ]


def test_the_prefix_names_the_output_files(tmp_path):
    script = load_script("make_synonym_rows")
    assert (
        script.main(["--out", str(tmp_path), "--ask", "synonyms", "--prefix", "named", "--train", "4", "--val", "2"])
        == 0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["named_train.jsonl", "named_val.jsonl"]
    first = json.loads((tmp_path / "named_val.jsonl").read_text().splitlines()[0])
    assert "Use the tools: look up the value" in first["responses_create_params"]["input"][1]["content"]
