"""Forced tokens (``nemo_gym.trajectory.forced_token_min_logprob``): sampled tokens with rollout log-prob ~0 are left
out of the loss on both trainers' layouts, everything else about the sample unchanged."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.rollouts.forced import forced_tokens, sampled_positions
from nemo_gym_adapter.rollouts.metrics import compute_metrics
from nemo_gym_adapter.rollouts.padding import pad_trajectories
from nemo_gym_adapter.rollouts.samples import sample_tensors
from nemo_gym_adapter.rollouts.trajectory import TrajectoryConfig
from tests.support.gym_results import CFG, E0, G0, G1, P0, PAD, build, handmade_multiturn

FORCED = dataclasses.replace(CFG, forced_token_min_logprob=-1e-4)


def _with_log_probs(payload: dict, per_call: list[list[float]]) -> dict:
    calls = [item for item in payload["response"]["output"] if "generation_log_probs" in item]
    assert len(calls) == len(per_call)
    for item, lps in zip(calls, per_call, strict=True):
        assert len(lps) == len(item["generation_token_ids"])
        item["generation_log_probs"] = lps
    return payload


def test_forced_tokens_rule():
    lps = np.array([-0.0, -2.0, -0.00001, -0.5], dtype=np.float32)
    assert forced_tokens(lps, None) is None  # off
    assert forced_tokens(lps, -1e-4).tolist() == [True, False, True, False]
    assert forced_tokens(np.array([-1.0, -2.0]), -1e-4) is None  # nothing forced
    assert forced_tokens(np.array([0.0, -0.0]), -1e-4) is None  # everything forced: trained as before
    assert sampled_positions(((0, 2), (5, 8))).tolist() == [0, 1, 5, 6, 7]


def test_forced_tokens_leave_the_loss_mask_on_both_layouts_and_nothing_else_changes():
    # call 0 generates G0 (2 tokens), call 1 G1 (3 tokens); the first token of call 0 and the last of call 1 forced
    payload = _with_log_probs(handmade_multiturn(P0, [G0, G1], [E0]), [[0.0, -1.5], [-0.7, -0.2, -0.00001]])
    plain, forced = build(payload), build(payload, FORCED)
    assert plain.forced is None and forced.num_forced == 2
    assert forced.num_generated == plain.num_generated == len(G0) + len(G1)
    assert forced.sampled_spans == plain.sampled_spans and forced.reward == plain.reward and not forced.masked
    # response = G0 + E0 + G1: sampled positions 0-1 and 5-7
    expected = plain.response_mask().copy()
    expected[[0, 7]] = 0
    v1 = sample_tensors(forced, pad_token_id=PAD).tensors
    assert v1["response_mask"].tolist() == expected.tolist()
    assert (
        v1["rollout_log_probs"].tolist()
        == sample_tensors(plain, pad_token_id=PAD).tensors["rollout_log_probs"].tolist()
    )
    legacy = pad_trajectories([forced, plain], prompt_length=8, response_length=16, pad_token_id=PAD).tensors
    assert legacy["response_mask"][0, : len(expected)].tolist() == expected.tolist()
    assert legacy["response_mask"][1, : len(expected)].tolist() == plain.response_mask().tolist()  # rule per config
    metrics = compute_metrics([forced, plain])
    assert metrics["gym/env_a/forced_token_rate"] == pytest.approx(2 / 10)


def test_a_sample_whose_every_token_was_forced_keeps_them():
    """An all-zero loss mask would read as a masked sample to the advantage estimator (its outcome out of the
    group's baseline); a forced-only sample trains as before."""
    payload = _with_log_probs(handmade_multiturn(P0, [G0], []), [[0.0, -0.00002]])
    t = build(payload, FORCED)
    assert t.forced is None and sample_tensors(t, pad_token_id=PAD).tensors["response_mask"].sum() == len(G0)


def test_the_threshold_is_a_log_prob():
    with pytest.raises(AdapterConfigError, match=r"forced_token_min_logprob=0.5"):
        TrajectoryConfig(prompt_length=8, response_length=8, forced_token_min_logprob=0.5)
