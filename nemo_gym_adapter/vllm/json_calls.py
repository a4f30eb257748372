"""Tool calls written as JSON, the way small instruct models write them when the chat template asks for
``<tool_call>`` tags they never learned to emit: a bare ``{"name": ..., "arguments": {...}}``, the same inside a
```json fence or inside ``<tool_call>`` tags, or a list of them. Pure text in, calls out: no vLLM here (the vLLM
class around it is :mod:`nemo_gym_adapter.vllm.tool_parser`).

The rule. Every top-level JSON value in the text is decoded once (``json.JSONDecoder.raw_decode`` from each ``{`` /
``[`` not inside a value already decoded); a value is a call when it is an object with a non-empty string ``name`` and
an ``arguments`` (or Llama-style ``parameters``) member, or a list whose items are all such objects. Anything else --
prose, an echo of the ``<tools>`` schema (an object without ``name`` at its top), broken JSON -- is content, never a
call, and never an error: a call the model wrote badly is the model's mistake, and the environment scores the turn
(no call made). The content is the text with the calls and the fences or tags that wrapped only them removed.

Arguments go out as JSON text, as the OpenAI API carries them: an object is serialised (``ensure_ascii=False``), a
string is passed as written (the agent reports arguments that do not parse back to the model, e.g. Gym's
``simple_agent``: "Invalid tool call arguments").
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_DECODER = json.JSONDecoder()
_START = re.compile(r"[\[{]")
# A fence or a <tool_call> pair left empty once its calls are cut out.
_EMPTY_WRAPPERS = re.compile(r"```[a-zA-Z]*\s*```|<tool_call>\s*</tool_call>")


@dataclass(frozen=True)
class JsonCall:
    """One call: the function's name and its arguments as JSON text."""

    name: str
    arguments: str


def _call(value: Any) -> JsonCall | None:
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    for key in ("arguments", "parameters"):
        if key in value:
            args = value[key]
            text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            return JsonCall(name=name, arguments=text)
    return None


def _calls(value: Any) -> list[JsonCall]:
    """The calls a decoded JSON value is (empty when it is not one call or a list of only calls)."""
    if isinstance(value, list):
        calls = [_call(v) for v in value]
        return [c for c in calls if c is not None] if value and all(calls) else []
    one = _call(value)
    return [one] if one is not None else []


def parse_json_calls(text: str) -> tuple[str | None, list[JsonCall]]:
    """(content, calls) of a model's output; content is None when nothing but calls (and their wrappers) was
    written. Never raises on any string."""
    calls: list[JsonCall] = []
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        match = _START.search(text, pos)
        if match is None:
            break
        start = match.start()
        try:
            value, end = _DECODER.raw_decode(text, start)
        except (ValueError, RecursionError):
            pos = start + 1  # not JSON from here: try the next brace
            continue
        found = _calls(value)
        if found:
            calls.extend(found)
            spans.append((start, end))
        pos = end  # a decoded value's insides are never read again (a schema echo's nested "name")
    if not calls:
        return text, []
    kept, last = [], 0
    for start, end in spans:
        kept.append(text[last:start])
        last = end
    kept.append(text[last:])
    content = _EMPTY_WRAPPERS.sub("", "".join(kept)).strip()
    return (content or None), calls
