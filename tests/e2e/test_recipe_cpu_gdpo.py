"""GDPO on Gym's multi-reward results, hydra-launched end to end on verl's v1 trainer (the default):
``python -m recipe.nemo_gym.main --config-name nemo_gym_cpu_toy algorithm.adv_estimator=gdpo
algorithm.gdpo_reward_keys=[correctness,schema_valid,format]`` on ``configs/gym/toy_multireward.yaml`` (Gym's stock
``example_tool_call_multireward`` resources server; each row lets the tiny random model pick one of five replies whose
three components differ, two of them with the same sum).

The components travel with each sample through TransferQueue and reach verl's own GDPO (``recipe.nemo_gym.algorithms.gdpo``; the
v1 trainer of verl 0.9.1 alone fails on its first step). Checked from the console logger, per step: the
``gdpo/<key>/{mean,std}`` of the column GDPO read (logged by the hand-over, as the legacy trainer logs them) and ours
``gym/<env>/reward_components/<key>`` for every key agree (the same values reached both); the step's reward mean is
the components' sum and no result broke that (``reward_components_sum_mismatch_rate`` 0, nothing incomplete); the
loss and advantages are finite. That GDPO's numbers are the legacy trainer's on the same batch, bit for bit, is
``tests/unit/recipe/algorithms/test_gdpo.py``; the legacy trainer's run of the same command (``trainer.use_v1=false``) is
here too. Both launches are the slow tier (``pytest --slow``; docs/CI.md says why). No process is left behind. Lean (CI budget):
4 rows x 4 samples, 2 steps, no validation.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from recipe.nemo_gym.algorithms.masked_estimators import NOTICE
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


def _run_gdpo(tmp_path, *trainer: str) -> tuple[dict[int, dict[str, float]], str, float]:
    text, wall = _run_recipe(
        tmp_path,
        *trainer,
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
    return steps, text, wall


def _check_gdpo_steps(steps: dict[int, dict[str, float]], wall: float, trainer: str) -> None:
    spread = 0.0
    for step, m in steps.items():
        assert m[f"gym/{ENV}/num_samples"] == BATCH * N, (step, sorted(m))
        total = 0.0
        for key in KEYS:
            ours, gdpo = m[f"gym/{ENV}/reward_components/{key}"], m[f"gdpo/{key}/mean"]
            valid = 1.0 - m["gym/all/masked_rate"]
            if valid == 1.0:  # masked samples carry their group's fill in GDPO's column, and count in its mean
                assert math.isclose(ours, gdpo, abs_tol=1e-6), (step, key, ours, gdpo)
            total += ours
            spread = max(spread, m[f"gdpo/{key}/std"])
        assert math.isclose(total, m[f"gym/{ENV}/reward_mean"], abs_tol=1e-5), (step, total, sorted(m))
        assert m[f"gym/{ENV}/reward_components_sum_mismatch_rate"] == 0.0, (step, sorted(m))
        assert m[f"gym/{ENV}/reward_components_incomplete_rate"] == 0.0, (step, sorted(m))
        assert m["gym/all/masked_rate/missing_reward_component"] == 0.0, (step, sorted(m))
        assert math.isfinite(m["actor/pg_loss"]) and math.isfinite(m["critic/advantages/max"]), (step, sorted(m))
    assert spread > 0, "every sample got the same components: nothing for GDPO to normalise"
    print(
        f"gdpo ({trainer}): {wall:.0f}s wall; "
        + "; ".join(
            f"step {s}: reward {m[f'gym/{ENV}/reward_mean']:.2f} "
            + " ".join(f"{k} {m[f'gdpo/{k}/mean']:.2f}±{m[f'gdpo/{k}/std']:.2f}" for k in KEYS)
            for s, m in sorted(steps.items())
        )
    )


def _nothing_left(tmp_path, reaped_children) -> None:  # noqa: F811
    assert not (tmp_path / "gym" / "gym.pid").exists()
    left = reaped_children()
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"


# The slow tier too (CI budget; docs/CI.md): 145 s of a fresh clone's CI. In the unit tier: GDPO's advantages through
# verl's real code on both trainers, bit for bit (tests/unit/recipe/algorithms/test_gdpo.py), the components' columns and masking
# (tests/unit/recipe/algorithms/test_outcomes.py); the v1 launch it rides on is the v1 smoke's.
@pytest.mark.slow
def test_gdpo_on_gym_reward_components_on_the_v1_trainer(tmp_path, reaped_children):  # noqa: F811
    steps, _, wall = _run_gdpo(tmp_path, "trainer.use_v1=true", "trainer.v1.trainer_mode=sync")
    _check_gdpo_steps(steps, wall, "v1")
    _nothing_left(tmp_path, reaped_children)


@pytest.mark.slow  # the same command on the legacy trainer
def test_gdpo_on_gym_reward_components_on_the_legacy_trainer(tmp_path, reaped_children):  # noqa: F811
    steps, _, wall = _run_gdpo(tmp_path, LEGACY)
    _check_gdpo_steps(steps, wall, "legacy")
    _nothing_left(tmp_path, reaped_children)
