"""Unit tests of the in-place edit check (``history_check``) through ``splice_prompt``: hand-built token layouts
first, then the three tiny-model chat templates, then text that spells stop tokens and the assistant-edit policy.

Every refusal test has its control: the same request spliced without the check (``history=None``, the count-only
splice this project shipped before) goes through, i.e. the edit would have been silently lost.
"""

from __future__ import annotations

import copy

import pytest

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.splice import last_tokenized_assistant, messages_through, splice_prompt, turn_history
from tests.unit.tokens.test_splice import (
    END,
    EOS,
    NL,
    SYSTEM,
    TEMPLATE,
    TOOL,
    USER,
    assistant,
    encode,
    expected_after,
    gym_assistant,
    pieces,
    render,
    render_text,
    tool_call_generation,
)

# =====================================================================================================================
# Hand-built layout (see test_splice): START role NL content END NL; generation prompt START assistant NL.


def synthetic(messages: list[dict], *, check: bool = True, edits: str = "keep_ids", gen_extra=()) -> list[int]:
    """The hook's splice on the hand-built layout. ``gen_extra``: ids the generation prompt adds after the assistant
    header (like Qwen3's empty think block with ``enable_thinking=false``), which the history does not write."""
    k, model_prefix = last_tokenized_assistant(messages)
    prefix = render(messages_through(messages, k), False)
    full = render(messages, True) + list(gen_extra)
    history = turn_history(messages, k) if check else None
    return splice_prompt(model_prefix, prefix, full, TEMPLATE, history, assistant_edits=edits, decode=_fake_decode)


def _fake_decode(ids: list[int]) -> str:
    return " ".join(f"t{i}" for i in ids)


def rollout(turn_endings=((200, END), (210, END)), gen_extra=(), last_follow=None) -> list[dict]:
    """SYSTEM, USER, then per generation: assistant (ids as the patched server produced them) + a tool output;
    the last follow-up is a user message."""
    messages = [SYSTEM, USER]
    prompt = render(messages, True) + list(gen_extra)
    for n, generation in enumerate(turn_endings):
        messages = [*messages, assistant(prompt, list(generation), [250 + n])]
        follow = {"role": "tool", "content": [103 + n], "tool_call_id": f"c{n}"}
        if n == len(turn_endings) - 1:
            follow = last_follow or {"role": "user", "content": [300, 301]}
        messages.append(follow)
        prompt = synthetic(messages, gen_extra=gen_extra)
    return messages


def edited(messages: list[dict], index: int, content: list[int]) -> list[dict]:
    out = copy.deepcopy(messages)
    out[index]["content"] = content
    return out


@pytest.mark.parametrize(("index", "role"), [(0, "system"), (1, "user"), (3, "tool")])
def test_in_place_edit_is_refused_naming_the_message(index, role):
    messages = rollout()
    before = synthetic(messages)
    changed = edited(messages, index, [*messages[index]["content"], 999])
    assert synthetic(changed, check=False) == before  # the control: the count-only splice keeps the old tokens
    with pytest.raises(TokenAlignmentError, match=rf"messages\[{index}\] \({role}\) differs from what the model saw"):
        synthetic(changed)


@pytest.mark.parametrize("ending", [(200, EOS), (200,), ()], ids=["other-stop", "length-cut", "empty"])
def test_edit_after_a_turn_ending_in_another_stop_or_none_is_found(ending):
    """The span after a generation starts after its stop id, or at the terminator the splice inserted."""
    messages = rollout(turn_endings=(ending, (210, END)))
    assert synthetic(messages)
    with pytest.raises(TokenAlignmentError, match=r"messages\[3\] \(tool\)"):
        synthetic(edited(messages, 3, [104]))


def test_generation_prompt_that_differs_from_the_history_header_is_not_an_edit():
    messages = rollout(gen_extra=(90, 91))
    k, model_prefix = last_tokenized_assistant(messages)
    assert model_prefix[model_prefix.index(250 - 50) - 2 : model_prefix.index(250 - 50)] == [90, 91]
    tail = render(messages[k + 1 :], True)
    assert synthetic(messages, gen_extra=(90, 91)) == model_prefix + [NL, *tail, 90, 91]


def test_difference_in_the_first_token_after_a_turn_end_is_an_edit():
    """A message whose very first token changed (a role changed in place) is not the generation prompt."""
    messages = rollout()
    changed = copy.deepcopy(messages)
    changed[3]["role"] = "user"
    with pytest.raises(TokenAlignmentError, match=r"messages\[3\] \(user\)"):
        synthetic(changed)


def test_client_written_assistant_message_is_compared_like_any_message():
    """Without ids an assistant message was rendered by the template into the model prefix: under ``refuse`` its
    edit is refused; under ``keep_ids`` a unit that starts with the generation prompt is the model's (tolerated)."""
    messages = [SYSTEM, USER, {"role": "assistant", "content": [600]}, USER]
    prompt = render(messages, True)
    messages += [assistant(prompt, [200, END], [250]), TOOL]
    assert synthetic(messages, edits="refuse") == synthetic(messages)
    changed = edited(messages, 2, [601])
    with pytest.raises(TokenAlignmentError, match=r"messages\[2\] \(assistant\)"):
        synthetic(changed, edits="refuse")
    assert synthetic(changed) == synthetic(messages)


def test_model_turn_whose_ids_were_dropped_is_skipped_like_a_tokenized_one():
    """A client that sends ids only on the last model call: the earlier model turn is skipped to its turn end
    (``keep_ids``); an edit elsewhere is still found."""
    messages = rollout(turn_endings=((200, 201, EOS), (210, END), (220, END)))
    dropped = copy.deepcopy(messages)
    for i in (2, 4):
        for key in ("prompt_token_ids", "generation_token_ids", "generation_log_probs"):
            del dropped[i][key]
    assert synthetic(dropped) == synthetic(messages)
    with pytest.raises(TokenAlignmentError, match=r"messages\[2\] \(assistant\)"):
        synthetic(dropped, edits="refuse")  # no ids, so its tokens must be the template's: they are the model's
    with pytest.raises(TokenAlignmentError, match=r"messages\[5\] \(tool\)"):
        synthetic(edited(dropped, 5, [777]))


def test_malformed_ids_on_an_earlier_turn_name_the_message():
    messages = rollout()
    broken = copy.deepcopy(messages)
    broken[2]["generation_token_ids"] = "200 2"
    with pytest.raises(TokenAlignmentError, match=r"messages\[2\]\.generation_token_ids must be a list of token ids"):
        synthetic(broken)


# =====================================================================================================================
# The three tiny-model chat templates, rendered as vLLM renders a chat request.

FAMILIES = ("qwen25", "qwen3", "llama3")
OTHER_EOS = {"qwen25": "<|endoftext|>", "qwen3": "<|endoftext|>", "llama3": "<|end_of_text|>"}


def real(tok, template, messages, *, check=True, edits="keep_ids") -> list[int]:
    """The vLLM hook's splice, with the tokenizer's render (``test_splice.hook`` plus the options)."""
    full = encode(tok, render_text(tok, messages, True))
    found = last_tokenized_assistant(messages)
    if found is None:
        return full
    k, model_prefix = found
    prefix = encode(tok, render_text(tok, messages_through(messages, k), False))
    history = turn_history(messages, k, template.stop_texts) if check else None
    return splice_prompt(model_prefix, prefix, full, template, history, decode=tok.decode, assistant_edits=edits)


def tool_rollout(tok, template, family: str) -> list[dict]:
    """system, user, assistant (tool call, Gym's ids), tool, assistant (answer), user: anchor at index 4."""
    m = [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Weather in Paris?"}]
    p1 = real(tok, template, m)
    g1, content1, reasoning1 = tool_call_generation(tok, family)
    m += [gym_assistant(p1, [*g1, template.terminator_id], content1, ("get_weather", {"city": "Paris"}), reasoning1)]
    m += [{"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21 C"}]
    p2 = real(tok, template, m)
    g2 = pieces(tok, "It is") + encode(tok, " sunny.") + [template.terminator_id]
    return [*m, gym_assistant(p2, g2, "It is sunny."), {"role": "user", "content": "And Tokyo?"}]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    ("index", "role", "new", "shown"),
    [
        (0, "system", "You are a sailing bot.", "sailing"),
        (1, "user", "Weather in Rome?", "Rome"),
        (3, "tool", "rain, 9 C", "rain"),
    ],
)
def test_real_template_in_place_edits_are_refused(family_tokenizers, family, index, role, new, shown):
    tok, template, _ = family_tokenizers[family]
    messages = tool_rollout(tok, template, family)
    before = real(tok, template, messages)
    changed = copy.deepcopy(messages)
    changed[index]["content"] = new
    assert real(tok, template, changed, check=False) == before  # control: the edit silently lost
    with pytest.raises(TokenAlignmentError, match=rf"messages\[{index}\] \({role}\) differs") as info:
        real(tok, template, changed)
    assert shown in str(info.value)  # the edited text is shown, decoded


@pytest.mark.parametrize("family", FAMILIES)
def test_real_template_tools_changed_between_turns_are_refused(family_tokenizers, family):
    """Re-templating the prompt (here: the tool list) changes the template text the model saw."""
    tok, template, _ = family_tokenizers[family]
    messages = tool_rollout(tok, template, family)
    k, model_prefix = last_tokenized_assistant(messages)
    edit = ("Get the weather of a city", "Weather.")  # the description of tests.support.conversations.TOOLS
    text = render_text(tok, messages_through(messages, k), False)
    assert edit[0] in text  # else this test would edit nothing
    text = text.replace(*edit)
    with pytest.raises(TokenAlignmentError, match="differs from what the model saw"):
        splice_prompt(
            model_prefix,
            encode(tok, text),
            encode(tok, render_text(tok, messages, True).replace(*edit)),
            template,
            turn_history(messages, k, template.stop_texts),
            decode=tok.decode,
        )


def test_qwen3_generation_prompt_without_thinking_is_not_an_edit(family_tokenizers):
    """Qwen3's ``enable_thinking=false`` prompt ends with an empty think block that the history does not write for an
    earlier turn: the span's last unit differs from the history render, legitimately."""
    from tests.support.conversations import TOOLS, template_view

    tok, template, _ = family_tokenizers["qwen3"]

    def ids(messages, gen):
        text = tok.apply_chat_template(
            template_view(messages), tools=TOOLS, tokenize=False, add_generation_prompt=gen, enable_thinking=False
        )
        return encode(tok, text)

    def request(messages):
        k, model_prefix = last_tokenized_assistant(messages)
        history = turn_history(messages, k, template.stop_texts)
        return splice_prompt(model_prefix, ids(messages[: k + 1], False), ids(messages, True), template, history)

    m = [{"role": "user", "content": "Weather in Paris?"}]
    p1 = ids(m, True)
    g1 = encode(tok, "Sunny") + pieces(tok, " today.") + [template.terminator_id]
    m += [gym_assistant(p1, g1, "Sunny today."), {"role": "user", "content": "And Oslo?"}]
    p2 = request(m)
    g2 = encode(tok, "Cold.") + [template.terminator_id]
    m += [gym_assistant(p2, g2, "Cold."), {"role": "user", "content": "Thanks."}]
    k, _ = last_tokenized_assistant(m)
    assert tok.decode(p1).endswith("<think>\n\n</think>\n\n")  # what the model saw before "Sunny"
    assert "assistant\nSunny today." in tok.decode(ids(m[: k + 1], False))  # what the history renders there
    p3 = request(m)
    assert p3[: len(p2 + g2)] == p2 + g2 and p3[: len(p1 + g1)] == p1 + g1


# =====================================================================================================================
# Text that spells a stop token (issue 10 item 2)


def _spelling_turn(tok, family, template, prompt, *, where: str, answer: str, stop_text: str) -> tuple[list, dict]:
    """A model turn whose reasoning (Qwen3) or content spells ``stop_text`` in plain pieces, as a model may write it."""
    spelled = f"The format ends turns with {stop_text} here."
    if where == "reasoning":
        ids = encode(tok, "<think>\n") + encode(tok, "The format ends turns with ") + pieces(tok, stop_text)
        ids += encode(tok, " here.\n</think>\n\n") + encode(tok, answer) + [template.terminator_id]
        return ids, gym_assistant(prompt, ids, answer, reasoning=spelled)
    content = f"{spelled} {answer}"
    ids = encode(tok, "The format ends turns with ") + pieces(tok, stop_text) + encode(tok, f" here. {answer}")
    ids += [template.terminator_id]
    return ids, gym_assistant(prompt, ids, content)


CASES = [
    ("qwen3", "reasoning", "tool"),
    ("qwen3", "reasoning", "user"),
    ("qwen25", "content", "user"),
    ("qwen25", "content", "tool"),
    ("llama3", "content", "user"),
]


@pytest.mark.parametrize(("family", "where", "then"), CASES)
@pytest.mark.parametrize("spell", ["terminator", "other_eos"])
def test_turn_that_spells_a_stop_token_is_spliced_exactly(family_tokenizers, family, where, then, spell):
    """Such a turn was refused before (the control): its rendering holds one turn end more than the model's tokens,
    and with reasoning stripped from the full render the counts of the two renders differ as well."""
    tok, template, term = family_tokenizers[family]
    stop_text = term if spell == "terminator" else OTHER_EOS[family]
    m = [{"role": "user", "content": "How do chat formats end a turn?"}]
    p1 = real(tok, template, m)
    g1, message = _spelling_turn(tok, family, template, p1, where=where, answer="Done one.", stop_text=stop_text)
    follow = (
        {"role": "tool", "tool_call_id": "call_0", "content": "noted"}
        if then == "tool"
        else {"role": "user", "content": "Thanks. Again?"}
    )
    m += [message, follow]
    with pytest.raises(TokenAlignmentError):
        real(tok, template, m, check=False)  # the control: the count-only splice refuses it
    p2 = real(tok, template, m)
    assert p2 == p1 + g1 + expected_after(tok, m, "Done one.", term)
    # One more turn that spells it too, then a plain one: every prompt keeps every earlier turn's tokens.
    g2, message = _spelling_turn(tok, family, template, p2, where=where, answer="Done two.", stop_text=stop_text)
    m += [message, {"role": "user", "content": "Last one?"}]
    p3 = real(tok, template, m)
    assert p3 == p2 + g2 + expected_after(tok, m, "Done two.", term)
    g3 = encode(tok, "Bye.") + [template.terminator_id]
    m += [gym_assistant(p3, g3, "Bye."), {"role": "user", "content": "ok"}]
    p4 = real(tok, template, m)
    assert p4[: len(p3 + g3)] == p3 + g3 and p4[: len(p1 + g1)] == p1 + g1
    # The check still works around such turns.
    changed = copy.deepcopy(m)
    changed[0]["content"] = "How do chat formats begin a turn?"
    with pytest.raises(TokenAlignmentError, match=r"messages\[0\] \(user\)"):
        real(tok, template, changed)
