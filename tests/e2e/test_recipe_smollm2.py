"""A real pretrained model through the whole recipe: ``python -m recipe.nemo_gym.main --config-name
nemo_gym_cpu_smollm2_math`` (verl's v1 trainer) with SmolLM2-135M-Instruct (the cached conversion,
``${ngv_demo_model:smollm2}``) on Gym's stock ``math_with_judge`` (math-verify, no judge) and the repo's arithmetic
rows, shrunk to two GRPO steps of 2 questions x 4 samples and no validation. Checked from verl's console logger: both
steps are logged, every sample was scored (nothing masked: free-text answers of a real model, 64 tokens), rewards
are math-verify's 0/1, the rollout-vs-actor log-prob gap is float32-small on a real 30-layer model (so the trusted-log-prob
guard lets step 2 train on the rollout's log-probs, without the recompute), and the engine's probe moved after step 1 (the 113 MB embedding went through the weight sync). Helpers are the legacy e2e's.
"""

from __future__ import annotations

import math

import pytest

from nemo_gym_adapter.demo_models.converter import build_demo_model
from tests.e2e import test_recipe_cpu_smoke as legacy
from tests.e2e.test_recipe_cpu_smoke import _parse_steps, _run_recipe

reaped_children = legacy.reaped_children
# The slow tier (CI budget; docs/CI.md): 184 s of a fresh clone's CI. The real model stays in the default tier served
# through Gym (tests/integration/rollouts/test_smollm2_multi_turn.py, tests/integration/test_smollm2_vllm.py); the
# recipe's launch path is the tiny models' e2e; its learning run is a benchmark (docs/BENCHMARKS.md).
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ENV = "math_with_judge_simple_agent"
STEPS = 2
SMALL = (
    f"trainer.total_training_steps={STEPS}",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.logger=[console]",
    "data.train_batch_size=2",
    "data.shuffle=false",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    # A large step, so step 1's update moves the engine's probe log-probs well above float32 noise.
    "actor_rollout_ref.actor.optim.lr=1e-4",
)
GAP_TOL = 1e-3  # mean |vLLM - actor| log-prob, fp32 both sides, 30 layers (the tiny models: 1e-5)


def test_two_grpo_steps_of_the_real_model_on_math_with_judge(tmp_path, reaped_children):
    build_demo_model("smollm2")  # converted once (setup_tests.sh does it in CI); the config resolves the same directory
    text, wall = _run_recipe(tmp_path, *SMALL, config_name="nemo_gym_cpu_smollm2_math")
    steps = _parse_steps(text)
    assert sorted(steps) == list(range(1, STEPS + 1)), f"steps logged: {sorted(steps)}\n{text[-3000:]}"
    for step, m in steps.items():
        for key in (
            f"gym/{ENV}/reward_mean",
            "gym/all/masked_rate",
            "gym/all/contiguity_rate",
            "actor/pg_loss",
            "onpolicy/rollout_nll_mean",
            "gym/engine/probe_logprob_mean",
        ):
            assert key in m and math.isfinite(m[key]), (step, key, sorted(m))
        assert m["gym/all/num_samples"] == 2 * 4, (step, m)
        assert m["gym/all/masked_rate"] == 0.0, (step, {k: v for k, v in m.items() if "masked" in k})
        assert 0.0 <= m[f"gym/{ENV}/reward_mean"] <= 1.0
    # nemo_gym.trusted_logprobs (on in this config): the guard recomputes step 1 and finds the real model's rollout
    # log-probs within its bounds (fp32 on both sides), so step 2 trains on them as the old log-probs: no recompute.
    first, second = steps[1], steps[2]
    assert first["onpolicy/trusted"] == 0.0 and first["onpolicy/guard/within"] == 1.0, first
    assert first["onpolicy/logprob_abs_diff_mean"] < GAP_TOL, first["onpolicy/logprob_abs_diff_mean"]
    assert second["onpolicy/trusted"] == 1.0 and "onpolicy/logprob_abs_diff_mean" not in second, second
    assert "log-prob guard, step 1: rollout vs actor log-probs" in text
    probes = [steps[s]["gym/engine/probe_logprob_mean"] for s in sorted(steps)]
    assert probes[0] != probes[1], f"rollout engine weights did not change after step 1: {probes}"
    print(
        f"smollm2 e2e: {wall:.0f}s wall; "
        + ", ".join(
            f"step {s}: reward {m[f'gym/{ENV}/reward_mean']:.3f} gen {m['timing_s/gen']:.1f}s "
            f"step {m['timing_s/step']:.1f}s old log-probs {m['timing_s/old_log_prob']:.1f}s "
            f"gap {m.get('onpolicy/logprob_abs_diff_mean', math.nan):.1e} trusted {m['onpolicy/trusted']:.0f}"
            for s, m in sorted(steps.items())
        )
        + f"; probes {probes}"
    )
    left = reaped_children()
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"
