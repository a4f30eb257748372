"""The rollout-vs-actor log-prob gap, overall and per environment when a batch mixes environments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recipe.nemo_gym.trainer.task_runner import logprob_gap_by_env


def test_each_environment_gets_its_own_gap_next_to_the_overall_one():
    old = torch.zeros(3, 2)
    rollout = torch.tensor([[0.0, 0.0], [-2.0, -2.0], [-2.0, 0.0]])  # env b's rollout log-probs are renormalised
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]])
    envs = np.array(["a", "b", "b"], dtype=object)
    m = logprob_gap_by_env(old, rollout, mask, envs)
    assert m["onpolicy/a/logprob_abs_diff_mean"] == 0.0 and m["onpolicy/a/num_tokens"] == 2
    assert m["onpolicy/b/logprob_abs_diff_mean"] == pytest.approx(2.0) and m["onpolicy/b/num_tokens"] == 3
    assert m["onpolicy/logprob_abs_diff_mean"] == pytest.approx(6 / 5)


def test_one_environment_or_none_gives_the_overall_gap_only():
    old, rollout, mask = torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2)
    for envs in (None, np.array(["a", "a"], dtype=object)):
        assert sorted(logprob_gap_by_env(old, rollout, mask, envs)) == [
            "onpolicy/kl_k1",
            "onpolicy/kl_k3",
            "onpolicy/logprob_abs_diff_max",
            "onpolicy/logprob_abs_diff_mean",
            "onpolicy/num_tokens",
        ]
