"""NeMo Gym fixtures for integration tests (pytest plugin loaded by tests/conftest.py).

``gym_single_tool_call`` (module scope) is a real Gym -- ``example_single_tool_call`` + ``simple_agent`` +
``vllm_model_for_training.yaml`` -- in front of the ``vllm_server`` fixture (tiny qwen25), with prebuilt venvs
(``scripts/prepare_gym_venvs.py``). It yields a :class:`~nemo_gym_adapter.gym.servers.GymServers`; rows go to
``gym.run_url(SINGLE_TOOL_CALL_AGENT)``. ``simple_agent.max_steps`` is capped at :data:`MAX_STEPS` because a random
model forced to call tools (``structured_outputs``) would otherwise call them forever.

Helpers for tests that need their own Gym: :func:`single_tool_call_spec`, :func:`example_rows`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from nemo_gym_adapter.gym.launch import TRAINING_MODEL_CONFIG, GymLaunchSpec, gym_package_root
from nemo_gym_adapter.gym.servers import GymServers
from nemo_gym_adapter.runtime import paths

SINGLE_TOOL_CALL_CONFIG = "resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml"
SINGLE_TOOL_CALL_AGENT = "example_single_tool_call_simple_agent"
MAX_STEPS = 3
# A hermes tool call of the example's one tool; as a `structured_outputs` regex it forces the tiny random model
# to call it (the model would never do so on its own).
GET_WEATHER_CALL_REGEX = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "sf"\}\}\n</tool_call>'


def single_tool_call_spec(policy_base_url: list[str], model_name: str, **overrides: Any) -> GymLaunchSpec:
    """Launch spec of the example single-tool-call environment against the given vLLM replicas."""
    config_overrides = {
        SINGLE_TOOL_CALL_AGENT: {"responses_api_agents": {"simple_agent": {"max_steps": MAX_STEPS}}},
        **overrides.pop("config_overrides", {}),
    }
    return GymLaunchSpec(
        config_paths=[SINGLE_TOOL_CALL_CONFIG, TRAINING_MODEL_CONFIG],
        policy_base_url=policy_base_url,
        policy_model_name=model_name,
        config_overrides=config_overrides,
        **overrides,
    )


def example_rows(env: str = "example_single_tool_call") -> list[dict[str, Any]]:
    """The rows of ``resources_servers/<env>/data/example.jsonl`` shipped with Gym."""
    path = gym_package_root(paths.gym_venv()) / "resources_servers" / env / "data" / "example.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def forced_tool_call_row(
    row: dict[str, Any], seed: int = 0, alternative_text: str | None = None, temperature: float | None = None
) -> dict[str, Any]:
    """``row`` with vLLM sampling forced (per row, via the model server's ``metadata.extra_body``) to the
    ``get_weather`` call, or -- with ``alternative_text`` (a regex) -- to either that call or that text. The same
    constraint applies to every turn of the rollout."""
    pattern = GET_WEATHER_CALL_REGEX if alternative_text is None else f"({GET_WEATHER_CALL_REGEX}|{alternative_text})"
    extra_body = {"seed": seed, "structured_outputs": {"regex": pattern}}
    params = {
        **row["responses_create_params"],
        "max_output_tokens": 64,
        "metadata": {"extra_body": json.dumps(extra_body)},
    }
    if temperature is not None:
        params["temperature"] = temperature
    return {**row, "responses_create_params": params}


def run_core_step(
    head_url: str, rows: list[dict[str, Any]], agent: str, overrides: dict[str, Any], *, prompt_length: int
) -> Any:
    """``rows`` (all bound for ``agent``) through the rollout core against a running Gym, as a trainer step runs them:
    the core's ``StepResult``, the response budget being ``overrides["max_output_tokens"]``."""
    from nemo_gym_adapter.rollouts.client import RolloutClientConfig, read_routes
    from nemo_gym_adapter.rollouts.core import BlockingRolloutCore, RolloutCore
    from nemo_gym_adapter.rollouts.trajectory import TrajectoryConfig

    routes = read_routes(head_url)
    config = TrajectoryConfig(prompt_length=prompt_length, response_length=overrides["max_output_tokens"])
    client = RolloutClientConfig(max_concurrency=16, timeout_s=600, progress=False)
    with BlockingRolloutCore(RolloutCore(routes, config, client)) as core:
        return core.run_step(rows, [agent] * len(rows), overrides)


@pytest.fixture(scope="module")
def gym_single_tool_call(vllm_server) -> Iterator[GymServers]:
    """A real Gym (example_single_tool_call) in front of ``vllm_server``; stopped (whole pid tree) after the module.

    Module scope, so modules that start Gyms of their own never run next to this one (one Gym at a time: ~2 GB
    with its Ray cluster)."""
    # Two replica URLs (the same server under two names) so the multi-replica path of vllm_model is exercised.
    replicas = [vllm_server.base_url, vllm_server.base_url.replace("127.0.0.1", "localhost")]
    spec = single_tool_call_spec(replicas, vllm_server.model_name)
    with GymServers.start(spec) as gym:
        yield gym
