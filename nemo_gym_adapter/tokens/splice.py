"""The on-policy splice: the exact prompt for turn k+1 from the tokens the model saw and produced up to turn k.

NeMo Gym sends every earlier model call back as an assistant message carrying ``prompt_token_ids`` and
``generation_token_ids``. vLLM ignores those keys and re-renders the whole conversation through the chat template,
so the next prompt re-encodes text the model produced as different tokens (a word generated as two pieces and
re-encoded as one, ``<tool_call>`` spelled in plain pieces, tool-call JSON re-serialised, ``<think>`` stripped from
earlier turns, ``<|endoftext|>`` replaced by ``<|im_end|>``). Training on such a trajectory is off-policy.

The splice keeps the model's own tokens for everything up to and including the last tokenized assistant turn and
takes only what comes after it (tool outputs, user messages, later assistant messages without ids, the generation
prompt) from the normal render::

    model_prefix  = prompt_token_ids + generation_token_ids     of the last assistant message carrying ids (index k)
    prefix_render = render(messages[: k + 1], add_generation_prompt=False)
    full_render   = render(messages)                            (the request as vLLM would render it)
    n             = number of turn ends in prefix_render
    p             = position of the n-th turn end in full_render
    prompt        = model_prefix + full_render[p + 1:]   if the generation ended with a stop id (kept as generated)
                    model_prefix + full_render[p:]       otherwise (length cut, stop string: the template's terminator
                                                          is inserted)

The turn end is matched by *count*, not by position: templates that strip ``<think>`` from earlier turns (Qwen3) make
the prefix render longer than the same turns inside the full render (NeMo RL #3130).

A *turn end* is any of the template's stop ids (its terminator, the tokenizer EOS, generation-config EOS ids; probed
once per server from the chat template, :mod:`turn_template`), in all three sequences. Counting only the terminator
would break from the third turn on: when an earlier generation ended with ``<|endoftext|>`` the splice keeps it, so
the model prefix then holds one terminator fewer than the re-rendered history. Stop ids cannot occur inside a generation (the engine stops at the first), and the template writes exactly
one terminator where the model wrote one stop id, so counts stay comparable; a message removed, merged or summarised,
or a model that produced a terminator mid-generation, shows up as a count mismatch and raises ``TokenAlignmentError``
rather than guessing.

Text that *spells* a stop token (a model writing the characters ``<|im_end|>`` in its reasoning, which Qwen3's template
later strips) becomes a stop id once the template renders it, while the model's own pieces are plain tokens: the
history render then holds more turn ends than the model prefix, and -- once the reasoning is stripped -- more than
the full render too, so pure counting refused such turns (masked samples). The count may now exceed the model's by
up to the number of stop texts the assistant messages' strings contain (``TurnHistory.spelled``), and the anchor's
turn end is then located by walking both renders along the model prefix (``history_check``), not by count.

A message rewritten in place (a tool output shortened, a system prompt re-templated) keeps the count; the model's old
tokens would silently win over the edit. ``history_check`` refuses it without a second render: the model prefix is
``S_0 G_1 S_1 ... G_k``, each generation ``G_j`` at ``len(prompt_token_ids)`` of its own assistant message, and every
template span ``S_j`` between them must equal the history render's, except the generation prompt at its end. An
assistant message whose text was changed while its ids were kept follows ``assistant_edits``: ``keep_ids`` (default:
Gym documents the message-level token ids as the single source of truth) or ``refuse``.

Everything here is pure: token lists in, a new list out; no encode, linear scans only (this runs in vLLM's request
preprocessing on every turn). ``decode`` is used for error messages and the ``refuse`` policy only; ``same_text``
(an exact decode, :mod:`same_text`) only where the history differs from the render token by token, to tell a
retokenization of the same text (kept) from an edit (refused).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from nemo_gym_adapter.errors import AdapterError, TokenAlignmentError
from nemo_gym_adapter.tokens.assistant_texts import check_assistant_texts
from nemo_gym_adapter.tokens.edit_report import Divergence, edit_error
from nemo_gym_adapter.tokens.history_check import anchor_end, anchor_end_in_full, walk
from nemo_gym_adapter.tokens.model_turns import ModelTurn, TurnHistory, check_structure
from nemo_gym_adapter.tokens.same_text import Decode, SameText
from nemo_gym_adapter.tokens.stops import Stops
from nemo_gym_adapter.tokens.turn_template import TurnTemplate

# Keys NeMo Gym's vllm_model (return_token_id_information: true) puts on each assistant message it sends back.
PROMPT_IDS_KEY = "prompt_token_ids"
GENERATION_IDS_KEY = "generation_token_ids"

ASSISTANT_EDITS = ("keep_ids", "refuse")
# Ids shown on each side of a mismatch in error messages.
_WINDOW = 6
# Keys of an assistant message that are not rendered text.
_ID_KEYS = frozenset({PROMPT_IDS_KEY, GENERATION_IDS_KEY, "generation_log_probs"})


def last_tokenized_assistant(
    messages: Sequence[Mapping[str, Any]], vocab_size: int | None = None
) -> tuple[int, list[int]] | None:
    """Index of the last assistant message carrying token ids, and its model prefix.

    ``messages``: chat-completions messages as vLLM receives them (dicts). The model prefix is a new list
    ``prompt_token_ids + generation_token_ids`` (length P + G): exactly what the model saw and produced. Returns None
    when no assistant message carries ids (first turn, or a client that sends none: the caller skips the splice).
    A key holding None counts as absent. Raises ``TokenAlignmentError`` naming the message index, key and element
    when only one of the two keys is present or a value is not a list of int ids in ``[0, vocab_size)``
    (:func:`check_token_ids`; the engine's vocabulary, given by the hooks).
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        prompt = message.get(PROMPT_IDS_KEY)
        generation = message.get(GENERATION_IDS_KEY)
        if prompt is None and generation is None:
            continue
        for key, value in ((PROMPT_IDS_KEY, prompt), (GENERATION_IDS_KEY, generation)):
            _check_ids(value, f"messages[{index}].{key}", vocab_size)
        if not prompt:
            raise TokenAlignmentError(f"messages[{index}].{PROMPT_IDS_KEY} is empty: a prompt has at least one token")
        return index, [*prompt, *generation]  # type: ignore[misc]  # _check_ids rejected a None generation
    return None


def messages_through(messages: Sequence[Mapping[str, Any]], index: int) -> list[Mapping[str, Any]]:
    """``messages[: index + 1]`` as a new list, checked: in range and ending with an assistant message.

    This is the conversation to render (without a generation prompt) as ``prefix_render`` for ``splice_prompt``.
    """
    if not 0 <= index < len(messages):
        raise TokenAlignmentError(f"tokenized message index {index} is out of range for {len(messages)} messages")
    role = messages[index].get("role") if isinstance(messages[index], Mapping) else None
    if role != "assistant":
        raise TokenAlignmentError(f"messages[{index}] carries token ids but its role is {role!r}, not 'assistant'")
    return list(messages[: index + 1])


def turn_history(messages: Sequence[Mapping[str, Any]], anchor: int, stop_texts: Sequence[str] = ()) -> TurnHistory:
    """Every assistant message through ``messages[anchor]`` (the last one carrying ids): where each tokenized one's
    generation sits in the model prefix, which carry no ids, and how many stop texts each one's strings spell.

    Only the lengths of earlier ``prompt_token_ids`` are used (their ids are the model prefix's own, checked by
    ``last_tokenized_assistant`` on the anchor), so this costs the generations' lengths, not the prompts'.
    """
    turns: list[ModelTurn] = []
    unmarked: list[int] = []
    spelled: dict[int, int] = {}
    for index in range(anchor + 1):
        message = messages[index]
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        if stop_texts and (n := spelled_stops(message, stop_texts)):
            spelled[index] = n
        prompt, generation = message.get(PROMPT_IDS_KEY), message.get(GENERATION_IDS_KEY)
        if prompt is None and generation is None:
            unmarked.append(index)
            continue
        if not isinstance(prompt, (list, tuple)) or not isinstance(generation, (list, tuple)):
            key, value = (
                (PROMPT_IDS_KEY, prompt) if not isinstance(prompt, (list, tuple)) else (GENERATION_IDS_KEY, generation)
            )
            raise TokenAlignmentError(
                f"messages[{index}].{key} must be a list of token ids, got {type(value).__name__}"
            )
        turns.append(ModelTurn(index, len(prompt), generation))
    if not turns or turns[-1].index != anchor:
        raise TokenAlignmentError(f"messages[{anchor}] is not an assistant message carrying token ids")
    return TurnHistory(tuple(turns), tuple(unmarked), spelled, messages)


def spelled_stops(message: Mapping[str, Any], stop_texts: Sequence[str]) -> int:
    """How many times the message's strings (content, reasoning, tool calls; not its ids) spell one of ``stop_texts``."""
    count = 0
    pending: list[Any] = [v for k, v in message.items() if k not in _ID_KEYS]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            count += sum(value.count(t) for t in stop_texts)
        elif isinstance(value, Mapping):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
    return count


def splice_prompt(
    model_prefix: Sequence[int],
    prefix_render: Sequence[int] | Stops,
    full_render: Sequence[int] | Stops,
    template: TurnTemplate,
    history: TurnHistory | None = None,
    *,
    decode: Decode | None = None,
    assistant_edits: str = "keep_ids",
    same_text: SameText | None = None,
) -> list[int]:
    """The prompt to feed the engine: the model's own tokens, then the rendered rest of the conversation.

    ``model_prefix`` (length M): the exact tokens the model saw and produced up to the last tokenized assistant
    message (``last_tokenized_assistant``). ``prefix_render``: chat-template render of the messages up to and
    including that assistant, without a generation prompt. ``full_render`` (length F): the normal render of the whole
    request, with its generation prompt. Returns a new list ``model_prefix + full_render[p + 1:]`` (generation ended
    with a stop id, which is kept) or ``model_prefix + full_render[p:]`` (no stop id: the template's terminator is
    inserted), p = position of the anchor's turn end in ``full_render`` (the n-th turn end, n = turn ends in
    ``prefix_render``, unless assistant text spells stop tokens).

    ``history`` (``turn_history``; None when the prefix did not come from message ids): enables the in-place edit
    check of ``history_check`` (skipped for templates that do not close every turn, ``TurnTemplate.closes_turns``).
    ``decode``: token ids -> text, for error messages and ``assistant_edits="refuse"`` (then required), which also
    refuses tokenized assistant messages whose text is not what their generation ids say; ``keep_ids`` keeps the ids.
    ``same_text``: a history unit whose ids differ from the render's but that spells the same text is kept, not
    refused (without it, any difference is an edit).

    Raises ``TokenAlignmentError`` (never guesses) when the model prefix's turn count differs from the rendered
    history's (history edited, summarised, truncated or merged), a message was edited in place, or the full render
    has fewer turn ends than the prefix render. O(M + F) time; inputs are not modified.
    """
    if assistant_edits not in ASSISTANT_EDITS:
        raise AdapterError(f"assistant_edits must be one of {ASSISTANT_EDITS}, got {assistant_edits!r}")
    model_prefix = _as_list(model_prefix)
    stops = template.stop_ids
    if not model_prefix:
        raise TokenAlignmentError("the model prefix (prompt_token_ids + generation_token_ids) is empty")

    # Stop positions are found once per sequence: renders handed in as Stops (the prefix reuse built them) are reused.
    prefix = Stops.for_stops(prefix_render, stops)
    prefix_render = prefix.ids
    rendered_turns = len(prefix.at)
    if rendered_turns == 0:
        raise TokenAlignmentError(
            f"the render of the history through the last tokenized assistant message ({len(prefix_render)} ids) "
            f"contains no turn end (stop ids {sorted(stops)}); ends with {_window(prefix_render, len(prefix_render))}"
        )

    model = Stops.of(model_prefix, stops)
    ends_with_stop = model_prefix[-1] in stops
    # A generation cut by length or a stop string has no stop id: its turn still ends there.
    model_turns = len(model.at) + (0 if ends_with_stop else 1)
    # Turn ends the render holds beyond the model's: stop tokens spelled as text in assistant messages.
    extra = rendered_turns - model_turns
    if not 0 <= extra <= (history.spelled_total if history is not None else 0):
        raise TokenAlignmentError(
            _turn_mismatch_message(model_prefix, prefix_render, model_turns, rendered_turns, stops)
        )

    anchor_body = None
    keep = assistant_edits == "keep_ids"
    if history is not None and (template.closes_turns or extra):
        if not template.closes_turns:
            raise TokenAlignmentError(
                f"messages[{history.anchor.index}]: assistant text spells a stop token and this chat template does "
                "not close every turn with a stop id, so the turn boundary cannot be located"
            )
        check_structure(model_prefix, history)
        try:
            body_start, _ = walk(model, prefix, history, stops, tolerate_unmarked=keep, same_text=same_text)
        except Divergence as div:
            raise TokenAlignmentError(edit_error(div, model, prefix, history, decode)) from None
        anchor_body = (body_start, anchor_end(prefix, body_start, history)[1])
        if assistant_edits == "refuse":
            if decode is None:
                raise AdapterError("assistant_edits='refuse' needs a decode function")
            check_assistant_texts(history, decode, stops)

    full = Stops.for_stops(full_render, stops)
    full_render = full.ids
    if len(full.at) < rendered_turns - extra:
        raise TokenAlignmentError(
            f"the full render has {len(full.at)} turn ends but the history through the last tokenized assistant "
            f"message has {rendered_turns}; full render ({len(full_render)} ids) ends with "
            f"{_window(full_render, len(full_render))}"
        )
    if extra == 0:
        p = full.at[rendered_turns - 1]
    else:
        # Assistant text spelled stop tokens: counts no longer line up, walk the full render like the history render.
        assert history is not None and anchor_body is not None  # extra > 0 needs history.spelled, checked above
        try:
            full_body, _ = walk(model, full, history, stops, tolerate_unmarked=keep, same_text=same_text)
        except Divergence as div:
            raise TokenAlignmentError(
                "the full render does not contain the history the way the history render does: "
                + edit_error(div, model, full, history, decode)
            ) from None
        anchor = history.anchor
        p = anchor_end_in_full(full, full_body, prefix, anchor_body, history.spelled.get(anchor.index, 0), anchor.index)
    return model_prefix + full_render[p + 1 if ends_with_stop else p :]


# --------------------------------------------------------------------------------------------------------------------
# helpers


# The largest id any engine's embedding table could take (int64); the bound when the vocabulary is not known.
_MAX_ID = 2**63
_SHOWN_CHARS = 40  # of a bad id's repr in an error (a 10 MB string is not echoed back)


def check_token_ids(value: object, where: str, vocab_size: int | None = None) -> None:
    """Raise ``TokenAlignmentError`` naming ``where[i]`` unless ``value`` is a list (or tuple) of int token ids in
    ``[0, vocab_size)`` (``[0, 2**63)`` when the vocabulary is not known).

    Once per request, on every route that carries ids (chat, ``/tokenize``, the required prefix), so a refusal is the
    same 400 wherever the ids come in, before the engine sees them. JSON booleans are refused: ``true`` is an ``int``
    subclass in Python and would become token 1. Three C-level passes (element types, min, max); the per-element scan
    runs only to name the bad element.
    """
    if not isinstance(value, (list, tuple)):
        raise TokenAlignmentError(f"{where} must be a list of token ids, got {type(value).__name__}")
    if not value:
        return
    if set(map(type, value)) != {int}:
        bad = next(i for i, t in enumerate(value) if type(t) is not int)
        shown = repr(value[bad])[:_SHOWN_CHARS]
        raise TokenAlignmentError(
            f"{where}[{bad}] must be a non-negative int token id, got {shown} ({type(value[bad]).__name__})"
        )
    limit = _MAX_ID if vocab_size is None else vocab_size
    if min(value) < 0 or max(value) >= limit:  # every element is an int (checked above)
        bad = next(i for i, t in enumerate(value) if not 0 <= t < limit)
        if value[bad] < 0 or vocab_size is None:
            raise TokenAlignmentError(f"{where}[{bad}] must be a non-negative int token id, got {value[bad]}")
        raise TokenAlignmentError(
            f"{where}[{bad}] = {value[bad]} is out of vocabulary: the model's token ids are 0..{vocab_size - 1}"
        )


_check_ids = check_token_ids  # the name the splice's own callers use


def _as_list(ids: Sequence[int]) -> list[int]:
    # Lists are used as is (never modified: slicing and + build new lists); anything else is copied once.
    return ids if isinstance(ids, list) else list(ids)


def _count(ids: list[int], stops: frozenset[int]) -> int:
    return sum(ids.count(s) for s in stops)


def _window(ids: list[int], at: int) -> str:
    """Ids around position ``at`` (the id at ``at`` bracketed), for error messages; decode-free."""
    lo, hi = max(0, at - _WINDOW), min(len(ids), at + _WINDOW + 1)
    shown = [f">{t}<" if i == at else str(t) for i, t in enumerate(ids[lo:hi], start=lo)]
    return f"[{'... ' if lo else ''}{', '.join(shown)}{' ...' if hi < len(ids) else ''}] (index {at})"


def _turn_mismatch_message(
    model_prefix: list[int], prefix_render: list[int], model_turns: int, rendered_turns: int, stops: frozenset[int]
) -> str:
    # Error path only: the extra scans here cost nothing on the hot path.
    last = model_prefix[-1]
    ending = f"stop id {last}" if last in stops else f"id {last}, no stop id (cut by length or a stop string)"
    # Where the two first differ: an edited early message shows here; otherwise it is the first re-encoded assistant
    # turn (expected to differ) and the count is what matters.
    first = next((i for i, (a, b) in enumerate(zip(model_prefix, prefix_render, strict=False)) if a != b), None)
    if first is None:
        first = min(len(model_prefix), len(prefix_render))
    return (
        f"token history does not match the conversation: the model prefix has {model_turns} turns "
        f"({len(model_prefix)} ids, ends with {ending}) but the rendered history through the last tokenized "
        f"assistant message has {rendered_turns} ({len(prefix_render)} ids; turn ends = stop ids {sorted(stops)}). "
        "Was the conversation edited, summarised or truncated, or were two model calls merged into one message? "
        f"First difference: model {_window(model_prefix, first)} vs rendered {_window(prefix_render, first)}"
    )
