"""The turn template (``nemo_gym_adapter.tokens.turn_template``): its stop ids, and what it finds in the three tiny-model
chat templates (``family_tokenizers`` in ``tests/unit/conftest.py``).
"""

from __future__ import annotations

import pytest

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.turn_template import TurnTemplate, turn_template_from_tokenizer


def test_turn_template_always_counts_its_terminator_as_a_stop_id():
    assert TurnTemplate(terminator_id=7).stop_ids == frozenset({7})
    assert TurnTemplate(terminator_id=7, stop_ids=frozenset({9})).stop_ids == frozenset({7, 9})


@pytest.mark.parametrize("bad", [-1, True, "2", None])
def test_turn_template_rejects_non_ids(bad):
    with pytest.raises(TokenAlignmentError):
        TurnTemplate(terminator_id=bad)
    with pytest.raises(TokenAlignmentError):
        TurnTemplate(terminator_id=2, stop_ids=frozenset({bad}))


@pytest.mark.parametrize(
    ("family", "terminator", "eos"),
    [
        ("qwen25", "<|im_end|>", "<|im_end|>"),
        ("qwen3", "<|im_end|>", "<|im_end|>"),
        ("llama3", "<|eot_id|>", "<|end_of_text|>"),
    ],
)
def test_turn_template_from_tokenizer_finds_the_template_terminator(family_tokenizers, family, terminator, eos):
    tok, template, _ = family_tokenizers[family]
    assert tok.convert_ids_to_tokens(template.terminator_id) == terminator
    assert tok.eos_token == eos
    assert tok.eos_token_id in template.stop_ids  # the tokenizer EOS always ends a generation
    other = "<|endoftext|>" if family != "llama3" else "<|end_of_text|>"
    assert tok.convert_tokens_to_ids(other) in template.stop_ids  # generation-config EOS ids passed as extras


def test_turn_template_from_tokenizer_uses_an_explicit_chat_template(family_tokenizers):
    tok, _, _ = family_tokenizers["llama3"]
    chatml = "{% for m in messages %}<|start_header_id|>{{ m.content }}<|end_of_text|>{% endfor %}"
    assert turn_template_from_tokenizer(tok, chat_template=chatml).terminator_id == tok.eos_token_id
    with pytest.raises(TokenAlignmentError, match="no added/special token after the assistant content"):
        turn_template_from_tokenizer(tok, chat_template="{% for m in messages %}{{ m.content }}\n{% endfor %}")
