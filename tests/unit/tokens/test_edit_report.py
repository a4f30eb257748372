"""``tokens.edit_report``: a refused history names the edited message and shows both texts (through the hook's
splice on the hand-built layout of ``test_history_check``)."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.edit_report import Divergence, edit_error
from nemo_gym_adapter.tokens.model_turns import ModelTurn, TurnHistory
from nemo_gym_adapter.tokens.stops import Stops
from tests.unit.tokens.test_history_check import edited, rollout, synthetic
from tests.unit.tokens.test_splice import END


def test_error_shows_both_texts_around_the_difference():
    messages = rollout()
    with pytest.raises(TokenAlignmentError) as info:
        synthetic(edited(messages, 3, [103, 555]))
    text = str(info.value)
    assert "'t6 t4 t101 t102" in text  # decoded context before the difference (the user turn)
    assert "| 't2 t4" in text and "| 't555 t2" in text  # model: the tool turn ends; render: the edit


def test_without_a_decoder_the_nth_unit_names_the_nth_message_and_ids_are_shown():
    model = Stops.of([1, 5, END, 1, 6, END], {END})
    rendered = Stops.of([1, 5, END, 1, 7, END], {END})
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    history = TurnHistory((ModelTurn(2, 6, []),), messages=messages)
    text = edit_error(Divergence(4, 4, (0, 2), 0), model, rendered, history, None)
    assert text.startswith("messages[1] (user) differs from what the model saw")
    assert "ids [1, 5, 2, 1] | [6, 2]" in text and "ids [1, 5, 2, 1] | [7, 2]" in text
