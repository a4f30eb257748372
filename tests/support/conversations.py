"""Conversation pieces the token-ID tests and benchmarks share: the weather tool, how a model may spell a text, and
the view of a conversation that vLLM hands a chat template.

* :data:`TOOLS` (:data:`WEATHER_TOOL`): the one function tool, ``get_weather(city)``, of every weather conversation.
* :func:`piecewise`: every word in two pieces -- ids a model may sample for a text but the template never produces
  when it encodes that text (the retokenisation the splice must survive).
* :func:`template_view`: messages as vLLM's chat parser passes them to the template: known keys only (token ids and
  log-probs never reach it), tool-call arguments parsed from their JSON string.
"""

from __future__ import annotations

import json
from typing import Any

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOLS = [WEATHER_TOOL]
TEMPLATE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning", "reasoning_content")


def piecewise(tok: Any, text: str) -> list[int]:
    """Ids a model might produce for ``text``: every word spelled in two pieces (never how the template encodes)."""
    ids: list[int] = []
    for i, word in enumerate(text.split(" ")):
        piece = word if i == 0 else " " + word
        ids += tok.encode(piece[:2], add_special_tokens=False) + tok.encode(piece[2:], add_special_tokens=False)
    return ids


def template_view(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What vLLM passes to the chat template: known keys only, tool-call arguments parsed from JSON."""
    out = []
    for m in messages:
        view = {k: m[k] for k in TEMPLATE_KEYS if k in m}
        if view.get("tool_calls"):
            view["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                for c in view["tool_calls"]
            ]
        out.append(view)
    return out
