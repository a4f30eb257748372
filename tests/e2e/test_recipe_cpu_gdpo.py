"""GDPO on Gym's multi-reward results, hydra-launched end to end on verl's legacy trainer (the one verl 0.9.1 hands
reward components to the estimator): ``python -m recipe.nemo_gym.main --config-name nemo_gym_cpu_toy
trainer.use_v1=false algorithm.adv_estimator=gdpo algorithm.gdpo_reward_keys=[correctness,schema_valid,format]`` on
``configs/gym/toy_multireward.yaml`` (Gym's stock ``example_tool_call_multireward`` resources server; each row lets the
tiny random model pick one of five replies whose three components differ, two of them with the same sum).

Checked from the console logger, per step: verl's own ``gdpo/<key>/{mean,std}`` (computed from the batch's
``non_tensor_batch[<key>]``, the columns GDPO reads) and ours ``gym/<env>/reward_components/<key>`` for every key;
their means agree (the same values reached both); the step's reward mean is the components' sum. Fails when the
components are dropped: verl's GDPO asserts on a missing key and the adapter's first-step check names it, so the run
exits non-zero and no ``gdpo/*`` metric is logged. No process is left behind. Lean (CI budget): 4 rows x 4 samples,
2 steps, no validation.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from recipe.nemo_gym.masked_estimators import NOTICE
from tests.e2e.test_recipe_cpu_smoke import (  # noqa: F401 (fixture)
    LEGACY,
    _parse_steps,
    _run_recipe,
    batch_overrides,
    reaped_children,
)

pytestmark = pytest.mark.e2e

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "gym"
ENV = "toy_multireward_simple_agent"
KEYS = ("correctness", "schema_valid", "format")
STEPS = 2
BATCH, N = 4, 4


def test_gdpo_on_gym_reward_components_on_the_legacy_trainer(tmp_path, reaped_children):  # noqa: F811
    text, wall = _run_recipe(
        tmp_path,
        LEGACY,
        "algorithm.adv_estimator=gdpo",
        f"algorithm.gdpo_reward_keys=[{','.join(KEYS)}]",
        f"nemo_gym.config_paths=[{CONFIGS / 'toy_multireward.yaml'}]",
        f"data.train_files=[{CONFIGS / 'data' / 'toy_multireward.jsonl'}]",
        f"data.val_files=[{CONFIGS / 'data' / 'toy_multireward_val.jsonl'}]",
        f"data.nemo_gym.default_agent={ENV}",
        "data.max_prompt_length=384",
        "data.max_response_length=64",
        *batch_overrides(BATCH, N),
        f"trainer.total_training_steps={STEPS}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        config_name="nemo_gym_cpu_toy",
    )
    assert text.count(f"{NOTICE}: grpo, ") == 1, "masked_estimators.install() did not run once in the TaskRunner"
    steps = _parse_steps(text)
    assert sorted(steps) == list(range(1, STEPS + 1)), f"steps logged: {sorted(steps)}\n{text[-3000:]}"
    spread = 0.0
    for step, m in steps.items():
        assert m[f"gym/{ENV}/num_samples"] == BATCH * N, (step, sorted(m))
        total = 0.0
        for key in KEYS:
            ours, verls = m[f"gym/{ENV}/reward_components/{key}"], m[f"gdpo/{key}/mean"]
            valid = 1.0 - m["gym/all/masked_rate"]
            if valid == 1.0:  # masked samples carry their group's fill in verl's column, and count in its mean
                assert math.isclose(ours, verls, abs_tol=1e-6), (step, key, ours, verls)
            total += ours
            spread = max(spread, m[f"gdpo/{key}/std"])
        assert math.isclose(total, m[f"gym/{ENV}/reward_mean"], abs_tol=1e-5), (step, total, sorted(m))
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["critic/advantages/max"]), (step, sorted(m))
    assert spread > 0, "every sample got the same components: nothing for GDPO to normalise"
    print(
        f"gdpo: {wall:.0f}s wall; "
        + "; ".join(
            f"step {s}: reward {m[f'gym/{ENV}/reward_mean']:.2f} "
            + " ".join(f"{k} {m[f'gdpo/{k}/mean']:.2f}±{m[f'gdpo/{k}/std']:.2f}" for k in KEYS)
            for s, m in sorted(steps.items())
        )
    )
    assert not (tmp_path / "gym" / "gym.pid").exists()
    left = reaped_children()
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"
