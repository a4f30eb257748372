"""The 400 a refused history gets: which message was edited, and both texts around the first difference.

When the history check (:mod:`history_check`) finds a template span of the model prefix that differs from the
history render (a :class:`Divergence`), the client needs to know which message changed and how, not token positions.
This module turns the positions into that message: the message the difference lies in (found in the decoded render
of its span) and the decoded text of both sequences on either side. It runs on the error path only, so decoding is
fine here (the walk itself never decodes, except where :mod:`same_text` must tell a retokenization from an edit). Pure.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from nemo_gym_adapter.tokens.model_turns import TurnHistory
from nemo_gym_adapter.tokens.same_text import Decode
from nemo_gym_adapter.tokens.stops import Stops

_SHOW = 16  # tokens of context on each side of a difference in error messages


class Divergence(Exception):
    """Internal: the walk found a difference it cannot explain (positions in M and X, the span's message range)."""

    def __init__(self, m: int, x: int, span: tuple[int, int], x_span_start: int, why: str = "") -> None:
        super().__init__(why)
        self.m, self.x, self.span, self.x_span_start, self.why = m, x, span, x_span_start, why


def edit_error(div: Divergence, model: Stops, rendered: Stops, history: TurnHistory, decode: Decode | None) -> str:
    """A ``TokenAlignmentError`` message naming the edited message and showing both texts around the difference."""
    index = _name_message(div, rendered, history, decode)
    role = _role(history.messages[index]) if 0 <= index < len(history.messages) else None
    who = f"messages[{index}] ({role})" if index >= 0 else "the template text"
    why = f" ({div.why})" if div.why else ""
    return (
        f"{who} differs from what the model saw{why}: it was edited in place after the model's turn, or the chat "
        "template now renders the history differently (tools or system prompt changed between turns). The splice "
        "keeps the model's own tokens for the history, so the change would be silently lost; send the history as "
        f"the model saw it, or start a new rollout. First difference: model prefix [{div.m}] {_show(model.ids, div.m, decode)}"
        f" vs history render [{div.x}] {_show(rendered.ids, div.x, decode)}"
    )


def _show(ids: list[int], at: int, decode: Decode | None) -> str:
    before, after = ids[max(0, at - _SHOW) : at], ids[at : at + _SHOW]
    if decode is None:
        return f"ids {before} | {after}"
    return f"{decode(before)!r} | {decode(after)!r}"


def _name_message(div: Divergence, rendered: Stops, history: TurnHistory, decode: Decode | None) -> int:
    """The message the difference lies in: the last message of the span whose (current) text starts at or before it
    in the decoded history render; without a decoder, the span's n-th message for the n-th unit."""
    lo, hi = div.span
    if hi <= lo:
        return -1
    if decode is not None and history.messages:
        end_i = rendered.first_from(div.x)
        end = rendered.at[end_i] + 1 if end_i < len(rendered.at) else len(rendered.ids)
        text = decode(rendered.ids[div.x_span_start : end])
        offset = len(decode(rendered.ids[div.x_span_start : div.x]))
        found, cursor = -1, 0
        for i in range(lo, hi):
            said = next(iter(_texts(history.messages[i])), "").strip()
            at = text.find(said, cursor) if said else -1
            if at < 0:
                continue
            if at > offset:
                break
            found, cursor = i, at + len(said)
        if found >= 0:
            return found
    units = rendered.first_from(div.x) - rendered.first_from(div.x_span_start)
    return min(lo + units, hi - 1)


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else getattr(message, "role", None)


def _texts(message: Any) -> Iterator[str]:
    """The message's content text(s), in order."""
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                yield part["text"]
