"""The tool model learns to answer from what its tools return (issue 35): ``python -m recipe.nemo_gym.main
--config-name nemo_gym_cpu_qwen_calc`` -- Qwen2.5-Coder-0.5B-Instruct on Gym's stock ``math_advanced_calculations``
(each tool computes something else than its name says; a nested expression is solved only by passing an inner call's
*returned* value to the outer call) -- and the measurement arm that trains on re-templated conversations instead.

Slow tier (a launch of the 0.5B model: minutes of start-up; the learning run ~1.5 h on 2 cores):

* the learning run, as shipped (12 steps, greedy validation on the 50 held-out rows at steps 0, 4, 8, 12): every later
  model call spliced token for token, no trained token the model did not generate; then the issue's bar, validation
  success up by at least 0.15, reported as an expected failure while it is not met (measured: 0.34 -> 0.22 with lr 1e-4
  on all 240 rows, the policy collapsed onto calls its parser cannot read; 0.32 -> 0.40 in 12 steps as shipped now, on
  the rows with a mixed outcome (0.44 at step 8 in another run); docs/BENCHMARKS.md, "Answering from the tool") -- it
  turns into a pass, loudly, the day it learns enough;
* ``train_tokens: measure_retemplated`` with the patch off, two small steps: the run trains, a share of its trained
  tokens is ones the model never generated (the re-rendered ``<tool_call>`` wrapper around its bare-JSON calls), and
  the per-turn gap shows later turns further from the actor than first turns.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from nemo_gym_adapter.demo_models.converter import build_demo_model
from tests.e2e import test_recipe_cpu_smoke as legacy
from tests.e2e.test_recipe_cpu_smoke import _parse_steps, _run_recipe, batch_overrides
from tests.e2e.test_recipe_tool_model import pytestmark  # noqa: F401  (slow tier, a node that fits the 0.5B run)

reaped_children = legacy.reaped_children
CONFIG = "nemo_gym_cpu_qwen_calc"
ENV = "math_advanced_calculations_simple_agent"
BAR = 0.15  # greedy validation success, step 12 over step 0 (issue 35's "done when")


def _val_success(metrics: dict[int, dict[str, float]]) -> dict[int, float]:
    key = next(k for m in metrics.values() for k in m if k.startswith("val-core/") and k.endswith("/success_rate"))
    return {s: m[key] for s, m in metrics.items() if key in m}


def _metrics_file(run_dir: Path) -> dict[int, dict[str, float]]:
    from recipe.nemo_gym.reporting.curve import load_step_metrics

    return load_step_metrics(run_dir / "metrics.jsonl")


def test_the_tool_model_learns_to_chain_what_its_tools_return(tmp_path, reaped_children):
    build_demo_model("qwen2.5-coder-0.5b")
    run_dir = tmp_path / "run"
    text, wall = _run_recipe(
        tmp_path,
        f"nemo_gym.run_dir={run_dir}",
        f"trainer.rollout_data_dir={tmp_path / 'dump'}",
        config_name=CONFIG,
    )
    steps = _parse_steps(text)
    assert sorted(steps) == list(range(1, 13)), f"steps logged: {sorted(steps)}\n{text[-3000:]}"
    for step, m in steps.items():
        assert m[f"gym/{ENV}/contiguity_rate"] == 1.0, (step, m)
        assert m["onpolicy/never_generated_rate"] == 0.0, (step, m)
        assert math.isfinite(m["actor/pg_loss"]), step
    val = _val_success(_metrics_file(run_dir))
    assert sorted(val) == [0, 4, 8, 12], val
    left = reaped_children()
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"
    if val[12] - val[0] < BAR:
        pytest.xfail(f"issue 35's bar not met: greedy validation {val} ({wall:.0f}s)")


def test_the_retemplated_arm_trains_on_tokens_the_model_never_wrote(tmp_path, reaped_children):
    build_demo_model("qwen2.5-coder-0.5b")
    text, _ = _run_recipe(
        tmp_path,
        "nemo_gym.patch_vllm=false",
        "nemo_gym.trajectory.train_tokens=measure_retemplated",
        # stock vLLM rejects a later call whose prompt + max_tokens passes max_model_len (the patch clamps it): room
        # for the whole response budget after the longest prompt, as the arms of docs/TOKEN_PATCH.md ran
        "actor_rollout_ref.rollout.max_model_len=1664",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[console]",
        *batch_overrides(2, 4),
        f"trainer.rollout_data_dir={tmp_path / 'dump'}",
        config_name=CONFIG,
    )
    steps = _parse_steps(text)
    assert sorted(steps) == [1, 2], text[-3000:]
    multi_turn = [m for m in steps.values() if m.get("onpolicy/later_turns/num_tokens", 0) > 0]
    assert multi_turn, "no later turn was trained: the arm shows nothing"
    for step, m in steps.items():
        assert m[f"gym/{ENV}/masked_rate"] < 1.0 and math.isfinite(m["actor/pg_loss"]), (step, m)
    never = [m["onpolicy/never_generated_rate"] for m in multi_turn]
    assert all(r > 0 for r in never), never  # the re-rendered <tool_call> wrapper around its bare-JSON calls
    dumped = [
        json.loads(line)
        for f in sorted((tmp_path / "dump" / "gym" / "train").glob("step_*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert any(r["num_turns"] >= 2 and r["masked_reason"] is None for r in dumped), "no multi-turn sample trained"
    left = reaped_children()
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"
