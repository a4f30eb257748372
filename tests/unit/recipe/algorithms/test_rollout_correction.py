"""verl's rollout-correction step on a step in which every sample is masked: verl raises, the guard reports NaN.

All calls go to verl 0.9.1's real ``compute_rollout_correction_and_add_to_batch`` with its own default config block
(``verl/trainer/config/algorithm/rollout_correction.yaml``) or IS/RS options switched on.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.ppo import rollout_corr_helper

from recipe.nemo_gym.algorithms import rollout_correction
from recipe.nemo_gym.algorithms.rollout_correction import all_masked_safe

VERL_FN = rollout_corr_helper.compute_rollout_correction_and_add_to_batch  # as imported, before any install()


def _verl_default_config():
    import verl

    path = os.path.join(os.path.dirname(verl.__file__), "trainer", "config", "algorithm", "rollout_correction.yaml")
    return OmegaConf.load(path)


CONFIGS = {
    "verl default (metrics only)": {},
    "token IS + token_k1 RS": {"rollout_is": "token", "rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"},
    "sequence IS": {"rollout_is": "sequence"},
}


def _config(options: dict):
    return OmegaConf.merge(_verl_default_config(), options)


def _batch(mask: torch.Tensor) -> DataProto:
    gen = torch.Generator().manual_seed(0)
    rollout = -torch.rand(mask.shape, generator=gen) * 5
    old = rollout + 0.01 * torch.randn(mask.shape, generator=gen)
    return DataProto.from_dict(tensors={"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": mask})


def _valid_mask() -> torch.Tensor:
    mask = torch.zeros(4, 6)
    mask[0, :5] = mask[2, :3] = mask[3, :6] = 1  # row 1 is a masked (failed) rollout
    return mask


@pytest.mark.parametrize("options", CONFIGS.values(), ids=CONFIGS.keys())
def test_verl_raises_on_a_step_with_every_sample_masked(options):
    """The reproduction: what fit() would hit without the guard (remove the guard once this stops raising)."""
    with pytest.raises(ValueError, match="at least one valid token"):
        VERL_FN(_batch(torch.zeros(4, 6)), _config(options))


@pytest.mark.parametrize("options", CONFIGS.values(), ids=CONFIGS.keys())
def test_guard_reports_verls_keys_as_nan_and_keeps_the_batch(options):
    config = _config(options)
    _, expected = VERL_FN(_batch(_valid_mask()), config)
    batch = _batch(torch.zeros(4, 6))
    before = {k: v.clone() for k, v in batch.batch.items()}

    out, metrics = all_masked_safe(VERL_FN)(batch, config)

    assert set(metrics) == set(expected) and any(k.startswith("rollout_corr/") for k in metrics)
    assert "rollout_corr/k3_kl" in metrics and all(math.isnan(v) for v in metrics.values())
    for key, value in before.items():
        assert torch.equal(out.batch[key], value), key
    if options.get("rollout_is"):  # verl's masked tokens get weight 0; the actor expects the key when IS is on
        assert torch.equal(out.batch["rollout_is_weights"], torch.zeros(4, 6))
    else:
        assert "rollout_is_weights" not in out.batch.keys()


@pytest.mark.parametrize("options", CONFIGS.values(), ids=CONFIGS.keys())
def test_guard_passes_a_batch_with_valid_tokens_to_verl_unchanged(options):
    config = _config(options)
    expected_batch, expected = VERL_FN(_batch(_valid_mask()), config)
    out, metrics = all_masked_safe(VERL_FN)(_batch(_valid_mask()), config)
    assert metrics == expected and all(math.isfinite(v) for v in metrics.values())
    assert set(out.batch.keys()) == set(expected_batch.batch.keys())
    for key in out.batch.keys():
        assert torch.equal(out.batch[key], expected_batch.batch[key]), key


def test_install_replaces_what_fit_imports_once(monkeypatch):
    monkeypatch.setattr(rollout_corr_helper, "compute_rollout_correction_and_add_to_batch", VERL_FN)
    rollout_correction.install()
    rollout_correction.install()
    # RayPPOTrainer.fit does exactly this import at the call site, every step.
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch as seen

    assert seen is not VERL_FN and seen.__wrapped__ is VERL_FN  # wrapped once, not twice
    _, metrics = seen(_batch(torch.zeros(4, 6)), _config({}))
    assert math.isnan(metrics["rollout_corr/kl"])


def test_nemo_gym_trainer_fit_installs_the_guard_before_verls_fit(monkeypatch):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from recipe.nemo_gym.trainer.task_runner import NemoGymPPOTrainer

    monkeypatch.setattr(rollout_corr_helper, "compute_rollout_correction_and_add_to_batch", VERL_FN)
    seen = []

    def fake_verl_fit(self):  # a fake of verl's fit: records what its rollout-correction import would get
        seen.append(rollout_corr_helper.compute_rollout_correction_and_add_to_batch)
        return "fit done"

    monkeypatch.setattr(RayPPOTrainer, "fit", fake_verl_fit)
    trainer = object.__new__(NemoGymPPOTrainer)
    assert trainer.fit() == "fit done"
    assert seen[0] is not VERL_FN and seen[0].__wrapped__ is VERL_FN


def test_install_also_guards_the_name_verls_v1_trainer_imported(monkeypatch):
    from verl.trainer.ppo.v1 import trainer_base

    monkeypatch.setattr(rollout_corr_helper, "compute_rollout_correction_and_add_to_batch", VERL_FN)
    monkeypatch.setattr(trainer_base, "compute_rollout_correction_and_add_to_batch", VERL_FN)
    rollout_correction.install()
    guarded = trainer_base.compute_rollout_correction_and_add_to_batch  # what PPOTrainer._compute_advantage calls
    assert guarded is not VERL_FN and guarded.__wrapped__ is VERL_FN
    _, metrics = guarded(_batch(torch.zeros(4, 6)), _config({}))
    assert math.isnan(metrics["rollout_corr/kl"])
