"""Unit tests of the splice on hand-built token lists (no model, no tokenizer).

A tiny ChatML-like layout written out by hand: every message renders as ``START role NL content... END NL`` and the
generation prompt as ``START ASSISTANT NL``. ``END`` is the template's terminator, ``EOS`` a second stop id (like
Qwen2.5's ``<|endoftext|>``). Assistant content as the template re-encodes it differs from the ids the model
generated, as it does with real tokenizers.
"""

from __future__ import annotations

import copy

import pytest

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.splice import (
    TurnTemplate,
    last_tokenized_assistant,
    messages_through,
    splice_prompt,
)

START, END, EOS, NL = 1, 2, 3, 4
ROLE = {"system": 5, "user": 6, "assistant": 7, "tool": 8}
TEMPLATE = TurnTemplate(terminator_id=END, stop_ids=frozenset({END, EOS}))


def render(messages: list[dict], add_generation_prompt: bool, strip_old_reasoning: bool = False) -> list[int]:
    """Hand-written template. ``content`` holds the ids the template writes; ``reasoning`` ids are written before
    the content, and dropped from assistant turns before the last user message when ``strip_old_reasoning`` (the
    Qwen3 behaviour that breaks position matching)."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    out: list[int] = []
    for i, m in enumerate(messages):
        body = list(m.get("content") or [])
        if m.get("reasoning") and not (strip_old_reasoning and i < last_user):
            body = [*m["reasoning"], *body]
        out += [START, ROLE[m["role"]], NL, *body, END, NL]
    if add_generation_prompt:
        out += [START, ROLE["assistant"], NL]
    return out


def splice(messages: list[dict], strip_old_reasoning: bool = False) -> list[int]:
    """What the vLLM hook does with these functions: the spliced prompt of a request."""
    found = last_tokenized_assistant(messages)
    assert found is not None
    k, model_prefix = found
    prefix = render(messages_through(messages, k), False, strip_old_reasoning)
    return splice_prompt(model_prefix, prefix, render(messages, True, strip_old_reasoning), TEMPLATE)


def assistant(prompt: list[int], generation: list[int], content: list[int], **extra) -> dict:
    return {
        "role": "assistant",
        "content": content,
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "generation_log_probs": [-0.5] * len(generation),
        **extra,
    }


SYSTEM = {"role": "system", "content": [100]}
USER = {"role": "user", "content": [101, 102]}
TOOL = {"role": "tool", "content": [103], "tool_call_id": "c1"}
TAIL = [START, ROLE["tool"], NL, 103, END, NL, START, ROLE["assistant"], NL]  # tool output + generation prompt


def first_prompt() -> list[int]:
    return render([SYSTEM, USER], True)


# ---------------------------------------------------------------------------------------------------------------------
# TurnTemplate


def test_turn_template_always_counts_its_terminator_as_a_stop_id():
    assert TurnTemplate(terminator_id=7).stop_ids == frozenset({7})
    assert TurnTemplate(terminator_id=7, stop_ids=frozenset({9})).stop_ids == frozenset({7, 9})


@pytest.mark.parametrize("bad", [-1, True, "2", None])
def test_turn_template_rejects_non_ids(bad):
    with pytest.raises(TokenAlignmentError):
        TurnTemplate(terminator_id=bad)
    with pytest.raises(TokenAlignmentError):
        TurnTemplate(terminator_id=2, stop_ids=frozenset({bad}))


# ---------------------------------------------------------------------------------------------------------------------
# last_tokenized_assistant / messages_through


def test_first_turn_without_ids_is_a_no_op():
    assert last_tokenized_assistant([SYSTEM, USER]) is None
    assert last_tokenized_assistant([]) is None
    # Assistant messages a client wrote itself (no ids) do not trigger a splice either.
    assert last_tokenized_assistant([USER, {"role": "assistant", "content": [9]}, USER]) is None
    # None values (pydantic dumps) count as absent.
    none_ids = {"role": "assistant", "content": [9], "prompt_token_ids": None, "generation_token_ids": None}
    assert last_tokenized_assistant([USER, none_ids]) is None


def test_picks_the_last_assistant_with_ids_and_skips_later_ones_without():
    a1 = assistant([1, 2], [10, END], [10])
    a2 = assistant([1, 2, 10, END, 5], [11, 12, EOS], [11])
    plain = {"role": "assistant", "content": [13]}
    messages = [USER, a1, TOOL, a2, TOOL, plain, USER]
    before = copy.deepcopy(messages)
    assert last_tokenized_assistant(messages) == (3, [1, 2, 10, END, 5, 11, 12, EOS])
    assert messages == before


def test_model_prefix_is_a_new_list():
    a = assistant([1, 2], [10], [10])
    _, prefix = last_tokenized_assistant([USER, a])
    prefix.append(99)
    assert a["prompt_token_ids"] == [1, 2] and a["generation_token_ids"] == [10]


def test_ids_on_non_assistant_messages_are_ignored():
    odd_user = {**USER, "prompt_token_ids": [1], "generation_token_ids": [2]}
    assert last_tokenized_assistant([odd_user]) is None


@pytest.mark.parametrize(
    ("prompt", "generation", "key", "fragment"),
    [
        ("1 2 3", [4], "prompt_token_ids", "list of token ids, got str"),
        ([1, 2], {"a": 1}, "generation_token_ids", "got dict"),
        ([1, "2"], [4], "prompt_token_ids[1]", "'2'"),
        ([1, 2], [4, 5.0], "generation_token_ids[1]", "5.0"),
        ([1, 2], [True], "generation_token_ids[0]", "True"),
        ([1, -2], [4], "prompt_token_ids[1]", "negative"),
        (None, [4], "prompt_token_ids", "got NoneType"),
        ([1, 2], None, "generation_token_ids", "got NoneType"),
        ([], [4], "prompt_token_ids", "empty"),
    ],
)
def test_malformed_ids_name_the_message_and_key(prompt, generation, key, fragment):
    bad = {"role": "assistant", "content": [9], "prompt_token_ids": prompt, "generation_token_ids": generation}
    with pytest.raises(TokenAlignmentError) as info:
        last_tokenized_assistant([USER, bad, USER])
    assert f"messages[1].{key}" in str(info.value)
    assert fragment in str(info.value)


def test_messages_through_checks_range_and_role():
    messages = [USER, assistant([1], [2], [2]), TOOL]
    assert messages_through(messages, 1) == messages[:2]
    for index in (-1, 3, 10):
        with pytest.raises(TokenAlignmentError, match="out of range for 3 messages"):
            messages_through(messages, index)
    with pytest.raises(TokenAlignmentError, match="role is 'tool'"):
        messages_through(messages, 2)


# ---------------------------------------------------------------------------------------------------------------------
# splice_prompt: the three endings


@pytest.mark.parametrize(
    ("ending", "expected_join"),
    [
        ([END], []),  # the template's own terminator: kept, nothing inserted
        ([EOS], []),  # another stop id (Qwen2.5 <|endoftext|>): kept as generated, never replaced
        ([], [END]),  # cut by length / stop string: the template's terminator is inserted
    ],
    ids=["terminator", "other-eos", "no-stop"],
)
def test_splice_keeps_the_model_tokens_and_appends_the_rendered_tail(ending, expected_join):
    prompt = first_prompt()
    generation = [200, 201, 202, *ending]  # the model's tokens; the template re-encodes the text as [250]
    messages = [SYSTEM, USER, assistant(prompt, generation, [250]), TOOL]
    naive = render(messages, True)
    assert naive[: len(prompt + generation)] != prompt + generation  # the control: re-rendering is off-policy
    assert splice(messages) == prompt + generation + expected_join + [NL, *TAIL]


def test_count_not_position_when_the_template_strips_old_reasoning():
    """Qwen3-style: reasoning of turns before the last user message disappears from the full render, so the
    terminator's position in the prefix render is not its position in the full render; its count is."""
    prompt = first_prompt()
    generation = [300, 301, 200, END]  # think tokens + answer
    messages = [SYSTEM, USER, assistant(prompt, generation, [200], reasoning=[300, 301]), USER]
    prefix = render(messages[:3], False, strip_old_reasoning=True)
    full = render(messages, True, strip_old_reasoning=True)
    tail = [START, ROLE["user"], NL, 101, 102, END, NL, START, ROLE["assistant"], NL]
    assert splice(messages, strip_old_reasoning=True) == prompt + generation + [NL, *tail]
    # A position-based splice (cut the full render where the prefix render ended) lands inside the tail.
    assert full[len(prefix) :] != [*tail]


def test_assistant_messages_without_ids_after_the_last_tokenized_one_are_rendered_tail():
    prompt = first_prompt()
    generation = [200, EOS]
    injected = {"role": "assistant", "content": [260, 261]}  # e.g. written by the agent, never generated
    messages = [SYSTEM, USER, assistant(prompt, generation, [250]), USER, injected, USER]
    tail = render([USER, injected, USER], True)
    assert splice(messages) == prompt + generation + [NL, *tail]


def test_multi_turn_chain_where_an_earlier_turn_ended_with_another_eos():
    """Turn 1 ends with EOS (kept), so the model prefix of turn 2 holds one terminator fewer than the re-rendered
    history; counting every stop id as a turn end keeps turn 3 aligned."""
    p1 = first_prompt()
    g1 = [200, 201, EOS]
    m = [SYSTEM, USER, assistant(p1, g1, [250]), TOOL]
    p2 = splice(m)
    g2 = [210, 211]  # cut by length
    m = [*m, assistant(p2, g2, [260]), TOOL]
    p3 = splice(m)
    g3 = [220, END]
    m = [*m, assistant(p3, g3, [270]), TOOL]
    p4 = splice(m)
    assert p2[: len(p1 + g1)] == p1 + g1
    assert p3[: len(p2 + g2)] == p2 + g2
    assert p4[: len(p3 + g3)] == p3 + g3
    assert p3[len(p2 + g2)] == END  # the length-cut turn got the template's terminator
    assert p4[-len(TAIL) - 1 :] == [NL, *TAIL]


def test_splice_accepts_tuples_and_never_mutates_its_inputs():
    prompt = first_prompt()
    generation = [200, END]
    messages = [SYSTEM, USER, assistant(prompt, generation, [250]), TOOL]
    prefix, full = render(messages[:3], False), render(messages, True)
    model_prefix = prompt + generation
    snapshot = (list(model_prefix), list(prefix), list(full))
    result = splice_prompt(model_prefix, prefix, full, TEMPLATE)
    assert (model_prefix, prefix, full) == snapshot
    assert result is not model_prefix and result is not full
    assert splice_prompt(tuple(model_prefix), tuple(prefix), tuple(full), TEMPLATE) == result


# ---------------------------------------------------------------------------------------------------------------------
# splice_prompt: consistency checks


def test_removed_message_is_detected():
    p1 = first_prompt()
    g1 = [200, END]
    m = [SYSTEM, USER, assistant(p1, g1, [250]), TOOL]
    p2 = splice(m)
    m = [*m, assistant(p2, [210, END], [260]), USER]
    edited = [m[0], m[1], m[4], m[5]]  # the agent dropped turn 1 and its tool output
    with pytest.raises(TokenAlignmentError) as info:
        splice(edited)
    text = str(info.value)
    assert "model prefix has 5 turns" in text and "has 3" in text
    assert "First difference" in text and "(index" in text


def test_summarised_history_is_detected():
    p1 = first_prompt()
    m = [SYSTEM, USER, assistant(p1, [200, END], [250]), TOOL]
    p2 = splice(m)
    m = [*m, assistant(p2, [210, END], [260]), USER]
    summary = {"role": "user", "content": [400, 401]}  # four messages replaced by one summary
    with pytest.raises(TokenAlignmentError, match="model prefix has 5 turns .* has 3"):
        splice([SYSTEM, summary, m[4], m[5]])


def test_two_model_calls_merged_into_one_message_are_detected():
    """Gym folds consecutive model outputs without a tool output between them into one assistant message carrying
    the last call's ids: the model prefix then has one turn more than the render."""
    p1 = first_prompt()
    g1 = [200, END]
    p2 = [*p1, *g1, NL, START, ROLE["assistant"], NL]
    merged = assistant(p2, [210, END], [250, 260])
    with pytest.raises(TokenAlignmentError, match="model prefix has 4 turns .* has 3"):
        splice([SYSTEM, USER, merged, TOOL])


def test_terminator_generated_mid_generation_is_detected():
    p1 = first_prompt()
    with pytest.raises(TokenAlignmentError, match="model prefix has 4 turns"):
        splice([SYSTEM, USER, assistant(p1, [200, END, 201, END], [250]), TOOL])


def test_full_render_with_fewer_turn_ends_is_detected():
    prompt = first_prompt()
    model_prefix = [*prompt, 200, END]
    prefix = render([SYSTEM, USER, {"role": "assistant", "content": [250]}], False)
    truncated_full = prefix[: prefix.index(END, prefix.index(END) + 1) + 1]  # only two turn ends survive
    with pytest.raises(TokenAlignmentError, match="full render has 2 turn ends but .* has 3"):
        splice_prompt(model_prefix, prefix, truncated_full, TEMPLATE)


def test_prefix_render_without_any_turn_end_is_rejected():
    with pytest.raises(TokenAlignmentError, match="contains no turn end"):
        splice_prompt([START, 200, END], [START, 200, 201], [START, 200, END], TEMPLATE)


def test_empty_model_prefix_is_rejected():
    with pytest.raises(TokenAlignmentError, match="empty"):
        splice_prompt([], [START, END], [START, END], TEMPLATE)


def test_only_the_template_stop_ids_count_as_turn_ends():
    """An id that is a stop id for one template is ordinary content for another."""
    prompt = first_prompt()
    generation = [200, EOS, 201]  # EOS is not a stop id of this template: the generation was cut by length
    messages = [SYSTEM, USER, assistant(prompt, generation, [250]), TOOL]
    only_end = TurnTemplate(terminator_id=END)
    found = last_tokenized_assistant(messages)
    prefix, full = render(messages[:3], False), render(messages, True)
    assert splice_prompt(found[1], prefix, full, only_end) == prompt + generation + [END, NL, *TAIL]
    with pytest.raises(TokenAlignmentError):
        splice_prompt(found[1], prefix, full, TEMPLATE)  # with EOS a stop id, the model prefix has a turn too many
