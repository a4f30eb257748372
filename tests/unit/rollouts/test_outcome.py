"""Unit tests of the rollout client's outcome → trajectories (``nemo_gym_adapter.rollouts.outcome``): failures masked
with their counted reason, results parsed once and handed on, unparseable ones masked naming the JSON path."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.rollouts.gym_errors import gym_error_origin
from nemo_gym_adapter.rollouts.outcome import trajectory_from_outcome
from nemo_gym_adapter.rollouts.padding import pad_trajectories
from nemo_gym_adapter.rollouts.trajectory import MaskReason, TrajectoryConfig
from nemo_gym_adapter.wire.payloads import parse_run_result
from tests.support.gym_results import (
    CFG,
    G0,
    P0,
    PAD,
    FakeFailure,
    FakeOutcome,
    handmade_multiturn,
)


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
    from nemo_gym_adapter.rollouts.client import RolloutFailure, RolloutOutcome

    ok = RolloutOutcome(0, "env_a", "env_a_server", 2.5, 1, result=handmade_multiturn(P0, [G0], []))
    failed = RolloutOutcome(1, "env_a", "env_a_server", 900.0, 1, failure=RolloutFailure("timeout", "900 s", None))
    unsent = RolloutOutcome(2, None, None, 0.0, 0, failure=RolloutFailure("unknown_agent", "no such agent"))
    trajs = [trajectory_from_outcome(o, env_name="env_a", config=CFG) for o in (ok, failed, unsent)]
    batch = pad_trajectories(
        trajs, prompt_length=CFG.prompt_length, response_length=CFG.response_length, pad_token_id=PAD
    )
    assert [t.masked_reason for t in trajs] == [None, MaskReason.TIMEOUT, MaskReason.UNROUTABLE]
    assert [t.latency_s for t in trajs] == [2.5, 900.0, None]  # never sent: no latency rather than 0 s
    assert batch.tensors["response_mask"].sum(-1).tolist() == [2, 0, 0]


def test_invalid_result_is_masked_with_json_path():
    bad = handmade_multiturn(P0, [G0], [])
    bad["response"]["output"][0]["generation_log_probs"] = ["x"]  # not a number (a short list: missing_log_probs)
    t = trajectory_from_outcome(FakeOutcome(3, 1.0, result=bad), env_name="e", config=CFG)
    assert t.masked_reason is MaskReason.INVALID_RESULT
    assert "row 3" in t.detail and "response.output[0]" in t.detail


@pytest.mark.parametrize("field", ["prompt_token_ids", "generation_token_ids"])
def test_id_beyond_int64_is_masked_not_raised(field):
    """StrictInt accepts any Python int; one that int64 cannot hold masks its row (it used to raise OverflowError
    out of the step)."""
    bad = handmade_multiturn(P0, [G0], [])
    bad["response"]["output"][0][field] = [*bad["response"]["output"][0][field][:-1], 2**70]
    t = trajectory_from_outcome(FakeOutcome(5, 1.0, result=bad), env_name="e", config=CFG)
    assert t.masked_reason is MaskReason.INVALID_RESULT and t.failure_kind == "client:invalid_result"
    assert "row 5" in t.detail and f"response.output[0].{field}[" in t.detail and str(2**70) in t.detail


def test_outcome_without_result_or_failure_is_an_error():
    with pytest.raises(Exception, match="neither a result nor a failure"):
        trajectory_from_outcome(FakeOutcome(0, 0.0), env_name="e", config=CFG)


def test_a_500_from_the_environments_code_is_a_verifier_error_and_stays_masked_under_reward0():
    inner = "Hit an exception in SimpleAgent___a calling an inner server: ValueError('unparseable action')"
    failure = FakeFailure("http_500", f"row 0: env (url) answered 500: {inner}", 500, gym_error_origin(inner))
    outcome = FakeOutcome(0, 1.0, failure=failure)
    policy = TrajectoryConfig(prompt_length=64, response_length=64, verifier_errors={"_default": "reward0"})
    t = trajectory_from_outcome(outcome, env_name="env_a", config=policy)
    assert t.masked_reason is MaskReason.VERIFIER_ERROR  # no tokens came back: nothing to train on
    plain = FakeOutcome(0, 1.0, failure=FakeFailure("http_502", "row 0: proxy answered 502: bad gateway", 502))
    assert trajectory_from_outcome(plain, env_name="env_a", config=policy).masked_reason is MaskReason.REQUEST_FAILED
    # recorded from asr_with_pc (audio rows, a text-only model): the model backend refused, not the environment
    model = (
        "Hit an exception in SimpleAgent___asr_with_pc_simple_agent calling an inner server: b'\\\"Hit an exception "
        'in VLLMModel___policy_model calling an inner server: b\\\'{\\"error\\": \\"tiny is not a multimodal model\\"}'
    )
    assert gym_error_origin(model) == "model" and gym_error_origin("plain text") is None


def test_a_split_rollout_is_parsed_once_and_each_segment_built_from_that_parse(monkeypatch):
    """``contiguity: split``: the ``/run`` JSON is parsed once per row, and the parsed result handed on to the
    segments (it used to be parsed a second time after the whole rollout was found non-contiguous)."""
    from nemo_gym_adapter.rollouts import outcome as module
    from tests.unit.rollouts.test_segments import reflection_rollout

    parses = []

    def counting(payload, **kwargs):
        parses.append(kwargs.get("where"))
        return parse_run_result(payload, **kwargs)

    monkeypatch.setattr(module, "parse_run_result", counting)
    split = TrajectoryConfig(prompt_length=4096, response_length=4096, contiguity="split")
    samples = module.trajectories_from_outcome(
        FakeOutcome(4, 1.0, result=reflection_rollout()), env_name="e", config=split
    )
    assert len(samples) == 3 and not any(t.masked for t in samples)  # control: it really split
    assert [(t.segment, t.row_index, t.latency_s) for t in samples] == [(0, 4, 1.0), (1, 4, 1.0), (2, 4, 1.0)]
    assert parses == ["row 4: /run result"]
    (whole,) = module.trajectories_from_outcome(
        FakeOutcome(4, 1.0, result=reflection_rollout()), env_name="e", config=CFG
    )
    assert whole.masked_reason is MaskReason.NON_CONTIGUOUS and len(parses) == 2  # mask: one sample, one parse
