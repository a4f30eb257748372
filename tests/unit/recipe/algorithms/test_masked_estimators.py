"""recipe.nemo_gym.algorithms.masked_estimators: masked samples kept out of verl's own outcome estimators, and GDPO on Gym's
reward components (the legacy trainer's call, ``ray_trainer.compute_advantage``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from recipe.nemo_gym.algorithms import masked_estimators
from recipe.nemo_gym.algorithms.masked_estimators import exclude_masked
from recipe.nemo_gym.algorithms.masked_grpo import compute_masked_grpo_outcome_advantage
from recipe.nemo_gym.config.checks import MASKABLE_ESTIMATORS
from tests.support.verl_estimators import restored_estimators

pytestmark = pytest.mark.filterwarnings("ignore")

LENGTH, PROMPT = 5, 3


def _batch(scores, masked=(), n=4):
    bs = len(scores)
    rewards = torch.zeros(bs, LENGTH)
    rewards[:, -1] = torch.tensor(scores, dtype=torch.float32)
    mask = torch.ones(bs, LENGTH)
    for i in masked:
        mask[i] = 0
        rewards[i] = 0
    index = np.array([f"u{i // n}" for i in range(bs)], dtype=object)
    return rewards, mask, index


@pytest.fixture
def installed():
    """install() in this process, undone afterwards (other tests compare with verl's own estimators)."""
    with restored_estimators() as core_algos:
        masked_estimators.install()
        yield core_algos


def _verl(name):
    from verl.trainer.ppo import core_algos

    fn = core_algos.ADV_ESTIMATOR_REGISTRY[name]
    return getattr(fn, "__wrapped__", fn)  # verl's own function, whether or not install() ran in this process


def _gdpo_kwargs(rewards, mask, index, components, keys, weights=None):
    bs = rewards.shape[0]
    attention = torch.cat([torch.ones(bs, PROMPT), mask], 1).long()
    batch = {"prompts": torch.zeros(bs, PROMPT, dtype=torch.long), "attention_mask": attention}
    cfg = {"gdpo_reward_keys": list(keys), "norm_adv_by_std_in_grpo": True}
    if weights is not None:
        cfg["gdpo_reward_weights"] = list(weights)
    return dict(
        token_level_rewards=rewards,
        response_mask=mask,
        index=index,
        config=OmegaConf.create(cfg),
        batch=batch,
        non_tensor_batch=dict(components),
    )


@pytest.mark.parametrize("name", [n for n in MASKABLE_ESTIMATORS if n != "gdpo"])
def test_nothing_masked_is_verls_own_result_bit_for_bit(name):
    fn = _verl(name)
    rewards, mask, index = _batch([1, 0, 1, 1, 0, 0, 1, 0])
    kw = dict(token_level_rewards=rewards, response_mask=mask, index=index, config=OmegaConf.create({}))
    ours, theirs = exclude_masked(fn)(**kw), fn(**kw)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])


def test_nothing_masked_gdpo_is_verls_own_result_bit_for_bit():
    rewards, mask, index = _batch([2, 1, 3, 0, 1, 2, 0, 3])
    comps = {"correctness": np.array([1, 0, 1, 0, 1, 1, 0, 1.0]), "format": np.array([1, 1, 1, 0, 0, 1, 0, 1.0])}
    kw = _gdpo_kwargs(rewards, mask, index, comps, ["correctness", "format"])
    assert torch.equal(exclude_masked(_verl("gdpo"))(**kw)[0], _verl("gdpo")(**kw)[0])


def test_grpo_with_masks_is_masked_grpo_bit_for_bit():
    """verl's GRPO + the exclusion == the recipe's masked_grpo: masked rows 0, masked rows out of the mean/std, a
    group masking left with one valid sample 0 (groups u0: 1 masked, u1: 3 masked, u2: 2 masked)."""
    rewards, mask, index = _batch([1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0], masked=(2, 5, 6, 7, 9, 10))
    grpo = exclude_masked(_verl("grpo"))
    for norm in (True, False):
        ours = grpo(token_level_rewards=rewards, response_mask=mask, index=index, norm_adv_by_std_in_grpo=norm)[0]
        reference = compute_masked_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)[0]
        assert torch.equal(ours, reference), (ours, reference)
    assert ours[4:8].abs().sum() == 0  # u1: one valid sample left, no baseline
    assert (ours[[2, 9, 10]] == 0).all()  # masked rows
    positional = grpo(rewards, mask, index)[0]  # verl's positional order works too
    assert torch.equal(positional, compute_masked_grpo_outcome_advantage(rewards, mask, index)[0])


def test_a_group_small_before_masking_keeps_verls_behaviour():
    rewards, mask, index = _batch([1, 0, 1, 0.5], masked=(1,), n=1)  # groups of one; u1 fully masked
    adv = exclude_masked(_verl("grpo"))(token_level_rewards=rewards, response_mask=mask, index=index)[0]
    ref = _verl("grpo")(token_level_rewards=rewards, response_mask=mask, index=index)[0]
    assert torch.equal(adv[[0, 2, 3]], ref[[0, 2, 3]]) and adv[1].abs().sum() == 0


def test_gdpo_masked_sample_components_change_nothing():
    """GDPO (legacy trainer's call): each component's group baseline and the batch whitening exclude masked rows; a
    masked sample whose components differ changes nothing, while verl's plain GDPO lets it move the others."""
    rewards, mask, index = _batch([2, 1, 3, 0, 1, 2, 0, 3], masked=(3,))
    comps = {"correctness": np.array([1, 0, 1, 0, 1, 1, 0, 1.0]), "format": np.array([1, 1, 1, 0, 0, 1, 0, 1.0])}
    keys = ["correctness", "format"]
    gdpo = exclude_masked(_verl("gdpo"))
    a = gdpo(**_gdpo_kwargs(rewards, mask, index, comps, keys))[0]
    changed = {k: v.copy() for k, v in comps.items()}
    changed["correctness"][3] = 1.0
    changed["format"][3] = 1.0
    b = gdpo(**_gdpo_kwargs(rewards, mask, index, changed, keys))[0]
    assert torch.equal(a, b) and a[3].abs().sum() == 0
    plain_a = _verl("gdpo")(**_gdpo_kwargs(rewards, mask, index, comps, keys))[0]
    plain_b = _verl("gdpo")(**_gdpo_kwargs(rewards, mask, index, changed, keys))[0]
    assert not torch.allclose(plain_a[:3], plain_b[:3])  # verl's own GDPO: the masked sample moves its group


def test_gdpo_differs_from_grpo_on_equal_sums_of_different_composition():
    """Two groups with the same reward sums per sample (1, 1, 0, 2) but different compositions: GRPO sees only the
    sums and gives both groups the same advantages; GDPO normalises each component in its group, so the groups get
    different advantages. Drop the components (GDPO falls back to the summed reward) and the difference is gone."""
    sums = [1, 1, 0, 2, 1, 1, 0, 2]
    rewards, mask, index = _batch(sums)
    comps = {  # u0: sample 0 is correct but badly formatted, sample 1 the reverse; u1: both 1s come from format
        "correctness": np.array([1, 0, 0, 1, 0, 0, 0, 1.0]),
        "format": np.array([0, 1, 0, 1, 1, 1, 0, 1.0]),
    }
    keys = ["correctness", "format"]
    gdpo = exclude_masked(_verl("gdpo"))
    with_components = gdpo(**_gdpo_kwargs(rewards, mask, index, comps, keys))[0][:, 0]
    grpo = exclude_masked(_verl("grpo"))(token_level_rewards=rewards, response_mask=mask, index=index)[0][:, 0]
    assert torch.equal(grpo[:4], grpo[4:])  # GRPO: equal sums, equal advantages
    assert not torch.allclose(with_components[:4], with_components[4:], atol=1e-3)
    # dropped components: verl's GDPO without its inputs sums first, as GRPO does (up to its batch whitening)
    kw = _gdpo_kwargs(rewards, mask, index, comps, keys)
    del kw["non_tensor_batch"]
    dropped = gdpo(**kw)[0][:, 0]
    assert torch.allclose(dropped[:4], dropped[4:])


def test_install_wraps_verls_registry_once(installed):
    core_algos = installed
    assert masked_estimators.installed()
    before = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    direct = core_algos.compute_grpo_outcome_advantage
    assert masked_estimators.install() is None  # the sentinel: nothing wrapped twice
    assert core_algos.ADV_ESTIMATOR_REGISTRY == before and core_algos.compute_grpo_outcome_advantage is direct
    for name in MASKABLE_ESTIMATORS:
        assert getattr(core_algos.ADV_ESTIMATOR_REGISTRY[name], "__ngv_exclude_masked__", False), name
    assert getattr(direct, "__ngv_exclude_masked__", False)
    assert core_algos.get_adv_estimator_fn("masked_grpo") is compute_masked_grpo_outcome_advantage  # unchanged
    assert core_algos.ADV_ESTIMATOR_REGISTRY["gae"].__name__ == "compute_gae_advantage_return"  # not wrapped


def test_installed_grpo_through_verls_compute_advantage_excludes_masked_rows(installed):
    """The legacy trainer's path (ray_trainer.compute_advantage: grpo via the module attribute, gdpo via the
    registry with non_tensor_batch/batch) after install()."""
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    rewards, mask, index = _batch([1, 0, 1, 1, 0, 0, 1, 0], masked=(2, 7))
    comps = {"correctness": np.array([1, 0, 1, 1, 0, 0, 1, 0.0]), "format": np.zeros(8)}
    kw = _gdpo_kwargs(rewards, mask, index, comps, ["correctness"])
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask, **kw["batch"]},
        non_tensors={"uid": index, **comps},
    )
    out = compute_advantage(data, "grpo", norm_adv_by_std_in_grpo=True).batch["advantages"]
    assert torch.equal(out, compute_masked_grpo_outcome_advantage(rewards, mask, index)[0])
    gd = compute_advantage(data, "gdpo", config=kw["config"]).batch["advantages"]
    assert gd[[2, 7]].abs().sum() == 0 and gd[[0, 1, 3, 4, 5, 6]].abs().sum() > 0


def test_the_fixture_left_verl_as_it_was():
    from verl.trainer.ppo import core_algos

    assert not masked_estimators.installed()
    assert not getattr(core_algos.ADV_ESTIMATOR_REGISTRY["grpo"], "__ngv_exclude_masked__", False)
