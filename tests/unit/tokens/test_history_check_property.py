"""Property test of the in-place edit check: random rollouts of the three tiny-model families (as in
``test_splice_property``), then a random in-place change of one system, user or tool message before the last
tokenized assistant turn. The oracle is the chat template itself: if the change alters the rendered history (an
edit), the request must be refused naming that message; if it does not (trailing whitespace the template trims, the
same text rebuilt), the spliced prompt must be exactly the unchanged one.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.splice import last_tokenized_assistant, messages_through
from tests.unit.tokens.test_splice_property import Family, build_family, generate, turns

WORDS = ("alpha", "Paris", "Skinny", "42", "weather", "Next")
EDITS = ("append", "prepend", "replace", "truncate", "whitespace", "same")


@pytest.fixture(scope="module")
def edit_families(tiny_model_dir) -> dict[str, Family]:
    return {name: build_family(name, tiny_model_dir(name)) for name in ("qwen25", "qwen3", "llama3")}


def rollout(family: Family, script) -> list[dict]:
    """The conversation Gym sends back after ``script``'s model calls, every prompt spliced by the patched server."""
    messages = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Weather in Paris?"}]
    for n, turn in enumerate(script):
        prompt = request(family, messages)
        generation, message = generate(family, turn)
        message.update(prompt_token_ids=prompt, generation_token_ids=generation, generation_log_probs=[0.0] * 3)
        messages = [*messages, message]
        if turn.follow_up == "injected_assistant":
            messages.append({"role": "assistant", "content": "Noted."})
        if turn.call and turn.follow_up == "env":
            messages.append({"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": "42"})
        else:
            messages.append({"role": "user", "content": f"Next {n + 1}?"})
    return messages


def request(family: Family, messages: list[dict]) -> list[int]:
    full = family.render(messages, True)
    found = last_tokenized_assistant(messages)
    if found is None:
        return full
    k, model_prefix = found
    return family.splice(messages, k, model_prefix, family.render(messages_through(messages, k), False), full)


def change(text: str, kind: str, word: str, at: int) -> str:
    if kind == "append":
        return f"{text} {word}"
    if kind == "prepend":
        return f"{word} {text}"
    if kind == "replace":
        i = at % len(text)
        return text[:i] + ("x" if text[i] != "x" else "y") + text[i + 1 :]
    if kind == "truncate":
        return text[: max(1, len(text) // 2)]
    if kind == "whitespace":
        return text + "  "
    return "".join(list(text))  # "same": an equal string rebuilt


@pytest.mark.parametrize("name", ["qwen25", "qwen3", "llama3"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=turns(10_000), data=st.data())
def test_random_in_place_edits_are_refused_and_non_edits_pass(edit_families, name, script, data):
    family = edit_families[name]
    messages = rollout(family, script)
    k, _ = last_tokenized_assistant(messages)
    before = request(family, messages)
    editable = [i for i in range(k) if messages[i]["role"] in ("system", "user", "tool")]
    index = data.draw(st.sampled_from(editable), label="message")
    kind = data.draw(st.sampled_from(EDITS), label="edit")
    new = change(messages[index]["content"], kind, data.draw(st.sampled_from(WORDS)), data.draw(st.integers(0, 99)))
    changed = copy.deepcopy(messages)
    changed[index]["content"] = new
    if family.render(changed[: k + 1], False) == family.render(messages[: k + 1], False):
        assert request(family, changed) == before  # the template renders it the same: not an edit
        return
    with pytest.raises(TokenAlignmentError) as info:
        request(family, changed)
    assert f"messages[{index}] ({messages[index]['role']}) differs" in str(info.value)
