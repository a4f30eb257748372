"""Masked-GRPO estimator: masked samples leave their group's statistics; tiny groups get no advantage.

References are independent: a per-group Python computation with ``statistics`` and, where the two must
agree, verl's own ``compute_grpo_outcome_advantage`` run on the valid rows only.
"""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from nemo_gym_adapter.errors import AdapterConfigError, AdapterError
from recipe.nemo_gym.algorithms import masked_grpo
from recipe.nemo_gym.algorithms.masked_grpo import MASKED_GRPO, compute_masked_grpo_outcome_advantage

RESP_LEN = 5


def _batch(rewards, masked, lengths=None):
    """Rows with the scalar reward on the last valid token; masked rows have an all-zero response mask."""
    n = len(rewards)
    lengths = lengths or [RESP_LEN - (i % 3) for i in range(n)]
    mask = torch.zeros(n, RESP_LEN)
    token_rewards = torch.zeros(n, RESP_LEN)
    for i, (r, m, length) in enumerate(zip(rewards, masked, lengths, strict=True)):
        token_rewards[i, length - 1] = r
        if not m:
            mask[i, :length] = 1
    return token_rewards, mask


def _reference(rewards, masked, uids, eps=1e-6, norm=True):
    """Per-sample scalar advantage: GRPO over the valid members of each group, 0 without a baseline."""
    out = []
    for i, uid in enumerate(uids):
        valid = [r for r, m, u in zip(rewards, masked, uids, strict=True) if u == uid and not m]
        if masked[i] or len(valid) < 2:
            out.append(0.0)
            continue
        centred = rewards[i] - statistics.mean(valid)
        out.append(centred / (statistics.stdev(valid) + eps) if norm else centred)
    return torch.tensor(out)


def _run(rewards, masked, uids, **kw):
    token_rewards, mask = _batch(rewards, masked)
    adv, ret = compute_masked_grpo_outcome_advantage(token_rewards, mask, np.array(uids, dtype=object), **kw)
    return adv, ret, mask


def test_masked_members_leave_group_statistics():
    rewards = [1.0, 0.0, 0.5, 0.0, 1.0, 0.0, 0.25, 0.75]
    masked = [False, True, False, False, True, False, False, False]
    uids = ["a", "a", "a", "a", "b", "b", "b", "b"]
    adv, ret, mask = _run(rewards, masked, uids)

    expected = _reference(rewards, masked, uids).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=1e-5)
    assert torch.equal(adv, ret)
    assert adv[1].abs().sum() == 0 and adv[4].abs().sum() == 0
    # Sanity: the masked fake-zero reward would have changed group "a"'s baseline.
    assert not torch.allclose(expected, _reference(rewards, [False] * 8, uids).unsqueeze(-1) * mask)


def test_masked_members_equal_verl_grpo_on_valid_rows():
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rewards = [1.0, 0.0, 0.5, 0.0, 1.0, 0.3, 0.25, 0.75, 0.0, 1.0]
    masked = [False, True, False, False, True, False, False, False, True, False]
    uids = ["a", "a", "a", "a", "b", "b", "b", "b", "c", "c"]
    for norm in (True, False):
        adv, _, mask = _run(rewards, masked, uids, norm_adv_by_std_in_grpo=norm)
        n_valid = {u: sum(1 for v, m in zip(uids, masked, strict=True) if v == u and not m) for u in uids}
        keep = [i for i, m in enumerate(masked) if not m and n_valid[uids[i]] >= 2]
        token_rewards, _ = _batch(rewards, masked)
        grpo, _ = compute_grpo_outcome_advantage(
            token_rewards[keep], mask[keep], np.array(uids, dtype=object)[keep], norm_adv_by_std_in_grpo=norm
        )
        torch.testing.assert_close(adv[keep], grpo, atol=1e-6, rtol=1e-5)
        others = [i for i in range(len(rewards)) if i not in keep]
        assert adv[others].abs().sum() == 0  # masked rows, and group "c" whose only valid member has no baseline


def test_all_masked_gives_zero():
    adv, _, _ = _run([1.0, 0.0, 1.0, 0.5], [True] * 4, ["a", "a", "b", "b"])
    assert adv.abs().sum() == 0


def test_groups_with_fewer_than_two_valid_samples_get_zero():
    rewards = [1.0, 0.7, 0.2, 0.9, 0.1]
    masked = [False, False, True, False, False]
    uids = ["solo", "pair", "pair", "x", "x"]  # "solo": size-1 group; "pair": one valid member left
    adv, _, mask = _run(rewards, masked, uids)
    assert adv[:3].abs().sum() == 0
    assert adv[3:].abs().sum() > 0
    torch.testing.assert_close(adv, _reference(rewards, masked, uids).unsqueeze(-1) * mask, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("norm", [True, False])
def test_equals_verl_grpo_when_nothing_is_masked(norm):
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(12, generator=gen).tolist()
    uids = [f"g{i // 4}" for i in range(12)]
    token_rewards, mask = _batch(rewards, [False] * 12)
    index = np.array(uids, dtype=object)
    ours, _ = compute_masked_grpo_outcome_advantage(token_rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    theirs, _ = compute_grpo_outcome_advantage(token_rewards, mask, index, norm_adv_by_std_in_grpo=norm)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-5)


def test_masked_rewards_do_not_matter():
    uids = ["a"] * 4 + ["b"] * 4
    masked = [False, True, False, False, False, False, True, True]
    adv1, _, _ = _run([1, 0, 0.5, 0, 1, 0, 0.2, 0.3], masked, uids)
    adv2, _, _ = _run([1, 9, 0.5, 0, 1, 0, -4, 7], masked, uids)
    torch.testing.assert_close(adv1, adv2)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        # Rewards on a quarter grid (like real 0/1/partial-credit rewards): exact in float32, so float32
        # and the float64 reference agree tightly; near-equal floats would only test cancellation error.
        st.tuples(st.integers(0, 3), st.booleans(), st.integers(-8, 8).map(lambda k: k / 4)),
        min_size=1,
        max_size=16,
    ),
    st.booleans(),
)
def test_matches_reference_on_random_batches(rows, norm):
    uids = [f"u{g}" for g, _, _ in rows]
    masked = [m for _, m, _ in rows]
    rewards = [r for _, _, r in rows]
    adv, _, mask = _run(rewards, masked, uids, norm_adv_by_std_in_grpo=norm)
    expected = _reference(rewards, masked, uids, norm=norm).unsqueeze(-1) * mask
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=1e-5)


def test_options_come_from_the_algorithm_config_unless_given():
    rewards, masked, uids = [1.0, 0.0, 0.5, 0.2], [False] * 4, ["a"] * 4
    unnormalised = _reference(rewards, masked, uids, norm=False)
    cfg = OmegaConf.create({"norm_adv_by_std_in_grpo": False})
    adv, _, _ = _run(rewards, masked, uids, config=cfg)
    torch.testing.assert_close(adv[:, 0], unnormalised, atol=1e-6, rtol=1e-5)
    adv, _, _ = _run(rewards, masked, uids, config=cfg, norm_adv_by_std_in_grpo=True)  # explicit wins
    torch.testing.assert_close(adv[:, 0], _reference(rewards, masked, uids), atol=1e-6, rtol=1e-5)

    big_eps = OmegaConf.create({"masked_grpo_epsilon": 10.0})
    adv, _, _ = _run(rewards, masked, uids, config=big_eps)
    torch.testing.assert_close(adv[:, 0], _reference(rewards, masked, uids, eps=10.0), atol=1e-6, rtol=1e-5)
    with pytest.raises(AdapterConfigError, match="algorithm.masked_grpo_epsilon"):
        _run(rewards, masked, uids, config=OmegaConf.create({"masked_grpo_epsilon": -1.0}))


def test_shape_mismatch_is_reported():
    with pytest.raises(AdapterError, match="index has 3 entries"):
        compute_masked_grpo_outcome_advantage(torch.zeros(2, 4), torch.ones(2, 4), np.array(["a", "b", "c"]))


def test_registered_and_called_by_verls_compute_advantage():
    """The legacy trainer's own dispatch (keyword names, config, uid) reaches our estimator."""
    from verl import DataProto
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.ray_trainer import compute_advantage

    assert get_adv_estimator_fn(MASKED_GRPO) is compute_masked_grpo_outcome_advantage
    rewards = [1.0, 0.0, 0.5, 0.0, 1.0, 0.0, 0.25, 0.75]
    masked = [False, True, False, False, True, False, False, False]
    uids = ["a"] * 4 + ["b"] * 4
    token_rewards, mask = _batch(rewards, masked)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": token_rewards, "response_mask": mask},
        non_tensors={"uid": np.array(uids, dtype=object)},
    )
    algo = OmegaConf.create({"adv_estimator": MASKED_GRPO, "norm_adv_by_std_in_grpo": False, "gamma": 1.0})
    out = compute_advantage(data, adv_estimator=algo.adv_estimator, norm_adv_by_std_in_grpo=True, config=algo)
    expected = _reference(rewards, masked, uids, norm=False).unsqueeze(-1) * mask  # config's flag is used
    torch.testing.assert_close(out.batch["advantages"], expected, atol=1e-6, rtol=1e-5)


def test_registration_is_idempotent_and_refuses_a_foreign_estimator(monkeypatch):
    from verl.trainer.ppo import core_algos

    masked_grpo.register()
    masked_grpo.register()
    assert core_algos.get_adv_estimator_fn(MASKED_GRPO) is compute_masked_grpo_outcome_advantage

    def other_estimator(**_):
        raise NotImplementedError

    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, MASKED_GRPO, other_estimator)
    with pytest.raises(AdapterError, match="already registered"):
        masked_grpo.register()
