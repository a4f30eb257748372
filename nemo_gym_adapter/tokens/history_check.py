"""In-place edits of the kept history, found without a second render: the model prefix walked along the history render.

The splice keeps the model's own tokens for everything up to the last tokenized assistant message, so whatever a
client changed there after the model saw it -- a tool output shortened in place, a system prompt re-templated, a user
message rewritten -- would silently lose to the old tokens. Counting turn ends (``splice``) catches a dropped or
injected turn, not an edit that keeps the count. This module compares the two sequences the splice already has:

- the model prefix ``M`` = ``prompt_token_ids + generation_token_ids`` of the last tokenized assistant message, which
  is, turn by turn, ``S_0 G_1 S_1 G_2 ... S_{k-1} G_k``: the generations ``G_j`` sit at ``len(prompt_token_ids)`` of
  their own assistant message (Gym sends every model call's ids back on its message), and every ``S_j`` in between is
  template text the patched server rendered then (system, user and tool messages, turn ends, generation prompt);
- the history render ``X`` of the same messages (``render(messages[:k+1])`` or the full render), in which each
  assistant turn is re-encoded text that legitimately differs from ``G_j`` (retokenization, re-rendered tool calls,
  stripped ``<think>``, the template's terminator where the model stopped with another stop id or none).

Each ``S_j`` must equal its counterpart in ``X`` token for token, except inside its last unit (what follows its last
turn end: the generation prompt, which the history writes as the assistant header followed by the message body, maybe
tokenized differently at the seam). Between spans, ``X`` skips the assistant body to its turn end. A difference
anywhere else is an edit (or a template that now renders the history differently) and raises ``TokenAlignmentError``
naming the message and showing both texts. One slice comparison per span, bisect lookups in precomputed stop
positions: linear in the prompt length; the binary search for the first difference runs only where spans differ.

Legitimate differences and why they pass: retokenized generations, re-rendered tool calls and stripped reasoning are
inside ``G_j``/the assistant body, never compared; a generation ending in another stop id (Qwen's ``<|endoftext|>``,
Llama 3's ``<|end_of_text|>`` where the template writes ``<|eot_id|>``) or in none (length cut; the splice inserted the
template's terminator) shifts where ``S_j`` starts, accounted for per turn; the generation prompt vs the assistant
header (Qwen3's empty think block with ``enable_thinking=false``) is the tolerated last unit.

Assistant messages without ids before the anchor: in Gym 0.7 every model call carries its ids, so such a message was
written by the client and the template rendered it into ``S_j`` -- compared like any message. A message whose unit in
``M`` starts with the generation prompt was however produced by the model (a client that dropped its ids): with
``tolerate_unmarked=True`` (the ``keep_ids`` policy) up to one such unit per id-less assistant message of the span may
differ and is skipped to its turn end like a tokenized turn. Assumption: every message is closed by a turn end
(ChatML, Llama 3, Gemma); ``TurnTemplate.closes_turns`` is False otherwise and the caller skips the check.

A text that spells a stop token (a model writing ``<|im_end|>`` in its reasoning) becomes a stop id when the template
renders it, so an assistant body in ``X`` may hold more turn ends than the generation. ``spelled`` bounds how many per
message; the right one is the candidate after which ``X`` continues like ``M``.

Retokenized, not edited: a unit (from one turn end to the next) whose ids differ but that spells the same text with
the same special tokens (:class:`~nemo_gym_adapter.tokens.same_text.SameText`, given as ``same_text``) is the history
the model saw in other tokens, not an edit; the walk continues after it and the model's ids are kept. Each differing
unit is decoded at most once, so the walk stays linear. Without ``same_text`` any difference is an edit.

Assistant bodies are never compared here; an assistant message whose text was edited while its ids were kept is
the ``refuse`` policy's business (:mod:`assistant_texts`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.same_text import Decode, SameText

_SHOW = 16  # tokens of context on each side of a difference in error messages


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


class Divergence(Exception):
    """Internal: the walk found a difference it cannot explain (positions in M and X, the span's message range)."""

    def __init__(self, m: int, x: int, span: tuple[int, int], x_span_start: int, why: str = "") -> None:
        super().__init__(why)
        self.m, self.x, self.span, self.x_span_start, self.why = m, x, span, x_span_start, why


@dataclass(frozen=True)
class Stops:
    """A token sequence with the sorted positions of its stop ids (``splice.stop_positions``)."""

    ids: list[int]
    at: list[int]

    def first_from(self, pos: int) -> int:
        """Index into ``at`` of the first stop at or after ``pos``."""
        return bisect_left(self.at, pos)

    def last_before(self, pos: int, floor: int) -> int:
        """Position of the last stop in ``[floor, pos)``, or -1."""
        i = bisect_left(self.at, pos) - 1
        return self.at[i] if i >= 0 and self.at[i] >= floor else -1


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


def walk(
    model: Stops,
    rendered: Stops,
    history: TurnHistory,
    stop_ids: Collection[int],
    *,
    tolerate_unmarked: bool,
    same_text: SameText | None = None,
) -> tuple[int, list[int]]:
    """Walk ``rendered`` along ``model`` (see the module docstring). Returns where the anchor's body starts in
    ``rendered`` and the position of every earlier tokenized turn's end there. Raises ``Divergence``; a unit
    ``same_text`` says spells the same text is not one."""
    m = x = 0
    first_message = 0
    ends: list[int] = []
    for j, turn in enumerate(history.turns):
        unmarked = [i for i in history.unmarked if first_message <= i < turn.index]
        spelled = sum(history.spelled.get(i, 0) for i in unmarked)
        span = (first_message, turn.index)
        tolerate = len(unmarked) if tolerate_unmarked else 0
        x = _match_span(model, rendered, m, turn.start, x, tolerate, spelled, span, same_text)
        if j == len(history.turns) - 1:
            return x, ends
        ended = bool(turn.generation) and turn.generation[-1] in stop_ids
        # A generation without a stop id got the template's terminator inserted: the next span starts with it.
        resume = 1 if ended else 0
        next_start = history.turns[j + 1].start
        end = _turn_end(model, rendered, x, history.spelled.get(turn.index, 0), turn.end, resume, next_start, span)
        ends.append(end)
        m, x, first_message = turn.end, end + resume, turn.index + 1
    raise TokenAlignmentError("internal: empty turn history")


def anchor_end(rendered: Stops, body_start: int, history: TurnHistory) -> tuple[int, int]:
    """(first, last) turn end in ``rendered`` after the anchor's body starts; the history render holds exactly the
    anchor's body after it, so the last one is the anchor's turn end and the others are stop texts it spells."""
    i = rendered.first_from(body_start)
    extra = len(rendered.at) - i - 1
    if extra < 0 or extra > history.spelled.get(history.anchor.index, 0):
        found = len(rendered.at) - i
        raise TokenAlignmentError(
            f"the rendered history has {found} turn ends after messages[{history.anchor.index}] begins, where its "
            f"text explains 1 + {history.spelled.get(history.anchor.index, 0)}: was a message appended to it?"
        )
    return rendered.at[i], rendered.at[-1]


def anchor_end_in_full(
    full: Stops, body_start: int, prefix: Stops, prefix_body: tuple[int, int], spelled: int, index: int
) -> int:
    """The anchor's turn end in the full render when its text spells stop tokens (rare): the candidate whose body
    matches the history render's (same rendering), else the unique one whose body is a suffix of it (the template
    dropped its reasoning once later messages followed) and that is followed by the same post-turn text."""
    start, end = prefix_body  # anchor body in the prefix render: [start, end], end = its turn end
    body = prefix.ids[start : end + 1]
    if full.ids[body_start : body_start + len(body)] == body:
        return body_start + len(body) - 1
    post = prefix.ids[end + 1 :]
    i = full.first_from(body_start)
    fits = []
    for c in full.at[i : i + spelled + 1]:
        n = max(c - body_start - 1, 0)  # the body's first token may merge with the header differently: not compared
        if n <= end - start and full.ids[body_start + 1 : c] == prefix.ids[end - n : end]:
            if full.ids[c + 1 : c + 1 + len(post)] == post:
                fits.append(c)
    if len(fits) == 1:
        return fits[0]
    raise TokenAlignmentError(
        f"cannot tell where messages[{index}] ends in the full render: its text spells a stop token and the template "
        f"renders it differently once later messages follow ({len(fits)} candidate turn ends)"
    )


def _match_span(
    model: Stops,
    rendered: Stops,
    m: int,
    m_end: int,
    x: int,
    tolerate: int,
    spelled: int,
    span: tuple[int, int],
    same_text: SameText | None = None,
) -> int:
    """Match ``model.ids[m:m_end]`` (a span of template text) at ``rendered`` position ``x``; return where the next
    assistant body starts in ``rendered``. Raises ``Divergence`` at a difference outside the span's last unit that
    is not a retokenization of the same text (:func:`_retokenized_unit`)."""
    M, X = model.ids, rendered.ids
    x_span_start = x
    last = model.last_before(m_end, m)  # the span's last turn end; after it: the generation prompt
    while True:
        n = m_end - m
        if X[x : x + n] == M[m:m_end]:
            return x + n
        d = first_difference(M, m, X, x, n)
        if m + d > last:
            return x + d
        if same_text is not None and (resumed := _retokenized_unit(model, rendered, m, x, d, same_text)):
            m, x = resumed  # the same characters in other tokens: not an edit, the model's ids stay
            continue
        if tolerate and _is_model_turn(M, model.last_before(m + d, m), m, last, m_end):
            # An assistant turn the model generated whose ids the client dropped: skip it like a tokenized one.
            tolerate -= 1
            own_end = model.at[model.first_from(m + d)]
            end = _turn_end(model, rendered, x + d, spelled, own_end + 1, 1, m_end, span, x_span_start)
            m, x = own_end + 1, end + 1
            continue
        raise Divergence(m + d, x + d, span, x_span_start)


def _retokenized_unit(
    model: Stops, rendered: Stops, m: int, x: int, d: int, same_text: SameText
) -> tuple[int, int] | None:
    """Where to resume (after the unit's turn end, in both) when the unit holding the first difference (at ``m + d``
    and ``x + d``; equal before it) ends with the same stop id in both and spells the same text; else None. A unit
    runs from the previous turn end (given to ``same_text`` as left context) or the span start, to the next turn end."""
    start = model.last_before(m + d, m)  # the common turn end before the unit, else the token before the span
    if start < 0:
        start = m - 1 if m and x and model.ids[m - 1] == rendered.ids[x - 1] else m
    i, j = model.first_from(m + d), rendered.first_from(x + d)
    if i >= len(model.at) or j >= len(rendered.at):
        return None
    m_stop, x_stop = model.at[i], rendered.at[j]
    if model.ids[m_stop] != rendered.ids[x_stop]:
        return None
    if not same_text(model.ids[start:m_stop], rendered.ids[x + (start - m) : x_stop]):
        return None
    return m_stop + 1, x_stop + 1


def _is_model_turn(M: list[int], unit_stop: int, m: int, last: int, m_end: int) -> bool:
    """Does the unit after ``unit_stop`` (or from ``m``) start with the span's generation prompt, i.e. did the model
    write what follows it?"""
    prompt = M[last + 1 : m_end]
    start = unit_stop + 1 if unit_stop >= 0 else m
    return bool(prompt) and M[start : start + len(prompt)] == prompt


def _turn_end(
    model: Stops,
    rendered: Stops,
    x: int,
    spelled: int,
    m_resume: int,
    resume: int,
    m_limit: int,
    span: tuple[int, int],
    x_span_start: int | None = None,
) -> int:
    """The turn end of an assistant body starting at ``x`` in ``rendered``: the first stop, or -- when its text spells
    stop tokens -- the first of up to ``spelled + 1`` candidates after which ``rendered`` continues like ``model``
    from ``m_resume`` (through the next unit)."""
    i = rendered.first_from(x)
    candidates = rendered.at[i : i + spelled + 1]
    if not candidates:
        raise Divergence(
            m_resume,
            len(rendered.ids),
            span,
            x if x_span_start is None else x_span_start,
            "the rendered history ends inside an assistant turn",
        )
    if len(candidates) == 1:
        return candidates[0]
    k = model.first_from(m_resume + 1)
    stop = model.at[k] if k < len(model.at) else len(model.ids) - 1
    width = min(stop + 1, m_limit) - m_resume
    want = model.ids[m_resume : m_resume + width]
    for c in candidates:
        if rendered.ids[c + resume : c + resume + width] == want:
            return c
    return candidates[0]


def first_difference(a: list[int], i: int, b: list[int], j: int, n: int) -> int:
    """Smallest ``d <= n`` with ``a[i + d] != b[j + d]`` (``b`` may end first). Slice comparisons halve the range:
    O(n) element comparisons in C, no Python loop over tokens."""
    n = max(0, min(n, len(b) - j))
    lo, hi = 0, n
    if a[i : i + n] == b[j : j + n]:
        return n
    while hi - lo > 16:
        mid = (lo + hi) // 2
        if a[i + lo : i + mid] == b[j + lo : j + mid]:
            lo = mid
        else:
            hi = mid
    return next((d for d in range(lo, hi) if a[i + d] != b[j + d]), hi)


# --------------------------------------------------------------------------------------------------------------------
# error messages (error path only: decoding is fine here)


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
