"""Unit tests of the Gym payload models (parse once at the boundary)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from nemo_gym_adapter.errors import GymServerError
from nemo_gym_adapter.wire.payloads import (
    RESPONSES_CREATE_PARAMS_FIELDS,
    AgentRef,
    parse_dataset_row,
    parse_run_result,
    reward_components,
)


def _result(output, **extra):
    return {"reward": 1.0, "response": {"output": output, "incomplete_details": None, "id": "r"}, **extra}


IDS = {"prompt_token_ids": [1, 2], "generation_token_ids": [3], "generation_log_probs": [-0.5]}


def test_result_keeps_unknown_fields_and_exposes_attributes():
    payload = _result(
        [{"type": "message", "role": "assistant", "content": [], **IDS}], judge_evaluations=[1], mask_sample=False
    )
    r = parse_run_result(json.dumps(payload))
    assert r.reward == 1.0 and r.mask_sample is False and r.failure_kind is None
    assert r.model_extra["judge_evaluations"] == [1] and r.response.model_extra["id"] == "r"
    assert [(i, item.generation_token_ids) for i, item in r.model_calls()] == [(0, [3])]
    assert r.model_dump()["judge_evaluations"] == [1]


def test_models_are_frozen():
    r = parse_run_result(_result([]))
    with pytest.raises(ValidationError):
        r.reward = 2.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"type": "message", "prompt_token_ids": [1]}, "must come together"),
        ({**IDS, "prompt_token_ids": ["1"]}, "response.output[0].prompt_token_ids[0]"),
        ({**IDS, "prompt_token_ids": [1.5]}, "valid integer"),
        # The fast path (one pass over the element types) must reject what StrictInt rejects, at the same path.
        (
            {**IDS, "prompt_token_ids": [5, 1.0]},
            "response.output[0].prompt_token_ids[1]: Input should be a valid integer",
        ),
        (
            {**IDS, "generation_token_ids": [True]},
            "response.output[0].generation_token_ids[0]: Input should be a valid",
        ),
        ({**IDS, "generation_token_ids": [None]}, "response.output[0].generation_token_ids[0]"),
        ({**IDS, "prompt_token_ids": {"0": 1}}, "response.output[0].prompt_token_ids: Input should be a valid list"),
        ({**IDS, "generation_log_probs": ["x"]}, "response.output[0].generation_log_probs[0]: Input should be a valid"),
    ],
)
def test_token_fields_are_validated_with_json_path(item, message):
    with pytest.raises(GymServerError) as info:
        parse_run_result(_result([item]), where="row 4: /run result")
    assert str(info.value).startswith("row 4: /run result: ") and message in str(info.value)


@pytest.mark.parametrize("reward", [float("nan"), float("inf"), None, "high"])
def test_reward_must_be_a_finite_number(reward):
    with pytest.raises(GymServerError, match="reward"):
        parse_run_result(_result([]) | {"reward": reward})


def test_missing_response_is_reported():
    with pytest.raises(GymServerError, match="response: Field required"):
        parse_run_result({"reward": 0.0})


def test_model_output_classification():
    r = parse_run_result(
        _result(
            [
                {"type": "reasoning", "summary": []},
                {"type": "message", "role": "assistant", "content": []},
                {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"},
                {"type": "function_call_output", "call_id": "c", "output": "x"},
                {"type": "message", "role": "user", "content": "next"},
            ]
        )
    )
    assert [i.is_model_output for i in r.response.output] == [True, True, True, False, False]


def test_dataset_row_forms():
    base = {"responses_create_params": {"input": "hi", "temperature": 0.3}, "expected_answer": "4"}
    assert parse_dataset_row(base).model_extra == {"expected_answer": "4"}
    assert parse_dataset_row(base | {"agent_ref": "a"}).agent_ref == "a"
    assert parse_dataset_row(base | {"agent_ref": {"name": "a", "type": "t"}}).agent_ref == AgentRef(name="a", type="t")
    assert parse_dataset_row(base).responses_create_params.model_extra == {"temperature": 0.3}
    with pytest.raises(ValidationError):
        parse_dataset_row({"responses_create_params": {"tools": []}})


def test_params_field_list_is_gyms():
    # Spot checks against Gym 0.7.0's NeMoGymResponseCreateParamsNonStreaming.
    assert {
        "input",
        "tools",
        "max_output_tokens",
        "temperature",
        "tool_choice",
        "metadata",
    } <= RESPONSES_CREATE_PARAMS_FIELDS
    assert "tool" not in RESPONSES_CREATE_PARAMS_FIELDS and "max_tokens" not in RESPONSES_CREATE_PARAMS_FIELDS


@pytest.mark.parametrize("as_json", [False, True])
def test_token_fields_fast_and_slow_paths_give_the_same_values(as_json):
    """Clean lists pass as they are; anything pydantic converts (ints or numeric strings as logprobs) it still does."""
    clean = _result([dict(IDS)])
    mixed = _result([{**IDS, "generation_token_ids": [3, 4], "generation_log_probs": [-1, "-0.5"]}])
    for payload in (clean, mixed):
        r = parse_run_result(json.dumps(payload) if as_json else payload)
        (_, call), *_ = r.model_calls()
        item = payload["response"]["output"][0]
        assert (
            call.prompt_token_ids == item["prompt_token_ids"]
            and call.generation_token_ids == item["generation_token_ids"]
        )
        assert call.generation_log_probs == [float(x) for x in item["generation_log_probs"]]
        assert all(type(x) is float for x in call.generation_log_probs)
        assert all(type(x) is int for x in call.prompt_token_ids + call.generation_token_ids)


@pytest.mark.parametrize("log_probs", [None, [], [-0.5, -0.5]])
def test_ids_without_one_log_prob_each_parse_and_are_listed(log_probs):
    """Issue 19: a model call with ids but without (one per token) log-probs is a trainable turn missing them, for
    the trajectory to mask ``missing_log_probs``, not an unparseable result."""
    item = {"type": "message", "prompt_token_ids": [1, 2], "generation_token_ids": [3]}
    if log_probs is not None:
        item["generation_log_probs"] = log_probs
    r = parse_run_result(_result([item, {"type": "message", **IDS}]))
    assert r.calls_without_log_probs() == [0]
    assert [i for i, _ in r.model_calls()] == [0, 1]


def test_numeric_fields_are_every_number_of_the_result_with_the_reward_components():
    """Gym 0.7's multi-reward result (stock example_tool_call_multireward's shape): components are kept as
    ``reward_components/<name>``, top-level numbers (bools as 0/1) as themselves; reward, mask_sample, Gym's ``_ng``
    ids, strings, lists and non-finite numbers are left out."""
    result = parse_run_result(
        {
            "reward": 2.0,
            "response": {"output": []},
            "mask_sample": False,
            "reward_components": {"correctness": 1.0, "schema_valid": 1, "format": 0.0, "note": "x"},
            "correctness": 1.0,
            "format": 0,
            "ok": True,
            "nan": float("nan"),
            "huge": 10**400,
            "predicted_calls": [{"name": "get_weather"}],
            "expected": "A",
            "_ng_task_index": 3,
        }
    )
    assert result.numeric_fields() == {
        "reward_components/correctness": 1.0,
        "reward_components/schema_valid": 1.0,
        "reward_components/format": 0.0,
        "correctness": 1.0,
        "format": 0.0,
        "ok": 1.0,
    }
    assert reward_components(result.numeric_fields()) == {"correctness": 1.0, "schema_valid": 1.0, "format": 0.0}
