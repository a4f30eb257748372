"""``required_prefix_token_ids`` on a conversation without an assistant message (issue 19 item 1), and the text
comparison it and the edit check share (``same_text``), with the tiny qwen25 tokenizer (ChatML: ``<|im_end|>`` closes
every turn, `` Skinny`` is one token and two when split by hand, as in NeMo RL's merged-tokens test).
"""

from __future__ import annotations

import pytest

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.required_prefix import splice_required_prefix
from nemo_gym_adapter.tokens.same_text import SameText
from nemo_gym_adapter.tokens.turn_template import turn_template_from_tokenizer

QUESTION = "What is the weather like? Skinny"


@pytest.fixture(scope="module")
def qwen(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir("qwen25"))
    template = turn_template_from_tokenizer(tok, [])
    return tok, template, SameText.for_tokenizer(tok, template.added_ids)


def render(tok, messages, generation_prompt=True) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
    return tok.encode(text, add_special_tokens=False)


def conversation(question: str = QUESTION) -> list[dict]:
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]


def skinny_split(tok, ids: list[int]) -> list[int]:
    """``ids`` with the one-token " Skinny" replaced by two plain tokens spelling the same characters."""
    (skinny,) = tok.encode(" Skinny", add_special_tokens=False)
    splits = ([*tok.encode(" Skinny"[:c], add_special_tokens=False), *tok.encode(" Skinny"[c:])] for c in range(1, 7))
    pieces = next(p for p in splits if len(p) == 2)
    assert tok.decode(pieces) == " Skinny"
    at = ids.index(skinny)
    return ids[:at] + pieces + ids[at + 1 :]


def test_prefix_ending_inside_the_user_message_gets_the_rest_of_the_render(qwen):
    """NeMo RL's merged-tokens case: the prefix is the render up to the user text, " Skinny" in two tokens and no
    ``<|im_end|>``; the prompt is that prefix (kept as sent) + the template's turn end and generation prompt."""
    tok, template, same_text = qwen
    full = render(tok, conversation())
    im_end = template.terminator_id
    cut = [i for i, t in enumerate(full) if t == im_end][1]  # the user turn's end
    required = skinny_split(tok, full[:cut])
    prompt = splice_required_prefix(required, full, template, same_text=same_text)
    assert prompt == required + full[cut:]
    assert tok.decode(prompt) == tok.decode(full)


def test_prefix_ending_at_a_turn_end_keeps_it(qwen):
    tok, template, same_text = qwen
    full = render(tok, conversation())
    first_end = full.index(template.terminator_id)
    required = full[: first_end + 1]
    assert splice_required_prefix(required, full, template, same_text=same_text) == full
    assert splice_required_prefix(required, full, template, same_text=None) == full  # equal ids: no decode needed


@pytest.mark.parametrize(
    ("question", "why"),
    [
        ("What is the weather like? Skinny!", "extended"),
        ("What is the weather like?", "truncated"),
        ("What is the climate like? Skinny", "edited"),
    ],
)
def test_prefix_that_does_not_spell_the_conversation_is_refused(qwen, question, why):
    """The prefix was taken from one conversation, the request sends another: refused, never cut in silence."""
    tok, template, same_text = qwen
    old = render(tok, conversation())
    cut = [i for i, t in enumerate(old) if t == template.terminator_id][1]
    required = old[:cut]
    with pytest.raises(TokenAlignmentError, match="does not spell the conversation up to its turn 2"):
        splice_required_prefix(required, render(tok, conversation(question)), template, same_text=same_text)


def test_retokenized_prefix_needs_the_text_check(qwen):
    tok, template, _ = qwen
    full = render(tok, conversation())
    cut = [i for i, t in enumerate(full) if t == template.terminator_id][1]
    with pytest.raises(TokenAlignmentError, match="does not spell"):
        splice_required_prefix(skinny_split(tok, full[:cut]), full, template, same_text=None)


def test_prefix_longer_than_the_conversation_is_refused(qwen):
    tok, template, same_text = qwen
    longer = render(tok, [*conversation(), {"role": "assistant", "content": "Sunny."}], False)
    with pytest.raises(TokenAlignmentError, match="longer than the conversation"):
        splice_required_prefix(longer, render(tok, conversation()), template, same_text=same_text)
    with pytest.raises(TokenAlignmentError, match="is empty"):
        splice_required_prefix([], render(tok, conversation()), template, same_text=same_text)


def test_a_special_token_spelled_in_plain_pieces_is_not_the_same_text(qwen):
    tok, template, same_text = qwen
    full = render(tok, conversation())
    cut = [i for i, t in enumerate(full) if t == template.terminator_id][1]
    header = full.index(tok.convert_tokens_to_ids("<|im_start|>"), 1)  # the user turn's <|im_start|>
    spelled = [i for ch in "<|im_start|>" for i in tok.encode(ch, add_special_tokens=False)]
    required = full[:header] + spelled + full[header + 1 : cut]
    assert tok.decode(required) == tok.decode(full[:cut])  # the same characters...
    with pytest.raises(TokenAlignmentError, match="does not spell"):  # ...but not the same input to the model
        splice_required_prefix(required, full, template, same_text=same_text)


def test_same_text_compares_exact_decodes():
    """Fake decode: id -> text. Specials must line up; U+FFFD never compares; the caller's left context matters."""
    texts = {1: "<s>", 2: " a", 3: "a", 4: "b", 5: " ab", 6: "\ufffd", 7: "ab"}
    same = SameText(lambda ids: "".join(texts[i] for i in ids), frozenset({1}))
    assert same([2, 4], [5]) and same([1, 3, 4], [1, 7])
    assert not same([2, 4], [7])  # " ab" vs "ab": a whitespace edit
    assert not same([1, 3, 4], [3, 4, 1])  # same characters, special token elsewhere
    assert not same([6], [6])  # undecodable bytes are not text


def test_for_tokenizer_needs_an_exact_decode():
    class NoCleanUpOption:
        def decode(self, ids, skip_special_tokens=False):  # vLLM's tokenizer protocol (Mistral)
            return ""

    class HuggingFaceLike:
        def decode(self, ids, skip_special_tokens=False, clean_up_tokenization_spaces=None):
            assert clean_up_tokenization_spaces is False and skip_special_tokens is False
            return "x" * len(ids)

    assert SameText.for_tokenizer(NoCleanUpOption(), {1}) is None
    same = SameText.for_tokenizer(HuggingFaceLike(), {1})
    assert same is not None and same([2, 3], [4, 5]) and same.special_ids == frozenset({1})
