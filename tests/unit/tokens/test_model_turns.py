"""``tokens.model_turns``: the structural check that the assistant messages' ids belong to one history (through the
hook's splice on the hand-built layout of ``test_history_check``)."""

from __future__ import annotations

import copy

import pytest

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.model_turns import ModelTurn, TurnHistory, check_structure
from tests.unit.tokens.test_history_check import rollout, synthetic
from tests.unit.tokens.test_splice import END


def test_generation_ids_not_where_the_prompt_puts_them_are_refused():
    messages = rollout()
    broken = copy.deepcopy(messages)
    broken[2]["generation_token_ids"] = [201, END]  # not what the later prompt holds at that position
    with pytest.raises(TokenAlignmentError, match=r"messages\[2\]\.generation_token_ids are not at position"):
        synthetic(broken)
    broken[2]["prompt_token_ids"] = broken[2]["prompt_token_ids"] * 3  # longer than the next turn's prompt
    with pytest.raises(TokenAlignmentError, match=r"messages\[2\]: its prompt_token_ids .* do not fit"):
        synthetic(broken)


def test_turns_in_place_pass_and_the_anchor_must_end_the_prefix():
    history = TurnHistory((ModelTurn(2, 3, [7, END]), ModelTurn(4, 8, [9, END])), spelled={2: 1, 4: 2})
    assert history.anchor.index == 4 and history.spelled_total == 3
    check_structure([1, 1, 1, 7, END, 5, 5, 5, 9, END], history)
    with pytest.raises(TokenAlignmentError, match="internal: the splice anchor is not the last turn"):
        check_structure([1, 1, 1, 7, END, 5, 5, 5, 9, END, 0], history)
