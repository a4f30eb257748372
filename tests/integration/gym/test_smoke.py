"""Smoke test: vLLM (tiny qwen25) + a real NeMo Gym (example_single_tool_call, simple_agent, training model config).

One POST per test to ``/run`` of the environment server that fronts the agent -- the URL Gym's own rollout
collector uses -- must return a reward and, on the last output item of every model call, ``prompt_token_ids``,
``generation_token_ids`` and ``generation_log_probs``.

``NGV_RECORD_GYM_FIXTURES=1`` also writes the results to ``tests/fixtures/gym_results/`` (the recorded fixtures
colleagues use in unit tests of trajectory post-processing).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.gym_fixtures import (
    MAX_STEPS,
    SINGLE_TOOL_CALL_AGENT,
    example_rows,
    forced_tool_call_row,
)

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "gym_results"
TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
# With greedy decoding and "tool call or this text" allowed, the tiny qwen25 model (builder version of 2026-11)
# calls the tool twice, then answers in text: found by comparing the model's next-token logits on the recorded
# prompts (a margin of ~1e-3). Another tiny model may take another path; the test only records that shape.
TEXT_ALTERNATIVE = " another"


def _post_run(url: str, row: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(row).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        assert r.status == 200
        return json.loads(r.read())


def _model_calls(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Output items that close a model call (they carry the token ids)."""
    return [item for item in result["response"]["output"] if "generation_token_ids" in item]


def _check_token_fields(item: dict[str, Any]) -> None:
    prompt, gen, logps = (item[f] for f in TOKEN_FIELDS)
    assert prompt and all(isinstance(t, int) for t in prompt)
    assert gen and all(isinstance(t, int) for t in gen)
    assert len(logps) == len(gen) and all(isinstance(x, float) and x <= 0.0 for x in logps)


def _record(name: str, result: dict[str, Any]) -> None:
    if os.environ.get("NGV_RECORD_GYM_FIXTURES") == "1":
        FIXTURES.mkdir(parents=True, exist_ok=True)
        (FIXTURES / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")


def test_gym_topology_and_run_url(gym_single_tool_call, vllm_server):
    gym = gym_single_tool_call
    print(f"vLLM start {vllm_server.start_seconds:.1f} s, Gym spin-up {gym.startup_seconds:.1f} s")
    instances = gym.server_instances()
    assert {i.server_type for i in instances.values()} == {
        "resources_servers",
        "responses_api_agents",
        "responses_api_models",
        "environment_servers",
    }
    # rows go to the environment server (legacy_agent relay) that fronts the agent, not to the agent itself
    env_server = gym.environment_servers_by_agent()[SINGLE_TOOL_CALL_AGENT]
    assert len(env_server) == 1 and instances[env_server[0]].name == "legacy_agent"
    assert gym.run_url(SINGLE_TOOL_CALL_AGENT) == f"{instances[env_server[0]].url}/run"
    cfg = gym.global_config()
    model_cfg = cfg["policy_model"]["responses_api_models"]["vllm_model"]
    assert model_cfg["return_token_id_information"] is True  # the training model config is in effect
    assert model_cfg["base_url"] == [vllm_server.base_url, vllm_server.base_url.replace("127.0.0.1", "localhost")]
    assert model_cfg["model"] == vllm_server.model_name


def test_single_turn_run_returns_reward_and_token_ids(gym_single_tool_call, vllm_server):
    row = example_rows()[0]
    row = {**row, "responses_create_params": {**row["responses_create_params"], "max_output_tokens": 24}}
    t0 = time.monotonic()
    result = _post_run(gym_single_tool_call.run_url(SINGLE_TOOL_CALL_AGENT), row)
    print(f"/run took {time.monotonic() - t0:.2f}s")
    assert {"reward", "response", "responses_create_params", "mask_sample", "failure_kind"} <= set(result)
    assert result["reward"] == 0.0  # the random model does not call get_weather unprompted
    calls = _model_calls(result)
    assert len(calls) == 1 and calls[0] is result["response"]["output"][-1]
    _check_token_fields(calls[0])
    assert len(calls[0]["generation_token_ids"]) <= 24
    assert result["response"]["model"] == vllm_server.model_name
    _record("single_turn_text", result)


def test_forced_tool_calls_make_a_multi_turn_trajectory(gym_single_tool_call):
    row = forced_tool_call_row(example_rows()[1], seed=0)
    result = _post_run(gym_single_tool_call.run_url(SINGLE_TOOL_CALL_AGENT), row)
    kinds = [item["type"] for item in result["response"]["output"]]
    assert kinds == ["function_call", "function_call_output"] * MAX_STEPS  # capped by simple_agent.max_steps
    assert result["reward"] == 1.0  # example_single_tool_call rewards calling get_weather
    calls = _model_calls(result)
    assert len(calls) == MAX_STEPS and all(c["type"] == "function_call" for c in calls)
    for call in calls:
        _check_token_fields(call)
    # tool outputs carry no token ids
    assert all("generation_token_ids" not in i for i in result["response"]["output"] if i["type"] != "function_call")
    # each turn's prompt extends the previous one (history re-rendered by the chat template)
    first, second = calls[0]["prompt_token_ids"], calls[1]["prompt_token_ids"]
    assert len(second) > len(first) + 1 and second[: len(first)] == first
    _record("multi_turn_tool_calls", result)


def test_tool_calls_then_text_answer(gym_single_tool_call):
    row = forced_tool_call_row(example_rows()[0], alternative_text=TEXT_ALTERNATIVE, temperature=0.0)
    result = _post_run(gym_single_tool_call.run_url(SINGLE_TOOL_CALL_AGENT), row)
    output = result["response"]["output"]
    kinds = [item["type"] for item in output]
    calls = _model_calls(result)
    for call in calls:
        _check_token_fields(call)
    # every model call ends in exactly one item: a tool call (followed by its output) or the final text
    assert len(calls) == sum(k in ("function_call", "message") for k in kinds) <= MAX_STEPS
    assert result["reward"] == float("function_call" in kinds)
    assert kinds[-1] == "message" or len(calls) == MAX_STEPS
    if kinds[-1] == "message" and "function_call" in kinds:
        assert output[-1]["content"][0]["text"].strip() == TEXT_ALTERNATIVE.strip()
        _record("multi_turn_tool_then_text", result)
