"""``rollout.name=sglang`` on this CPU machine, hydra-launched: the recipe starts as a user would start it -- config
validated, the driver's Ray cluster, verl's TaskRunner -- up to the point where verl would build the SGLang rollout
replicas, and stops there with one message naming ``actor_rollout_ref.rollout.name`` and why (SGLang's engine runs
on GPUs only, and SGLang is not installed in the trainer venv). Exit status 1, no traceback to read, no Gym started,
nothing left behind. The patch itself is executed against SGLang's real serving code by
``tests/integration/sglang/test_sglang_hook.py``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e import test_recipe_cpu_smoke as legacy

pytestmark = pytest.mark.e2e

reaped_children = legacy.reaped_children  # this process reaps what the run leaves
MESSAGE = "error: actor_rollout_ref.rollout.name=sglang cannot start here: trainer.device=cpu: SGLang's engine runs"


# The slow tier (CI budget; docs/CI.md): the message is check_engine_available's (tests/unit/recipe/servers/test_engines.py),
# the TaskRunner's start-up is every default e2e launch's, and the SGLang patch runs against SGLang's real serving
# code in tests/integration/sglang/test_sglang_hook.py.
@pytest.mark.slow
def test_sglang_on_the_cpu_config_starts_up_to_the_engine_and_stops_naming_the_key(tmp_path, reaped_children):
    cmd = [
        sys.executable,
        "-m",
        "recipe.nemo_gym.main",
        "--config-name",
        "nemo_gym_cpu",
        "actor_rollout_ref.rollout.name=sglang",
        f"nemo_gym.run_dir={tmp_path / 'gym'}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    started = time.monotonic()
    result = subprocess.run(
        cmd, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=legacy.TIMEOUT_S
    )
    wall = time.monotonic() - started
    text = result.stdout + result.stderr
    assert result.returncode == 1, f"exit {result.returncode} after {wall:.0f}s\n{text[-6000:]}"
    assert MESSAGE in result.stderr, text[-6000:]
    assert "SGLang is not installed in this Python" in result.stderr
    # It got that far: Ray started, and the message comes from check_engine_available, which only the TaskRunner (a
    # Ray actor) calls. Not the TaskRunner's own banner line: Ray forwards an actor's stdout asynchronously and the
    # driver may stop before it does (missing on every run after the merge of main, under pytest's pipe).
    assert "Started a local Ray instance" in text
    assert "Traceback" not in result.stderr, result.stderr[-6000:]
    assert not (tmp_path / "gym").exists()  # stopped before Gym (or its early Ray head) was started
    left = reaped_children()
    assert not left, f"processes left behind: {[p.cmdline()[:3] for p in left]}"
    print(f"\n[sglang e2e] stopped at the engine after {wall:.0f}s")
