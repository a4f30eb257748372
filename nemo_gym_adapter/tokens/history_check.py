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
naming the message and showing both texts (:mod:`edit_report`). One slice comparison per span, bisect lookups in
stop positions found once per sequence (:class:`~nemo_gym_adapter.tokens.stops.Stops`): linear in the prompt length
and in the number of turns; the binary search for the first difference runs only where spans differ.

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

from collections.abc import Collection

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.edit_report import Divergence
from nemo_gym_adapter.tokens.model_turns import TurnHistory
from nemo_gym_adapter.tokens.same_text import SameText
from nemo_gym_adapter.tokens.stops import Stops, first_difference


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
    spans = _unmarked_per_span(history)  # one pass, not one per turn: linear in the number of turns too
    for j, turn in enumerate(history.turns):
        unmarked = spans[j]
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


def _unmarked_per_span(history: TurnHistory) -> list[list[int]]:
    """The id-less assistant messages of each span (between one tokenized turn and the next), in one pass."""
    out: list[list[int]] = [[] for _ in history.turns]
    j = 0
    for i in sorted(history.unmarked):
        while j < len(history.turns) and history.turns[j].index < i:
            j += 1
        if j < len(history.turns):  # after the anchor: not in any span
            out[j].append(i)
    return out


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
