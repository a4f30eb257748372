"""verl's v1 records on the manager's side (``recipe.nemo_gym.managers.tq_records``): a batch unpacked per prompt, a sample
written as verl's own agent loop writes it."""

from __future__ import annotations

import pytest
import torch

from nemo_gym_adapter.rollouts.outcome import trajectory_from_outcome
from nemo_gym_adapter.rollouts.trajectory import MaskReason
from recipe.nemo_gym.managers.tq_records import sample_record, split_prompts
from tests.support.gym_results import CFG, E0, G0, G1, P0, PAD, FakeFailure, FakeOutcome, handmade_multiturn


def test_sample_record_carries_verls_fields_and_tags():
    outcome = FakeOutcome(0, 0.1, result=handmade_multiturn(P0, [G0, G1], [E0], reward=1.0))
    t = trajectory_from_outcome(outcome, env_name="env_a", config=CFG)
    prompt = {"uid": "abc", "gym_row": {}, "gym_env": "env_a", "global_steps": 5, "raw_prompt": []}
    key, fields, tags = sample_record(prompt, 2, t, pad_token_id=PAD, versions=(4, 5))
    assert key == "abc_2_0"
    for name in ("prompts", "responses", "response_mask", "loss_mask", "rollout_log_probs", "rm_scores"):
        assert isinstance(fields[name], torch.Tensor) and fields[name].dim() == 1
    assert fields["input_ids"].tolist() == P0 + G0 + E0 + G1
    assert fields["rm_scores"][-1] == 1.0 and fields["num_turns"] == t.num_turns
    assert fields["extra_fields"]["min_global_steps"] == 4 and fields["extra_fields"]["max_global_steps"] == 5
    assert tags == {
        "status": "success",
        "prompt_len": 3,
        "response_len": len(G0 + E0 + G1),
        "seq_len": 3 + len(G0 + E0 + G1),
        "global_steps": 5,
        "min_global_steps": 4,
        "max_global_steps": 5,
    }
    failed = trajectory_from_outcome(FakeOutcome(0, 0.1, failure=FakeFailure("timeout", "x")), env_name="e", config=CFG)
    assert failed.masked_reason is MaskReason.TIMEOUT
    _, fields, tags = sample_record(prompt, 0, failed, pad_token_id=PAD, versions=(5, 5))
    assert fields["responses"].tolist() == [PAD] and fields["response_mask"].sum() == 0 and tags["response_len"] == 1


def test_split_prompts_unpacks_verls_batch_columns():
    from verl.utils import tensordict_utils as tu

    batch = tu.get_tensordict(
        {
            "dummy_tensor": torch.zeros(2, 1, dtype=torch.uint8),
            "uid": __import__("numpy").array(["a", "b"], dtype=object),
            "gym_row": __import__("numpy").array([{"x": 1}, {"x": 2}], dtype=object),
            "gym_env": __import__("numpy").array(["e1", "e2"], dtype=object),
        }
    )
    tu.assign_non_tensor_data(batch, "global_steps", 7)
    tu.assign_non_tensor_data(batch, "validate", True)
    rows = split_prompts(batch)
    assert [r["uid"] for r in rows] == ["a", "b"] and rows[1]["gym_row"] == {"x": 2}
    assert rows[0]["global_steps"] == 7 and "validate" not in rows[0]
    with pytest.raises(Exception, match="no 'gym_row'"):
        split_prompts(
            tu.get_tensordict(
                {"dummy_tensor": torch.zeros(1, 1), "uid": __import__("numpy").array(["a"], dtype=object)}
            )
        )
