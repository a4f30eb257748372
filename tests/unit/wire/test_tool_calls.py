"""Tool-call fields of a Gym result, whatever the verifier checks: the count, the schema-valid and unknown-tool
shares (Responses-API and chat-style tool lists), and each way arguments can fail their schema."""

from __future__ import annotations

import json

import pytest

from nemo_gym_adapter.wire.payloads import parse_run_result
from nemo_gym_adapter.wire.tool_calls import call_fields, schema_problem

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "unit": {"type": "string", "enum": ["C", "F"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}
PARAMS = {"tools": [{"type": "function", "name": "get_weather", "parameters": SCHEMA}]}


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ('{"city": "Paris"}', None),
        ({"city": "Paris", "days": 3, "unit": "F"}, None),
        ('{"city": "Paris"', "arguments are not JSON"),
        ('["Paris"]', "arguments are not a JSON object"),
        ("{}", "required key 'city' missing"),
        ('{"city": "Paris", "country": "FR"}', "key 'country' not in the schema"),
        ('{"city": 7}', "'city' is not of type string"),
        ('{"city": "Paris", "days": true}', "'days' is not of type integer"),
        ('{"city": "Paris", "days": 2.5}', "'days' is not of type integer"),
        ('{"city": "Paris", "unit": "K"}', "'unit' is not one of ['C', 'F']"),
    ],
)
def test_each_way_arguments_fail_their_schema_is_named(arguments, problem):
    assert schema_problem(arguments, SCHEMA) == problem


def test_extra_keys_are_fine_unless_the_schema_forbids_them_and_no_schema_checks_only_the_object():
    assert schema_problem('{"city": "Paris", "x": 1}', {**SCHEMA, "additionalProperties": True}) is None
    assert schema_problem('{"anything": 1}', None) is None
    assert schema_problem('"text"', None) == "arguments are not a JSON object"


def test_the_shares_are_over_the_rollouts_calls():
    calls = [
        {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"name": "get_weather", "arguments": "{}"},
        {"name": "get_time", "arguments": "{}"},
        {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    ]
    assert call_fields(PARAMS, calls) == {
        "tool_calls/count": 4.0,
        "tool_calls/schema_valid": 0.5,
        "tool_calls/unknown_tool": 0.25,
    }
    chat_style = {"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]}
    assert call_fields(chat_style, calls[:1])["tool_calls/schema_valid"] == 1.0


def test_no_tools_and_no_calls_adds_nothing_and_tools_without_calls_count_zero():
    assert call_fields({"input": "hi"}, []) == {}
    assert call_fields(PARAMS, []) == {"tool_calls/count": 0.0}
    assert call_fields(None, [{"name": "f", "arguments": "{}"}]) == {
        "tool_calls/count": 1.0,
        "tool_calls/schema_valid": 1.0,
        "tool_calls/unknown_tool": 0.0,
    }


def test_a_results_numeric_fields_carry_them():
    result = {
        "reward": 1.0,
        "responses_create_params": {"input": "Weather?", **PARAMS},
        "response": {
            "output": [
                {"type": "function_call", "name": "get_weather", "arguments": json.dumps({"city": 3}), "call_id": "1"},
                {"type": "function_call_output", "call_id": "1", "output": "cold"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Cold."}]},
            ]
        },
    }
    numeric = parse_run_result(result).numeric_fields()
    assert numeric["tool_calls/count"] == 1.0 and numeric["tool_calls/schema_valid"] == 0.0
