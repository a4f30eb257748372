"""Assistant messages edited while their ids were kept (``nemo_gym_adapter.tokens.assistant_texts``): ``keep_ids``
(default) vs ``refuse``, through the splice as the vLLM hook calls it, on the three tiny-model chat templates.

The conversations and the hook-shaped ``real``/``synthetic`` splices are ``tests/unit/tokens/test_history_check.py``'s.
"""

from __future__ import annotations

import copy

import pytest

from nemo_gym_adapter.errors import TokenAlignmentError
from tests.unit.tokens.test_history_check import FAMILIES, real, rollout, synthetic, tool_rollout


@pytest.mark.parametrize("family", FAMILIES)
def test_unedited_gym_conversation_passes_under_both_policies(family_tokenizers, family):
    tok, template, _ = family_tokenizers[family]
    messages = tool_rollout(tok, template, family)
    assert real(tok, template, messages, edits="refuse") == real(tok, template, messages)
    dropped = copy.deepcopy(messages)  # Gym's lineage ignores reasoning: a harness may drop it when echoing
    for m in dropped:
        m.pop("reasoning", None)
        m.pop("reasoning_content", None)
    assert real(tok, template, dropped, edits="refuse")


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    ("index", "field", "change"),
    [
        (4, "content", lambda m: m.update(content="It is raining.")),
        (
            2,
            r"tool_calls\[0\]\.function\.arguments",
            lambda m: m["tool_calls"][0]["function"].update(arguments='{"city": "Rome"}'),
        ),
    ],
    ids=["content", "tool-arguments"],
)
def test_edited_assistant_message_keeps_its_ids_or_is_refused(family_tokenizers, family, index, field, change):
    tok, template, _ = family_tokenizers[family]
    messages = tool_rollout(tok, template, family)
    before = real(tok, template, messages)
    changed = copy.deepcopy(messages)
    change(changed[index])
    assert real(tok, template, changed) == before  # keep_ids: the ids are the single source of truth
    with pytest.raises(TokenAlignmentError, match=rf"messages\[{index}\]\.{field} is not what its generation"):
        real(tok, template, changed, edits="refuse")


def test_unknown_assistant_edits_policy_is_rejected():
    from nemo_gym_adapter.errors import AdapterError

    with pytest.raises(AdapterError, match="assistant_edits must be one of"):
        synthetic(rollout(), edits="ignore")
