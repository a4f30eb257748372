"""masked_grpo over sessions (issue 19 item 6): a rollout split into several samples (``{uid}_{session}_{i}``) counts
once in its GRPO group, through verl's own v1 dispatch (``compute_advantage_for_multi_trajectories``), and the v1
trainer mixin hands the batch keys to the estimator."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from omegaconf import OmegaConf

from recipe.nemo_gym.algorithms import masked_grpo
from recipe.nemo_gym.algorithms.masked_grpo import (
    MASKED_GRPO,
    SESSION_KEYS,
    compute_masked_grpo_outcome_advantage,
    session_rows,
)
from recipe.nemo_gym.trainer.task_runner_v1 import NemoGymTrainerMixin

# prompt u: session 0 split in 3 samples (reward 1), session 1 one sample (0.5), session 2 one masked sample,
# session 3 split in 2 whose last segment is masked (reward 0); prompt w: two one-sample sessions.
KEYS = ["u_0_0", "u_0_1", "u_0_2", "u_1_0", "u_2_0", "u_3_0", "u_3_1", "w_0_0", "w_1_0"]
REWARDS = [1.0, 1.0, 1.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.0]
MASK = torch.tensor(
    [[1, 1, 0], [0, 1, 1], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0]],
    dtype=torch.float32,
)
UIDS = np.array([k.split("_")[0] for k in KEYS], dtype=object)


def rewards() -> torch.Tensor:
    out = torch.zeros(len(KEYS), 3)
    out[:, -1] = torch.tensor(REWARDS)
    return out


def test_session_rows_pick_the_last_valid_sample():
    valid = (MASK.sum(-1) > 0).tolist()
    session_of, reps = session_rows(KEYS, valid)
    assert session_of == [0, 0, 0, 1, 2, 3, 3, 4, 5]
    assert reps == [2, 3, 4, 5, 7, 8]  # session 3: its last *valid* sample; session 2: its only (masked) one
    assert session_rows(["a_0_0", "a_1_0"], [True, True]) is None  # one row per session: nothing to do


def test_a_split_rollout_counts_once_and_shares_its_advantage():
    one_per_session = [2, 3, 4, 5, 7, 8]
    reference, _ = compute_masked_grpo_outcome_advantage(
        rewards()[one_per_session], MASK[one_per_session], UIDS[one_per_session]
    )
    token = SESSION_KEYS.set(KEYS)
    try:
        adv, returns = compute_masked_grpo_outcome_advantage(rewards(), MASK, UIDS)
    finally:
        SESSION_KEYS.reset(token)
    scalar = [reference[k][MASK[r].argmax()].item() for k, r in enumerate(one_per_session)]
    session_of = [0, 0, 0, 1, 2, 3, 3, 4, 5]
    for row, s in enumerate(session_of):
        torch.testing.assert_close(adv[row], scalar[s] * MASK[row])
    assert scalar[0] > scalar[1] == 0.0 > scalar[3] and scalar[2] == 0.0 and scalar[4] == -scalar[5] != 0
    assert torch.equal(adv, returns)
    # the control: without the keys every sample is a group member, and the split rollout weighs three times
    plain, _ = compute_masked_grpo_outcome_advantage(rewards(), MASK, UIDS)
    assert not torch.allclose(plain, adv)


def test_through_verls_v1_dispatch():
    from verl import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards(), "response_mask": MASK}, non_tensors={"uid": UIDS}
    )
    algo = OmegaConf.create({"adv_estimator": MASKED_GRPO, "norm_adv_by_std_in_grpo": True, "gamma": 1.0})
    token = SESSION_KEYS.set(KEYS)
    try:
        out = compute_advantage_for_multi_trajectories(data, KEYS, MASKED_GRPO, config=algo)
        expected, _ = compute_masked_grpo_outcome_advantage(rewards(), MASK, UIDS)
    finally:
        SESSION_KEYS.reset(token)
    torch.testing.assert_close(out.batch["advantages"], expected)


def test_the_v1_trainer_mixin_hands_the_batch_keys_to_the_estimator():
    seen = []

    class Base:
        config = SimpleNamespace(algorithm=SimpleNamespace(adv_estimator=MASKED_GRPO))  # verl's trainers have one

        def _compute_advantage(self, batch, metrics):
            seen.append(masked_grpo.SESSION_KEYS.get())
            return batch

    class Trainer(NemoGymTrainerMixin, Base):
        pass

    batch = SimpleNamespace(keys=KEYS)
    assert Trainer()._compute_advantage(batch, metrics={}) is batch
    assert seen == [KEYS] and SESSION_KEYS.get() is None
