"""row_echo: a result is another row's answer only when both signs show in what it echoes."""

from __future__ import annotations

from nemo_gym_adapter.rollouts.row_echo import other_row_fields


def test_a_result_is_for_another_row_only_when_the_user_words_and_a_verifier_field_both_differ():
    """Both signs or none: an agent that returns the conversation it built (the task kept), a server that normalises
    its expected answer (mcqa), a coerced type, Gym's ``_ng`` ids, a field the result lacks: no evidence alone."""
    row = {
        "responses_create_params": {"input": [{"role": "user", "content": [{"type": "input_text", "text": "Q1?"}]}]},
        "agent_ref": {"name": "a"},
        "expected_answer": "b",
        "id": 7,
        "strict": True,
        "options": ["A", "B"],
        "_ng_task_index": 1,
        "score": "1",
    }
    rebuilt = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Task: Q1? Go."}]
    mine = {**row, "responses_create_params": {"input": rebuilt}, "reward": 1.0}
    same_task = {**mine, "expected_answer": " B ", "score": 1, "_ng_task_index": 2, "options": ["C"], "id": 8}
    assert other_row_fields(row, same_task) == []  # the user's words are there: this row's, whatever else changed
    theirs = {**row, "responses_create_params": {"input": "Q2?"}, "reward": 0.0}
    assert other_row_fields(row, {**theirs, "expected_answer": "B", "id": 7.0}) == []  # different words, same fields
    assert other_row_fields(row, {"reward": 1.0}) == []  # echoes nothing: cannot tell
    wrong = {**theirs, "expected_answer": "C", "id": 8.0, "strict": False}
    assert other_row_fields(row, wrong) == [
        'expected_answer: sent "b", result has "C"',
        "id: sent 7, result has 8.0",
        "strict: sent true, result has false",
    ]
