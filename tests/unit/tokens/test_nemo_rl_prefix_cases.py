"""NeMo RL's ``replace_prefix_tokens`` cases (``test_VllmAsyncGenerationWorker_replace_prefix_tokens`` and
``tests/unit/models/generation/test_openai_server_utils.py`` in NVIDIA-NeMo/RL) run through our splice, written anew
on hand-made ids (a ChatML-like layout: ``END`` the template's terminator, ``EOS`` a second stop id, as Qwen's
``<|im_end|>``/``<|endoftext|>``). The server-level cases are tests/integration/vllm/test_server.py;
both lists, with the deliberate differences and their reasons, are in docs/TOKEN_PATCH.md.

NeMo RL's function takes the model prefix (the earlier prompt + generation), the template's render of the same
history without a generation prompt, and the full render; ours is :func:`splice_prompt` with ``history=None`` (what
a required prefix alone gets: no per-message ids to check edits with).
"""

from __future__ import annotations

import pytest

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.splice import splice_prompt
from nemo_gym_adapter.tokens.turn_template import TurnTemplate

START, END, EOS, NL, USER, ASSISTANT = 1, 2, 3, 4, 5, 6
TEMPLATE = TurnTemplate(terminator_id=END, stop_ids=frozenset({END, EOS}))
PROMPT = [START, USER, NL, 30, 31, 32, END, NL, START, ASSISTANT, NL]  # a user turn + the generation prompt
ANSWER = [40, 41, 42]  # the model's own ids for its answer
RETOKENIZED = [43, 42]  # the same answer text as the template encodes it again
TAIL = [START, USER, NL, 33, END, NL, START, ASSISTANT, NL]  # the next user turn + generation prompt


def full(answer: list[int]) -> list[int]:
    return PROMPT + answer + [END, NL] + TAIL


@pytest.mark.parametrize(
    ("case", "model_prefix", "prefix_render"),
    [
        ("model prefix ends with the EOS, template prefix with its EOS", ANSWER + [END], RETOKENIZED + [END]),
        ("model prefix cut without EOS (length)", ANSWER, RETOKENIZED + [END]),
        ("template prefix ends with EOS + newline", ANSWER + [END], RETOKENIZED + [END, NL]),
        ("no EOS, template prefix EOS + newline", ANSWER, RETOKENIZED + [END, NL]),
        ("model stopped with the other EOS", ANSWER + [EOS], RETOKENIZED + [END, NL]),
    ],
)
def test_the_models_ids_then_the_rendered_rest(case, model_prefix, prefix_render):
    """NeMo RL's six Qwen3 cases in our ids: the model's own tokens are kept (retokenized text or not), a cut
    generation gets the template's turn end, and the rest comes from the full render."""
    got = splice_prompt(PROMPT + model_prefix, PROMPT + prefix_render, full(RETOKENIZED), TEMPLATE)
    ended = model_prefix[-1] in TEMPLATE.stop_ids
    assert got == PROMPT + model_prefix + ([] if ended else [END]) + [NL] + TAIL, case


def test_template_prefix_without_a_turn_end_is_refused():
    with pytest.raises(TokenAlignmentError, match="contains no turn end"):
        splice_prompt([7, END], [9, 9, 9], [9, 9, 9, END, 10], TEMPLATE)


def test_thinking_stripped_from_the_full_render_is_matched_by_count():
    """NeMo RL's Qwen3 case: the history render keeps a ``<think>`` block the full render drops once a user turn
    follows, so positions differ; turn ends are counted."""
    model = [11, 12, 99, 99, 99, 55, END]
    prefix = [11, 12, 88, 88, 88, 56, END]
    assert splice_prompt(model, prefix, [11, 12, 56, END, 70, 71, END, 40, 41], TEMPLATE) == model + [
        70,
        71,
        END,
        40,
        41,
    ]


def test_deliberate_an_empty_model_prefix_is_refused():
    """NeMo RL returns the template for an empty model prefix. A model call's prompt has at least one token, so an
    empty one is a client bug: refused, never served as if no ids were sent (at the server: a 400)."""
    with pytest.raises(TokenAlignmentError, match="is empty"):
        splice_prompt([], [9, END], [9, END, 33, 44], TEMPLATE)


def test_deliberate_a_turn_count_mismatch_is_refused():
    """NeMo RL splices a one-turn model prefix into a two-turn template prefix at its last EOS (``[100, 2]`` and
    ``[9, 2, 9, 2]`` give ``[100, 2, 77, 88]``), dropping a turn in silence; ours refuses a merged or dropped turn."""
    with pytest.raises(TokenAlignmentError, match="token history does not match"):
        splice_prompt([100, END], [9, END, 9, END], [9, END, 9, END, 77, 88], TEMPLATE)
