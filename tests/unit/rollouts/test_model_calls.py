"""The model calls of a ``/run`` output as a token history (``nemo_gym_adapter.rollouts.model_calls``), on hand-made results
(``tests/support/gym_results.py``): directly, and as the trajectory a row becomes (``trajectory.build_trajectory``).
"""

from __future__ import annotations

from nemo_gym_adapter.rollouts.model_calls import calls_without_ids, contiguous_prefix
from nemo_gym_adapter.rollouts.trajectory import MaskReason
from nemo_gym_adapter.wire.payloads import parse_run_result
from tests.support.gym_results import E0, G0, G1, P0, build, handmade_message, handmade_multiturn, handmade_result


def test_items_before_the_id_item_of_a_call_are_not_calls_without_ids():
    # reasoning + message + function_call(ids): one call; nothing is reported missing.
    payload = handmade_multiturn(P0, [G0, G1], [E0], reasoning=True)
    assert calls_without_ids(parse_run_result(payload).response.output) == []
    t = build(payload)
    assert not t.masked and t.num_turns == 2


def test_a_message_without_ids_is_reported_where_its_call_ends():
    output = parse_run_result(handmade_result([handmade_message("no ids")])).response.output
    assert calls_without_ids(output) == [0]


def test_prompt_shorter_than_history_is_non_contiguous():
    payload = handmade_multiturn(P0, [G0, G1], [E0])
    payload["response"]["output"][3]["prompt_token_ids"] = P0 + G0[:1]  # edited / summarised history
    calls = parse_run_result(payload).model_calls()
    n_ok, detail = contiguous_prefix(calls, "row 3")
    assert n_ok == 1 and detail.startswith("row 3: model call 1 is not contiguous")
    t = build(payload)
    assert t.masked_reason is MaskReason.NON_CONTIGUOUS and "<end of prompt>" in t.detail
