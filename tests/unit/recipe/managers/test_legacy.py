"""The legacy rollout manager's GDPO path (``recipe.nemo_gym.managers.legacy``) into verl's legacy trainer code, with a fake
rollout core: what ``generate_sequences`` returns goes through verl's own ``extract_reward`` and ``compute_advantage``
as ``RayPPOTrainer.fit`` runs them. The cheap twin of the legacy GDPO e2e (slow tier,
``tests/e2e/test_recipe_cpu_gdpo.py``); the real manager with real servers is ``tests/integration/recipe/``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.rollouts.core import RowResult, StepResult
from nemo_gym_adapter.rollouts.metrics import compute_metrics
from nemo_gym_adapter.rollouts.outcome import trajectories_from_outcome
from nemo_gym_adapter.rollouts.trajectory import MaskReason, TrajectoryConfig
from recipe.nemo_gym.config.sampling import SamplingSettings
from recipe.nemo_gym.managers.legacy import GYM_METRICS_KEY, NemoGymAgentLoopManager
from tests.support.gym_results import E0, G0, G1, P0, PAD, FakeFailure, FakeOutcome, handmade_multiturn
from tests.support.verl_estimators import restored_estimators

pytestmark = pytest.mark.filterwarnings("ignore")

KEYS = ("correctness", "format")
CONFIG = TrajectoryConfig(prompt_length=16, response_length=16, required_components=KEYS)


class FakeBlockingCore:
    """Stands in for ``BlockingRolloutCore``: each row's ``fake`` field is its Gym result (``None``: a timeout),
    turned into trajectories by the real ``trajectories_from_outcome``; records the overrides it was given."""

    def __init__(self) -> None:
        self.overrides: list[dict[str, Any]] = []

    def run_step(self, rows, envs, overrides=None, *, on_row=None, desc="") -> StepResult:
        self.overrides.append(dict(overrides or {}))
        out = []
        for i, (row, env) in enumerate(zip(rows, envs, strict=True)):
            if row["fake"] is None:
                outcome = FakeOutcome(i, 0.1, failure=FakeFailure("timeout", "fake"))
            else:
                outcome = FakeOutcome(i, 0.1, result=row["fake"])
            samples = trajectories_from_outcome(outcome, env_name=env, config=CONFIG)
            out.append(RowResult(i, env, outcome, samples[0]))
        return StepResult(rows=out, metrics=compute_metrics([r.trajectory for r in out]))  # as the real core


def manager() -> NemoGymAgentLoopManager:
    """The legacy manager's per-step state without start-up (no replicas, no Gym)."""
    from types import SimpleNamespace

    m = object.__new__(NemoGymAgentLoopManager)
    m.core = m.runner = FakeBlockingCore()
    m._closed = False
    m.recipe = SimpleNamespace(
        sampling=SamplingSettings(temperature=1.0),
        val_sampling=SamplingSettings(temperature=0.0),
        prompt_length=16,
        response_length=16,
        adv_estimator="gdpo",
        gdpo_reward_keys=list(KEYS),
    )
    m.pad_token_id = PAD
    m._gdpo_checked_envs = set()
    m.dump = None
    m.replicas = {}
    m.served_model_name = None
    return m


def result(components: dict[str, float] | None, reward: float | None = None) -> dict[str, Any]:
    total = float(sum((components or {}).values())) if reward is None else reward
    payload = handmade_multiturn(P0, [G0, G1], [E0], reward=total)
    if components is not None:
        payload["reward_components"] = components
    return payload


def batch(fakes: list[dict[str, Any] | None], n: int = 4) -> Any:
    from verl import DataProto

    rows = np.empty(len(fakes), dtype=object)
    rows[:] = [{"responses_create_params": {"input": "q"}, "fake": f} for f in fakes]
    uids = np.array([f"u{i // n}" for i in range(len(fakes))], dtype=object)
    envs = np.array(["multi"] * len(fakes), dtype=object)
    data = DataProto.from_dict(non_tensors={"gym_row": rows, "gym_env": envs, "uid": uids})
    data.meta_info = {"global_steps": 1}
    return data


def verl_legacy_advantages(prompts: Any, out: Any) -> torch.Tensor:
    """What ``RayPPOTrainer.fit`` does with the manager's output: its uids, ``extract_reward``, the columns into
    ``non_tensor_batch``, then ``compute_advantage`` with the GDPO config."""
    from verl.trainer.ppo.ray_trainer import compute_advantage
    from verl.trainer.ppo.reward import extract_reward

    from recipe.nemo_gym.algorithms import masked_estimators

    masked_estimators.install()
    data = out  # verl unions it with the repeated prompt batch: what GDPO reads from there is each row's uid
    data.non_tensor_batch["uid"] = prompts.non_tensor_batch["uid"]
    reward_tensor, extra = extract_reward(data)
    data.non_tensor_batch.update({k: np.array(v) for k, v in extra.items()})
    data.batch["token_level_scores"] = data.batch["token_level_rewards"] = reward_tensor
    algo = OmegaConf.create({"gdpo_reward_keys": list(KEYS), "norm_adv_by_std_in_grpo": True})
    return compute_advantage(data, adv_estimator="gdpo", config=algo).batch["advantages"]


@pytest.fixture(autouse=True)
def pristine_verl():
    with restored_estimators():
        yield


def test_gym_components_reach_verls_legacy_gdpo_and_a_sample_missing_one_is_masked_not_filled():
    fakes = [
        result({"correctness": 1.0, "format": 1.0}),
        result({"correctness": 0.0, "format": 1.0}),
        result({"format": 0.0}),  # no correctness: masked, never given a group-mate's value
        result({"correctness": 1.0, "format": 0.0}),
        result({"correctness": 0.0, "format": 0.0}),
        result({"correctness": 1.0, "format": 1.0}, reward=5.0),  # not the sum: trained as returned, counted
        None,  # a timeout
        result({"correctness": 0.0, "format": 1.0}),
    ]
    m, prompts = manager(), batch(fakes)
    out = m.generate_sequences(prompts)
    assert out.non_tensor_batch["gym_masked_reason"].tolist()[2] == MaskReason.MISSING_REWARD_COMPONENT.value
    assert out.meta_info["reward_extra_keys"] == ["correctness", "format", "gym_outcome"]
    assert out.non_tensor_batch["correctness"].tolist()[:2] == [1.0, 0.0]
    metrics = out.meta_info[GYM_METRICS_KEY]
    assert metrics["gym/multi/reward_components_sum_mismatch_rate"] == pytest.approx(1 / 7)
    assert metrics["gym/multi/reward_components_incomplete_rate"] == pytest.approx(1 / 7)
    assert metrics["gym/all/masked_rate/missing_reward_component"] == 1 / 8
    adv = verl_legacy_advantages(prompts, out)
    assert adv[2].abs().sum() == 0 and adv[6].abs().sum() == 0  # masked rows
    assert (adv[[0, 1, 3, 4, 5, 7]].abs().sum(-1) > 0).all()
    # GDPO read the components, not the summed reward: sample 5's reward of 5.0 moves nothing
    fakes[5] = result({"correctness": 1.0, "format": 1.0})
    again = verl_legacy_advantages(batch(fakes), manager().generate_sequences(batch(fakes)))
    assert torch.equal(adv, again)
    assert m.runner.overrides[0]["metadata.extra_body"]["top_k"] == -1  # every sampling setting sent


def test_an_environment_that_never_returns_a_gdpo_key_stops_the_first_step_naming_it():
    m = manager()
    with pytest.raises(AdapterConfigError, match=r"gdpo_reward_keys\[0\]='correctness'.*carry \['format'\]"):
        m.generate_sequences(batch([result({"format": 1.0}), result({"format": 0.0})], n=2))
