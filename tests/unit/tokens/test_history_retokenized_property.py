"""Property test (issue 19 item 2): the in-place edit check decides on text, not on token ids.

Random rollouts of the three tiny-model families (``test_history_check_property.rollout``); then one earlier
prompt's ids are changed in a system, user or tool unit before the last tokenized assistant turn:

* a *retokenization*: one token of that unit replaced by two or more tokens spelling the same characters (what a
  client or another tokenizer path may send: the same text, another BPE split) -> the request is accepted and the
  spliced prompt keeps the model's (retokenized) ids exactly;
* an *edit*: the message text changed in place (as in ``test_history_check_property``) -> refused naming it.

The retokenized ids are put into every tokenized assistant message's ``prompt_token_ids`` from the one where the
unit first appears on (Gym's history is one prefix chain, so each later prompt repeats it).
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.splice import last_tokenized_assistant
from tests.unit.tokens.test_history_check_property import edit_families, request, rollout  # noqa: F401  (fixture)
from tests.unit.tokens.test_splice_property import turns


def split_token(family, token: int) -> list[int] | None:
    """Two or more plain tokens whose decoded text equals ``token``'s, or None (single-char / special tokens)."""
    text = family.tok.decode([token])
    for cut in range(1, len(text)):
        pieces = family.encode(text[:cut]) + family.encode(text[cut:])
        if len(pieces) >= 2 and family.tok.decode(pieces) == text:
            return pieces
    return None


def retokenize(family, messages: list[dict], k: int, pick: int) -> tuple[list[dict], int] | None:
    """``messages`` with one template-text token (in a unit before the first generation, i.e. part of every
    prompt) replaced by an equivalent split in every tokenized assistant message; None if no such token."""
    first = next(i for i, m in enumerate(messages) if m.get("prompt_token_ids") is not None)
    prompt0 = messages[first]["prompt_token_ids"]
    stops = family.template.stop_ids
    last_stop = max(i for i, t in enumerate(prompt0) if t in stops)  # after it: the generation prompt (tolerated)
    special = family.template.added_ids
    candidates = [
        (i, p) for i, t in enumerate(prompt0[:last_stop]) if t not in special and (p := split_token(family, t))
    ]
    if not candidates:
        return None
    at, pieces = candidates[pick % len(candidates)]
    out = copy.deepcopy(messages)
    for m in out:
        ids = m.get("prompt_token_ids")
        if ids is not None:
            assert ids[at] == prompt0[at]
            m["prompt_token_ids"] = ids[:at] + pieces + ids[at + 1 :]
    return out, len(pieces) - 1


@pytest.mark.parametrize("name", ["qwen25", "qwen3", "llama3"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=turns(10_000), pick=st.integers(0, 10_000))
def test_retokenized_history_is_accepted_and_the_model_ids_are_kept(edit_families, name, script, pick):  # noqa: F811
    family = edit_families[name]
    messages = rollout(family, script)
    k, model_prefix = last_tokenized_assistant(messages)
    done = retokenize(family, messages, k, pick)
    if done is None:
        return
    changed, grown = done
    _, new_prefix = last_tokenized_assistant(changed)
    assert (
        family.tok.decode(new_prefix) == family.tok.decode(model_prefix)
        and len(new_prefix) == len(model_prefix) + grown
    )
    prompt = request(family, changed)  # raises TokenAlignmentError if the retokenization were called an edit
    assert prompt[: len(new_prefix)] == new_prefix  # the model's ids are kept, not the render's
    assert prompt[len(new_prefix) :] == request(family, messages)[len(model_prefix) :]  # same tail as unchanged


@pytest.mark.parametrize("name", ["qwen25", "qwen3", "llama3"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=turns(10_000), pick=st.integers(0, 10_000), at=st.integers(0, 99))
def test_a_retokenized_history_with_a_real_edit_is_still_refused(edit_families, name, script, pick, at):  # noqa: F811
    """Both at once: the retokenization alone is fine; an edited message elsewhere is still refused, naming it."""
    family = edit_families[name]
    messages = rollout(family, script)
    k, _ = last_tokenized_assistant(messages)
    done = retokenize(family, messages, k, pick)
    if done is None:
        return
    changed, _ = done
    editable = [i for i in range(k) if changed[i]["role"] in ("system", "user", "tool")]
    index = editable[at % len(editable)]
    text = changed[index]["content"]
    changed[index]["content"] = text + " edited"
    with pytest.raises(TokenAlignmentError) as info:
        request(family, changed)
    assert "differs from what the model saw" in str(info.value)


@pytest.mark.parametrize("name", ["qwen25", "qwen3", "llama3"])
def test_a_special_token_spelled_as_text_is_not_a_retokenization(edit_families, name):  # noqa: F811
    """Same decoded text, but a header's special token replaced by its spelling in plain pieces: refused."""
    family = edit_families[name]
    from tests.unit.tokens.test_splice_property import Turn

    turn = Turn((1, 2, 3), None, False, False, None, "terminator", "user")
    messages = rollout(family, [turn, turn])
    k, _ = last_tokenized_assistant(messages)
    prompt0 = messages[k]["prompt_token_ids"]
    special = family.template.added_ids - family.template.stop_ids
    at = next(i for i, t in enumerate(prompt0[1:], start=1) if t in special)  # a header token (not BOS)
    text = family.tok.decode([prompt0[at]])
    pieces = [i for ch in text for i in family.encode(ch)]
    changed = copy.deepcopy(messages)
    changed[k]["prompt_token_ids"] = prompt0[:at] + pieces + prompt0[at + 1 :]
    assert family.tok.decode(changed[k]["prompt_token_ids"]) == family.tok.decode(prompt0)
    with pytest.raises(TokenAlignmentError):
        request(family, changed)
