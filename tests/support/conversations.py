"""Conversation pieces the token-ID tests and benchmarks share: the weather tool, how a model may spell a text, and
the view of a conversation that vLLM hands a chat template.

* :data:`TOOLS` (:data:`WEATHER_TOOL`): the one function tool, ``get_weather(city)``, of every weather conversation.
* :func:`piecewise`: every word in two pieces -- ids a model may sample for a text but the template never produces
  when it encodes that text (the retokenisation the splice must survive).
* :func:`follow_up`: the message that continues a scripted weather conversation after an assistant turn.
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


def follow_up(then: str, answer: dict[str, Any]) -> dict[str, Any]:
    """After assistant message ``answer``: its first tool call's result (``then="tool"``) or the user's next
    question (``then="user"``)."""
    if then == "tool":
        call = answer["tool_calls"][0]
        city = json.loads(call["function"]["arguments"]).get("city", "?")
        return {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"city": city, "temp": 21})}
    if then == "user":
        return {"role": "user", "content": "And in Oslo?"}
    raise ValueError(f"then={then!r}: 'tool' or 'user'")


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


# Per template family: the token that ends an assistant turn in the template, and the stop tokens a model may end on.
TERMINATOR = {"qwen25": "<|im_end|>", "qwen3": "<|im_end|>", "llama3": "<|eot_id|>"}
STOP_TEXTS = {
    "qwen25": ("<|im_end|>", "<|endoftext|>"),
    "qwen3": ("<|im_end|>", "<|endoftext|>"),
    "llama3": ("<|eot_id|>", "<|end_of_text|>"),
}


def plain_messages(messages: list[dict]) -> list[dict]:
    """``messages`` without the token-id fields a client adds (what a stock server would be sent)."""
    return [{k: v for k, v in m.items() if not k.endswith("_ids") and k != "generation_log_probs"} for m in messages]


def expected_prompt(
    tokenizer: Any, family: str, turn: dict, prev: dict, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """The exact prompt ids a patched server must build for ``turn``, independent of the splice code (text level, by
    count): the previous turn's history ids + the template text after the last tokenized assistant message.
    ``tools``: as the server hands them to the template (default :data:`TOOLS`; SGLang adds its own keys)."""
    tools = TOOLS if tools is None else tools
    messages = plain_messages(turn["messages"])
    for m in messages:  # vLLM parses tool-call arguments before templating
        for call in m.get("tool_calls") or []:
            call["function"] = {**call["function"], "arguments": json.loads(call["function"]["arguments"])}
    k = max(i for i, m in enumerate(turn["messages"]) if "generation_token_ids" in m)
    full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    head = tokenizer.apply_chat_template(messages[: k + 1], tools=tools, tokenize=False, add_generation_prompt=False)
    term = TERMINATOR[family]
    cut = -1
    for _ in range(head.count(term)):  # the n-th terminator of the full text closes message k
        cut = full.index(term, cut + 1)
    history = prev["prompt"] + prev["generation"]
    stops = {tokenizer.convert_tokens_to_ids(t) for t in STOP_TEXTS[family]}
    if history[-1] in stops:
        tail = full[cut + len(term) :]
    else:  # cut by length: the template's terminator closes the turn
        tail = full[cut:]
    return history + tokenizer.encode(tail, add_special_tokens=False)
