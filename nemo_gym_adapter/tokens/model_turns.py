"""What a conversation's assistant messages say about the model prefix: :class:`ModelTurn`, :class:`TurnHistory`,
and the structural check that their ids belong to one history.

Gym sends every model call back as an assistant message carrying ``prompt_token_ids`` and ``generation_token_ids``.
The splice anchors at the last such message; its prompt + generation is the model prefix ``M``, and each earlier
tokenized message's generation ``G_j`` sits in ``M`` at ``len(prompt_token_ids)`` of its own message, because every
later prompt starts with every earlier prompt + generation. The history check (:mod:`history_check`) walks ``M``
span by span between those generations; this module holds what it walks along (built from the messages by
``splice.turn_history``) and :func:`check_structure`, which verifies the generations really are where their prompts
put them before anything is compared. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_gym_adapter.errors import TokenAlignmentError


@dataclass(frozen=True)
class ModelTurn:
    """An assistant message carrying ids: its message ``index``, where its generation starts in the model prefix
    (``start`` = ``len(prompt_token_ids)``) and the ``generation`` ids themselves."""

    index: int
    start: int
    generation: Sequence[int]

    @property
    def end(self) -> int:
        return self.start + len(self.generation)


@dataclass(frozen=True)
class TurnHistory:
    """What the messages through the splice anchor say about the model prefix (built by ``splice.turn_history``).

    ``turns``: assistant messages carrying ids, in order, the anchor last. ``unmarked``: assistant messages without
    ids before the anchor. ``spelled``: per assistant message index, how many stop-token texts its strings contain
    (an upper bound of the extra turn ends its rendering may hold). ``messages``: for error messages only.
    """

    turns: tuple[ModelTurn, ...]
    unmarked: tuple[int, ...] = ()
    spelled: Mapping[int, int] = field(default_factory=dict)
    messages: Sequence[Any] = ()

    @property
    def anchor(self) -> ModelTurn:
        return self.turns[-1]

    @property
    def spelled_total(self) -> int:
        return sum(self.spelled.values())


def check_structure(model_prefix: list[int], history: TurnHistory) -> None:
    """Each tokenized turn's generation must sit where its own ``prompt_token_ids`` length puts it in the model prefix.

    Gym sends every model call's ids back on its message, and each later prompt starts with every earlier prompt +
    generation, so this holds for any history built by the patched server. Cost: the generations' lengths.
    """
    turns = history.turns
    if turns[-1].end != len(model_prefix):
        raise TokenAlignmentError("internal: the splice anchor is not the last turn of its history")
    previous_end = 0
    for turn in turns[:-1]:
        where = f"messages[{turn.index}]"
        if turn.start < previous_end or turn.end > turns[-1].start:
            raise TokenAlignmentError(
                f"{where}: its prompt_token_ids ({turn.start} ids) and generation_token_ids ({len(turn.generation)}) "
                f"do not fit in front of the later turns (the next generation starts at {turns[-1].start}): the "
                "token ids on the assistant messages do not belong to one history"
            )
        if model_prefix[turn.start : turn.end] != list(turn.generation):
            raise TokenAlignmentError(
                f"{where}.generation_token_ids are not at position {turn.start} of messages[{turns[-1].index}]."
                "prompt_token_ids, where the model generated them: the history was not built by the patched server "
                "from these messages (ids copied from another conversation, or an earlier turn served unpatched)"
            )
        previous_end = turn.end
