"""Unit tests of trajectory → verl's unpadded per-sample tensors (``nemo_gym_adapter.rollouts.samples``): the v1 layout carries
exactly what the legacy padded batch carries for the same trajectories (``nemo_gym_adapter.rollouts.padding``)."""

from __future__ import annotations

import pytest
import torch

from nemo_gym_adapter.rollouts.padding import pad_trajectories
from nemo_gym_adapter.rollouts.samples import sample_tensors
from tests.support.gym_results import PAD
from tests.unit.rollouts.test_padding import _random_batch


@pytest.mark.parametrize("seed", range(4))
def test_unpadded_samples_are_the_padded_rows_without_padding(seed):
    trajs, cfg = _random_batch(seed)
    P, R = cfg.prompt_length, cfg.response_length
    padded = pad_trajectories(trajs, prompt_length=P, response_length=R, pad_token_id=PAD).tensors
    for i, t in enumerate(trajs):
        s = sample_tensors(t, pad_token_id=PAD)
        p, r = s.prompt_len, s.response_len
        assert s.seq_len == p + r
        assert torch.equal(s.tensors["prompts"], padded["prompts"][i, P - p :])
        for key in ("responses", "response_mask", "rollout_log_probs", "rm_scores"):
            assert torch.equal(s.tensors[key], padded[key][i, :r]), (i, key)
            assert not padded[key][i, r:].any() or key == "responses", (i, key)  # nothing lost beyond the row
        assert torch.equal(s.tensors["loss_mask"], s.tensors["response_mask"])
        assert torch.equal(s.tensors["input_ids"], torch.cat([s.tensors["prompts"], s.tensors["responses"]]))
        assert s.tensors["position_ids"].tolist() == list(range(p + r))
        assert all(v.dim() == 1 for v in s.tensors.values())
        assert s.tensors["prompts"].dtype == s.tensors["response_mask"].dtype == torch.int64
        assert s.tensors["rollout_log_probs"].dtype == s.tensors["rm_scores"].dtype == torch.float32


def test_masked_sample_is_one_untrained_pad_token_with_no_reward():
    trajs, _ = _random_batch(11, n=64)
    masked = [t for t in trajs if t.masked]
    assert masked
    for t in masked:
        s = sample_tensors(t, pad_token_id=PAD)
        assert s.tensors["responses"].tolist() == [PAD]
        assert s.tensors["response_mask"].sum() == 0 and s.tensors["rm_scores"].abs().sum() == 0
    for t in (t for t in trajs if not t.masked):
        assert sample_tensors(t, pad_token_id=PAD).tensors["response_mask"].sum() >= 1


def test_position_ids_match_verl_for_an_all_ones_mask():
    from verl.utils.model import compute_position_id_with_mask

    trajs, _ = _random_batch(5)
    s = sample_tensors(trajs[0], pad_token_id=PAD)
    ones = torch.ones_like(s.tensors["input_ids"]).unsqueeze(0)
    assert torch.equal(compute_position_id_with_mask(ones).squeeze(0), s.tensors["position_ids"])
