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
from nemo_gym_adapter.tokens.splice import (
    last_tokenized_assistant,
    messages_through,
    splice_prompt,
    turn_history,
)
from nemo_gym_adapter.tokens.turn_template import TurnTemplate
from tests.support.conversations import TOOLS, template_view

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
    full = render(messages, True, strip_old_reasoning)
    return splice_prompt(model_prefix, prefix, full, TEMPLATE, turn_history(messages, k))


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
        ([1, 2], [4, 2**70], "generation_token_ids[1]", str(2**70)),
        ([1, -2], [4], "prompt_token_ids[1]", "got -2"),
        ([1, None], [4], "prompt_token_ids[1]", "got None"),
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


@pytest.mark.parametrize(
    ("prompt", "generation", "where", "fragment"),
    [
        ([1, 2], [True, True], "generation_token_ids[0]", "True (bool)"),  # JSON true is not token 1
        ([False, 2], [4], "prompt_token_ids[0]", "False (bool)"),
        ([1, 2], [4, 100], "generation_token_ids[1]", "= 100 is out of vocabulary: the model's token ids are 0..99"),
        ([1, 2**63], [4], "prompt_token_ids[1]", "out of vocabulary"),
        ([1, "x" * 10_000], [4], "prompt_token_ids[1]", "'xxxxxx"),
    ],
)
def test_ids_are_checked_against_the_vocabulary_naming_the_element(prompt, generation, where, fragment):
    bad = {"role": "assistant", "content": "x", "prompt_token_ids": prompt, "generation_token_ids": generation}
    with pytest.raises(TokenAlignmentError) as info:
        last_tokenized_assistant([USER, bad], vocab_size=100)
    assert f"messages[1].{where}" in str(info.value) and fragment in str(info.value)
    assert len(str(info.value)) < 300  # a 10 kB id is not echoed back
    ok = {**bad, "prompt_token_ids": [1, 2], "generation_token_ids": [99]}
    assert last_tokenized_assistant([USER, ok], vocab_size=100) == (1, [1, 2, 99])  # the control: 99 is in


def test_a_long_id_list_is_checked_in_c_passes():
    ids = list(range(200_000))
    ok = {"role": "assistant", "content": "x", "prompt_token_ids": ids, "generation_token_ids": [1]}
    assert last_tokenized_assistant([USER, ok], vocab_size=200_000)[1][-1] == 1
    with pytest.raises(TokenAlignmentError, match=r"prompt_token_ids\[199999\] = 199999 is out of vocabulary"):
        last_tokenized_assistant([USER, ok], vocab_size=199_999)


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


# =====================================================================================================================
# Real chat templates: the three tiny-model families, rendered exactly as vLLM renders a chat request.

FAMILIES = ("qwen25", "qwen3", "llama3")


def render_text(tok, messages: list[dict], add_generation_prompt: bool) -> str:
    return tok.apply_chat_template(
        template_view(messages), tools=TOOLS, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def encode(tok, text: str) -> list[int]:
    # vLLM tokenizes chat prompts without adding special tokens: the template writes them.
    return tok.encode(text, add_special_tokens=False)


def pieces(tok, text: str) -> list[int]:
    """``text`` spelled one character at a time: what a model may sample where the tokenizer writes one token."""
    return [i for ch in text for i in encode(tok, ch)]


def hook(tok, template: TurnTemplate, messages: list[dict]) -> list[int]:
    """What the vLLM patch computes for a request, built from this module's functions."""
    found = last_tokenized_assistant(messages)
    full = encode(tok, render_text(tok, messages, True))
    if found is None:
        return full
    k, model_prefix = found
    prefix = encode(tok, render_text(tok, messages_through(messages, k), False))
    history = turn_history(messages, k, template.stop_texts)
    return splice_prompt(model_prefix, prefix, full, template, history, decode=tok.decode)


def gym_assistant(prompt, generation, content, call=None, reasoning=None) -> dict:
    """The assistant message NeMo Gym sends back next turn (vllm_model with return_token_id_information)."""
    import json

    message: dict = {"role": "assistant", "content": content}
    if call:
        name, args = call
        message["tool_calls"] = [
            {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        ]
    if reasoning:
        message["reasoning_content"] = message["reasoning"] = reasoning  # Gym's default reasoning_field "both"
    message.update(
        prompt_token_ids=prompt, generation_token_ids=generation, generation_log_probs=[-1.0] * len(generation)
    )
    return message


def expected_after(tok, messages: list[dict], anchor: str, terminator: str) -> list[int]:
    """Independent oracle of the rendered tail: the text after the first terminator that follows ``anchor`` (unique
    text of the last tokenized assistant turn) in the full render, re-encoded on its own (tokenizers split at
    special tokens, so the boundary is clean)."""
    text = render_text(tok, messages, True)
    at = text.index(terminator, text.rindex(anchor))
    return encode(tok, text[at + len(terminator) :])


def tool_call_generation(tok, family: str) -> tuple[list[int], str | None, str | None]:
    """Turn 1 as the model sampled it: (ids, content Gym sends back, reasoning). Deliberately not the template's
    encoding: "Skinny" in pieces, ``<tool_call>`` in plain pieces, compact JSON, a think block for Qwen3."""
    if family == "llama3":
        # Llama's JSON tool call: the parser returns no content; the template re-serialises the arguments.
        return pieces(tok, '{"name"') + encode(tok, ': "get_weather", "parameters": {"city":"Paris"}}'), None, None
    ids = pieces(tok, "Skinny") + encode(tok, " check.\n") + pieces(tok, "<tool_call>")
    ids += encode(tok, '\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>')
    reasoning = None
    if family == "qwen3":
        reasoning = "The user wants the weather."
        ids = encode(tok, f"<think>\n{reasoning}\n</think>\n\n") + ids
    return ids, "Skinny check.", reasoning


@pytest.mark.parametrize("family", FAMILIES)
def test_multi_turn_tool_conversation_stays_token_exact(family_tokenizers, family):
    """Four requests of a tool-calling rollout: each spliced prompt starts with every earlier prompt+generation,
    while the naive re-render (the control) does not. Turn 1 ends with the terminator after a tool call, turn 2
    with the other EOS (<|endoftext|> / <|end_of_text|>), turn 3 is cut by length."""
    tok, template, term = family_tokenizers[family]
    other_eos = tok.convert_tokens_to_ids("<|endoftext|>" if family != "llama3" else "<|end_of_text|>")
    assert other_eos != template.terminator_id
    m = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Paris? Skinny."}]
    p1 = hook(tok, template, m)
    assert p1 == encode(tok, render_text(tok, m, True))  # first turn: no ids anywhere, nothing spliced

    g1, content1, reasoning1 = tool_call_generation(tok, family)
    g1 = [*g1, template.terminator_id]
    m += [gym_assistant(p1, g1, content1, ("get_weather", {"city": "Paris"}), reasoning1)]
    m += [{"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21 C"}]
    p2 = hook(tok, template, m)
    naive = encode(tok, render_text(tok, m, True))
    assert naive[: len(p1 + g1)] != p1 + g1  # the control: vLLM's own render is off-policy
    assert p2 == p1 + g1 + expected_after(tok, m, "get_weather", term)

    g2 = pieces(tok, "It is") + encode(tok, " sunny.") + [other_eos]
    m += [gym_assistant(p2, g2, "It is sunny."), {"role": "user", "content": "Thanks! And tomorrow?"}]
    p3 = hook(tok, template, m)
    assert p3 == p2 + g2 + expected_after(tok, m, "It is sunny.", term)  # the model's EOS is kept, not replaced
    if family == "qwen3":
        # The new user query strips turn 1's reasoning from the full render but not from the prefix render, so a
        # position-based splice (cut the full render where the prefix render's last terminator sits) goes wrong.
        reasoning = "The user wants the weather."
        assert reasoning in render_text(tok, m[:5], False) and reasoning not in render_text(tok, m, True)
        prefix, full = encode(tok, render_text(tok, m[:5], False)), encode(tok, render_text(tok, m, True))
        by_position = p2 + g2 + full[len(prefix) - prefix[::-1].index(template.terminator_id) :]
        assert by_position != p3

    g3 = encode(tok, "Tomorrow") + pieces(tok, " it will")  # max_tokens reached: no stop id
    m += [gym_assistant(p3, g3, "Tomorrow it will"), {"role": "user", "content": "ok"}]
    p4 = hook(tok, template, m)
    assert p4 == p3 + g3 + [template.terminator_id] + expected_after(tok, m, "Tomorrow it will", term)
    for prompt, generation in ((p1, g1), (p2, g2), (p3, g3)):
        assert p4[: len(prompt + generation)] == prompt + generation


@pytest.mark.parametrize("family", FAMILIES)
def test_real_template_edited_history_is_detected(family_tokenizers, family):
    tok, template, _ = family_tokenizers[family]
    m = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Paris?"}]
    p1 = hook(tok, template, m)
    g1, content1, reasoning1 = tool_call_generation(tok, family)
    g1 = [*g1, template.terminator_id]
    m += [gym_assistant(p1, g1, content1, ("get_weather", {"city": "Paris"}), reasoning1)]
    m += [{"role": "tool", "tool_call_id": "call_0", "content": "sunny"}]
    p2 = hook(tok, template, m)
    m += [gym_assistant(p2, encode(tok, "Sunny.") + [template.terminator_id], "Sunny.")]
    m += [{"role": "user", "content": "And Tokyo?"}]
    assert hook(tok, template, m)  # untouched history splices fine

    removed = [m[0], m[1], m[4], m[5]]  # the tool round trip dropped from the history
    summarised = [m[0], {"role": "user", "content": "Summary: asked for Paris weather, it is sunny."}, m[4], m[5]]
    for edited in (removed, summarised):
        with pytest.raises(TokenAlignmentError, match="model prefix has 5 turns .* has 3"):
            hook(tok, template, edited)
