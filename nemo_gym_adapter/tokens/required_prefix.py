"""``required_prefix_token_ids`` alone as the model prefix: a conversation with no assistant message (issue 19 item 1).

Gym's prefix supply (``vllm_model`` ``supply_prefix_token_ids``) and NeMo RL's OpenAI server both accept a request
field ``required_prefix_token_ids``: the exact tokens the prompt must start with. When assistant messages carry ids,
the splice (:mod:`splice`) builds the prompt from them and the hook checks that the required prefix starts it; with an
id-less assistant message the required prefix is anchored at that message. This module covers the remaining shape,
NeMo RL's merged-tokens case: no assistant message at all, the required prefix covering the conversation up to some
point -- a turn end, or inside a message (NeMo RL's test ends it inside the user text, with " Skinny" in two tokens
where the template's render has one).

The token math is the splice's, without a prefix render: with no assistant message nothing is rendered differently
later (no reasoning stripped, no tool call re-serialised), so the full render is the reference::

    n      = stop ids in the prefix, + 1 when it does not end with one (a turn cut inside)
    p      = the n-th turn end of the full render
    prompt = required + full_render[p + 1:]   (the prefix ends with a stop id: kept)
             required + full_render[p:]       (it ends inside a turn: the template's turn end is inserted)

The prefix must *spell* the render up to there: the same text with the same special tokens, in any split
(:class:`~nemo_gym_adapter.tokens.same_text.SameText`). So a retokenized word passes with the client's ids kept, while
an edited, truncated or extended message is refused (NeMo RL's server would cut the message at the prefix's end in
silence). Cost: one comparison of the two sequences; a decode of the tail from their last common turn end only where
they differ. Pure; imported by :mod:`nemo_gym_adapter.tokens.anchor` (both backends splice through it).
"""

from __future__ import annotations

from collections.abc import Sequence

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.same_text import SameText
from nemo_gym_adapter.tokens.stops import first_difference, stop_positions
from nemo_gym_adapter.tokens.turn_template import TurnTemplate

KEY = "required_prefix_token_ids"
_SHOW_CHARS = 60  # characters of each text shown when the prefix does not spell the conversation


def splice_required_prefix(
    required: Sequence[int], full_render: Sequence[int], template: TurnTemplate, *, same_text: SameText | None
) -> list[int]:
    """The prompt for a request whose only model prefix is ``required`` (see the module docstring).

    ``full_render``: the request rendered as vLLM would (with its generation prompt). ``same_text``: the exact-decode
    comparison; None accepts only a prefix equal to the render token for token. Raises ``TokenAlignmentError`` when
    the prefix is empty, holds more turns than the conversation renders, or does not spell the conversation up to
    its turn ``n``.
    """
    required, full = list(required), list(full_render)
    if not required:
        raise TokenAlignmentError(f"{KEY} is empty")
    stops = template.stop_ids
    ends_with_stop = required[-1] in stops
    turns = len(stop_positions(required, stops)) + (0 if ends_with_stop else 1)
    full_at = stop_positions(full, stops)
    if turns > len(full_at):
        raise TokenAlignmentError(
            f"{KEY} holds {turns} turns ({len(required)} ids) but the conversation renders {len(full_at)} turn ends: "
            "the prefix is longer than the conversation (messages missing from the request?)"
        )
    p = full_at[turns - 1]
    mine = required[: len(required) - 1] if ends_with_stop else required  # the text before the n-th turn end
    theirs = full[:p]
    if ends_with_stop and required[-1] != full[p]:
        raise TokenAlignmentError(
            f"{KEY} ends with stop id {required[-1]} where the conversation's turn {turns} ends with {full[p]}"
        )
    d = first_difference(mine, 0, theirs, 0, len(mine))
    if d < len(mine) or len(mine) != len(theirs):
        # The tail from the last turn end both share (given as left context); before it they are equal.
        start = max(stop_positions(mine[:d], stops), default=0)
        if same_text is None or not same_text(mine[start:], theirs[start:]):
            raise TokenAlignmentError(_not_spelled(mine[start:], theirs[start:], turns, same_text))
    return required + full[p + 1 if ends_with_stop else p :]


def _not_spelled(mine: list[int], theirs: list[int], turns: int, same_text: SameText | None) -> str:
    if same_text is None:
        shown = f"ids ...{mine[-8:]} vs ...{theirs[-8:]}"
    else:
        shown = f"{same_text.decode(mine)[-_SHOW_CHARS:]!r} vs {same_text.decode(theirs)[-_SHOW_CHARS:]!r}"
    return (
        f"{KEY} does not spell the conversation up to its turn {turns}: the request's messages say something else "
        f"there (edited, truncated or extended since the prefix was taken); prefix vs conversation: {shown}"
    )
