"""The rollout-vs-actor log-prob gap, overall and per environment when a batch mixes environments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from recipe.nemo_gym.algorithms.onpolicy_gap import logprob_gap_by_env, logprob_gap_by_turn


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


def test_first_and_later_turns_get_their_own_gap_and_never_generated_tokens_stay_out():
    # row 0: turn 1 (2 tokens, exact), a tool token (0), turn 2 (2 tokens, 0.5 off); row 1: turn 1 exact, turn 2
    # with one token the model never generated (-2: its rollout log-prob is a stand-in 0, actor -3)
    turns = torch.tensor([[1, 1, 0, 2, 2], [1, 0, 2, -2, 0]])
    mask = (turns != 0).long()
    old = torch.tensor([[-1.0, -1.0, 0.0, -1.5, -1.5], [-1.0, 0.0, -2.0, -3.0, 0.0]])
    rollout = torch.tensor([[-1.0, -1.0, 0.0, -1.0, -1.0], [-1.0, 0.0, -2.0, 0.0, 0.0]])
    m = logprob_gap_by_turn(old, rollout, mask, turns)
    assert m["onpolicy/first_turn/logprob_abs_diff_mean"] == 0.0 and m["onpolicy/first_turn/num_tokens"] == 3
    assert m["onpolicy/later_turns/logprob_abs_diff_mean"] == pytest.approx(1.0 / 3)
    assert m["onpolicy/later_turns/num_tokens"] == 3 and m["onpolicy/never_generated_rate"] == pytest.approx(1 / 7)
    whole = logprob_gap_by_env(old, rollout, mask, token_turns=turns)
    assert whole["onpolicy/num_tokens"] == 6  # the never-generated token is not in the overall gap either
    assert whole["onpolicy/logprob_abs_diff_max"] == pytest.approx(0.5)
    # the control: without token_turns it would be counted (its stand-in rollout log-prob 0 against the actor's -3)
    assert logprob_gap_by_env(old, rollout, mask)["onpolicy/logprob_abs_diff_max"] == pytest.approx(3.0)


def test_a_batch_without_later_turns_reports_nan_for_them_not_zero():
    turns = torch.tensor([[1, 1, 0]])
    m = logprob_gap_by_turn(torch.zeros(1, 3), torch.zeros(1, 3), (turns != 0).long(), turns)
    assert np.isnan(m["onpolicy/later_turns/logprob_abs_diff_mean"]) and m["onpolicy/later_turns/num_tokens"] == 0
    assert m["onpolicy/never_generated_rate"] == 0.0
