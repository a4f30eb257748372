"""Stock Gym environments start on a fresh clone, as a user runs them: ``python -m nemo_gym_adapter.collect --env
math_with_code --env mcqa`` against a server venvs dir where neither was prepared (set-up prepares only the servers our
shipped configs use). The launch prepares both before Gym starts (math_with_code's numpy/scipy/pandas: met by the Gym
venv, a link; mcqa's tiktoken: added to the shared overlay, from PyPI or the pip cache), so Gym never takes its own
``uv`` path ("uv: command not found" before). Real Gym, the patched vLLM with the tiny model, one start (~1.5 min)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from nemo_gym_adapter.runtime import paths

pytestmark = pytest.mark.integration

ENVS = ("math_with_code", "mcqa")


def test_collect_prepares_stock_environments_on_a_fresh_venvs_dir(tmp_path):
    venvs, out = tmp_path / "server-venvs", tmp_path / "rollouts.jsonl"
    cmd = [sys.executable, "-m", "nemo_gym_adapter.collect", *[a for env in ENVS for a in ("--env", env)]]
    cmd += [
        "--limit",
        "1",
        "--repeats",
        "1",
        "--max-output-tokens",
        "16",
        "--output",
        str(out),
        "--json",
        "--no-progress",
    ]
    env = {**os.environ, "NGV_GYM_SERVER_VENVS": str(venvs)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=paths.REPO_ROOT, env=env)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "uv: command not found" not in proc.stderr
    assert "servers prepared in" in proc.stderr  # on first use, said so
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["env"] for r in records) == [f"{env}_simple_agent" for env in ENVS], records
    # Every rollout came back from its environment (the tiny random model scores 0; a crashed server answers nothing).
    assert all(r["reward"] is not None for r in records), [(r["env"], r["masked_reason"]) for r in records]
    state = json.loads((venvs / ".ngv-venvs.json").read_text())["servers"]
    assert state["resources_servers/math_with_code"]["venv"] == "base", state
    assert state["resources_servers/mcqa"]["venv"] == "shared", state
    tiktoken = subprocess.run(
        [str(venvs / "resources_servers/mcqa/.venv/bin/python"), "-c", "import tiktoken"], capture_output=True
    )
    assert tiktoken.returncode == 0, tiktoken.stderr
