"""What the trainer's sampling settings become in a row's ``responses_create_params``
(``nemo_gym_adapter.rollouts.sampling``): first-class fields replaced, ``max_output_tokens`` a cap, engine fields
merged into ``metadata.extra_body``."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemo_gym_adapter.rollouts.sampling import ENGINE_FIELDS, Sampling, request_params

TRAIN = Sampling(temperature=1.0, top_p=0.9, max_output_tokens=64, top_k=20, repetition_penalty=1.0, ignore_eos=False)


def test_overrides_name_every_setting_and_leave_out_what_is_not_set():
    assert TRAIN.overrides() == {
        "temperature": 1.0,
        "top_p": 0.9,
        "max_output_tokens": 64,
        ENGINE_FIELDS: {"top_k": 20, "repetition_penalty": 1.0, "ignore_eos": False},
    }
    assert Sampling(temperature=0.0, top_p=None, max_output_tokens=8).overrides() == {
        "temperature": 0.0,
        "max_output_tokens": 8,
    }


def test_greedy_keeps_the_budget_and_engine_fields_and_turns_sampling_off():
    greedy = TRAIN.greedy()
    assert (greedy.temperature, greedy.top_p, greedy.top_k) == (0.0, 1.0, -1)
    assert greedy.max_output_tokens == 64 and greedy.repetition_penalty == 1.0


@pytest.mark.parametrize(("own", "sent"), [(None, 64), (16, 16), (64, 64), (500, 64), (0, 64), (True, 64), ("8", 64)])
def test_max_output_tokens_is_the_smaller_of_the_rows_and_the_trainers(own, sent):
    params = {"input": "q"} if own is None else {"input": "q", "max_output_tokens": own}
    assert request_params(params, TRAIN.overrides())["max_output_tokens"] == sent


def test_engine_fields_join_the_rows_own_extra_body_and_win_on_a_clash():
    grammar = {"structured_outputs": {"regex": "A|B"}, "top_k": 3, "seed": 7}
    params = {"input": "q", "metadata": {"extra_body": json.dumps(grammar), "other": "kept"}, "temperature": 0.2}
    before = copy.deepcopy(params)
    out = request_params(params, TRAIN.overrides())
    assert params == before  # never modified
    assert out["temperature"] == 1.0 and out["top_p"] == 0.9  # the trainer's sampling, not the row's
    assert out["metadata"]["other"] == "kept"
    assert json.loads(out["metadata"]["extra_body"]) == {
        "structured_outputs": {"regex": "A|B"},
        "seed": 7,
        "top_k": 20,
        "repetition_penalty": 1.0,
        "ignore_eos": False,
    }


def test_a_row_without_metadata_gets_one():
    out = request_params({"input": "q"}, {ENGINE_FIELDS: {"top_k": 1}})
    assert out == {"input": "q", "metadata": {"extra_body": '{"top_k": 1}'}}


@pytest.mark.parametrize("raw", ["{not json", "[1, 2]", '"text"'])
def test_an_extra_body_that_is_not_a_json_object_is_an_error_naming_the_field(raw):
    with pytest.raises(ValueError, match=r"metadata\.extra_body"):
        request_params({"input": "q", "metadata": {"extra_body": raw}}, TRAIN.overrides())


@given(
    temperature=st.none() | st.floats(0, 2),
    top_k=st.none() | st.integers(-1, 50),
    own=st.none() | st.integers(1, 200),
    budget=st.none() | st.integers(1, 200),
)
def test_every_set_value_reaches_the_request(temperature, top_k, own, budget):
    sampling = Sampling(temperature=temperature, top_p=None, max_output_tokens=budget, top_k=top_k)
    params = {"input": "q"} if own is None else {"input": "q", "max_output_tokens": own}
    out = request_params(params, sampling.overrides())
    assert out.get("temperature") == temperature
    expected = own if budget is None else (budget if own is None else min(own, budget))
    assert out.get("max_output_tokens") == expected
    extra = json.loads(out.get("metadata", {}).get("extra_body", "{}"))
    assert extra.get("top_k") == top_k
