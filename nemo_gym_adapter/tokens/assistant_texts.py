"""Assistant messages edited while their token ids were kept: the ``assistant_edits="refuse"`` policy of the splice.

The walk of :mod:`history_check` never compares assistant bodies (they are legitimately re-encoded), so an assistant
message whose text a client rewrote but whose ``generation_token_ids`` it kept passes there: under the default
``keep_ids`` policy the ids win, as Gym documents. ``refuse`` instead decodes every kept generation and checks the
message still says it. Apart from :mod:`history_check` because it is a different comparison (decoded text, not token
spans), opt-in and off the hot path: it decodes, the walk never does.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.model_turns import TurnHistory
from nemo_gym_adapter.tokens.same_text import Decode


def check_assistant_texts(history: TurnHistory, decode: Decode, stop_ids: Collection[int]) -> None:
    """Refuse a tokenized assistant message whose content or tool calls are not what its ``generation_token_ids``
    say. Compared like Gym's own lineage fingerprint (``nemo_gym.token_id_capture.fingerprint``): content text and
    tool calls (name, arguments as JSON), reasoning ignored (harnesses may drop it); whitespace-insensitive, since
    parsers strip it and templates re-serialise JSON. Decodes every generation: opt-in, not on the default path."""
    for turn in history.turns:
        generation = list(turn.generation)
        if generation and generation[-1] in stop_ids:
            generation = generation[:-1]
        said = decode(generation)
        squeezed = _squeeze(said)
        for where, variants in _claims(history.messages[turn.index]):
            if not any(_squeeze(v) in squeezed for v in variants):
                raise TokenAlignmentError(
                    f"messages[{turn.index}].{where} is not what its generation_token_ids say (assistant_edits=refuse:"
                    " an assistant message edited while its token ids were kept): message "
                    f"{variants[0][:200]!r} vs generated {said[:400]!r}"
                )


def _claims(message: Any) -> Iterator[tuple[str, list[str]]]:
    if not isinstance(message, Mapping):
        return
    content = message.get("content")
    if isinstance(content, str) and content.strip():
        yield "content", [content]
    elif isinstance(content, list):
        for i, part in enumerate(content):
            if isinstance(part, Mapping) and isinstance(part.get("text"), str) and part["text"].strip():
                yield f"content[{i}].text", [part["text"]]
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        if isinstance(function.get("name"), str):
            yield f"tool_calls[{i}].function.name", [function["name"]]
        arguments = function.get("arguments")
        if arguments not in (None, "", {}):
            yield f"tool_calls[{i}].function.arguments", _json_variants(arguments)


def _json_variants(value: Any) -> list[str]:
    """The arguments as sent, and re-serialised both ways (a model may write ``\\u00e9`` or ``é``)."""
    out = [value] if isinstance(value, str) else []
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
        out += [json.dumps(parsed, ensure_ascii=False), json.dumps(parsed)]
    except (TypeError, ValueError):
        pass
    return out or [str(value)]


def _squeeze(text: str) -> str:
    return "".join(text.split())
