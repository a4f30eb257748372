"""Long agentic conversations for the token-ID patch's benchmark and tests: many tool-call turns, as Gym sends them.

:func:`agentic_conversation` builds, deterministically from a seed, a coding-agent rollout in one of the tiny-model
template families (``qwen25``, ``qwen3`` with reasoning, ``llama3``): a system prompt, one task, then ``turns`` model
calls. Each call is a tool call (sometimes two in parallel, sometimes after a sentence of text) with JSON arguments
that hold quotes, backslashes, newlines and non-ASCII text; each tool answers with an output of its own length
(log-normally spread: a one-line exit status next to a file of a few hundred lines), sized so the last request's
prompt is about ``target_tokens``. The model's ids are what a model samples: the canonical encoding with some words
in two pieces (ids the template never writes), ``<tool_call>`` sometimes spelled in plain pieces, most turns ending
with the template's terminator and some with the other stop id. Every assistant message carries
``prompt_token_ids`` -- the prompt the patched server built for it (the splice of the turn before, with the history
check) -- and ``generation_token_ids``, as Gym sends them back. :attr:`AgenticConversation.requests` gives the
message list of every request of the rollout (turn ``t``'s request: everything before its assistant message), so a
benchmark can time the patch along one conversation and a test can replay it.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.support.conversations import template_view


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


AGENT_TOOLS: list[dict[str, Any]] = [
    _tool(
        "read_file",
        "Read a file of the repository, optionally a range of lines.",
        {"path": {"type": "string"}, "start_line": {"type": "integer"}, "end_line": {"type": "integer"}},
        ["path"],
    ),
    _tool(
        "run_shell",
        "Run a shell command in the sandbox and return its exit status, stdout and stderr.",
        {"command": {"type": "string"}, "timeout_s": {"type": "number"}},
        ["command"],
    ),
    _tool(
        "search_code",
        "Search the repository for a regular expression.",
        {"query": {"type": "string"}, "path_glob": {"type": "string"}, "max_results": {"type": "integer"}},
        ["query"],
    ),
    _tool(
        "write_file",
        "Write a file of the repository (the whole content).",
        {"path": {"type": "string"}, "content": {"type": "string"}},
        ["path", "content"],
    ),
]

SYSTEM = (
    "You are a software engineering agent working in a sandboxed checkout. Use the tools to inspect and change the "
    "repository; call one or two tools per turn and wait for their output. Never guess file contents."
)
TASK = "The test `tests/test_parser.py::test_unicode_escape` fails since the last release. Find out why and fix it."

_WORDS = (
    "def class return import self value parser token config path error line test assert None True False for in "
    "if else while yield async await raise from with open read write json dict list str int float bytes encode "
    "decode escape unicode café naïve Straße 数据 ключ ü ß → ≤ 0 1 2 42 3.14 -1 0x1f"
).split()
_PATHS = ("src/parser.py", "src/lexer.py", "tests/test_parser.py", "src/util/escape.py", "setup.cfg", "README.md")
_PUNCT = (
    "(",
    ")",
    ":",
    ",",
    ".",
    " = ",
    " == ",
    '"',
    "'",
    "\\n",
    "\\",
    "{",
    "}",
    "[",
    "]",
)


@dataclass(frozen=True)
class AgenticConversation:
    """The rollout's final message list and, per model call, the index of its assistant message there."""

    messages: list[dict[str, Any]]
    assistant_at: list[int]
    tools: list[dict[str, Any]]

    @property
    def requests(self) -> list[list[dict[str, Any]]]:
        """The messages of every request the rollout made: call ``t`` saw everything before its assistant message;
        the last entry is the request after the last call (the conversation as a whole)."""
        return [self.messages[:i] for i in self.assistant_at] + [self.messages]


def agentic_conversation(
    tok: Any,
    family: str,
    turns: int,
    target_tokens: int,
    *,
    splice: Callable[[list[dict[str, Any]], list[int]], list[int]],
    seed: int = 0,
) -> AgenticConversation:
    """A ``turns``-call agentic rollout whose last request renders to about ``target_tokens`` tokens (module doc).

    ``tok``: the family's Hugging Face tokenizer. ``splice(messages, full_render)``: the prompt the patched server
    builds for a request with ids (the caller's splice, history check included), so every ``prompt_token_ids`` is one
    the server produced. Deterministic in ``seed``.
    """
    rng = random.Random(seed)
    stops = _stop_ids(tok, family)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    fixed = len(_render(tok, messages, True))
    # Per call: the assistant turn (~60-120 tokens with headers) and the tool outputs' headers; the rest is output.
    per_call = {"qwen3": 170, "llama3": 45}.get(family, 75)
    output_budget = max(turns * 20, target_tokens - fixed - turns * per_call)
    weights = [math.exp(rng.gauss(0.0, 1.0)) for _ in range(turns)]
    scale = output_budget / sum(weights)
    tokens_per_char = _tokens_per_char(tok, rng)
    assistant_at: list[int] = []
    for turn in range(turns):
        full = _render(tok, messages, True)
        prompt = full if turn == 0 else splice(messages, full)
        calls = _calls(rng, turn, 2 if rng.random() < 0.2 else 1)
        text = "Let me look at that first." if rng.random() < 0.25 else ""
        reasoning = _sentence(rng, rng.randint(15, 60)) if family == "qwen3" else None
        generation = _generation(tok, family, rng, text, reasoning, calls)
        generation.append(stops[1] if rng.random() < 0.1 else stops[0])
        message: dict[str, Any] = {
            "role": "assistant",
            "content": text or None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                for call_id, name, args in calls
            ],
            "prompt_token_ids": prompt,
            "generation_token_ids": generation,
            "generation_log_probs": [-0.5] * len(generation),
        }
        if reasoning is not None:  # Gym's reasoning parser moves the think text out of the content
            message["reasoning_content"] = reasoning
        assistant_at.append(len(messages))
        messages.append(message)
        share = weights[turn] * scale / len(calls)
        for call_id, name, args in calls:
            chars = max(8, int(share / tokens_per_char))
            messages.append({"role": "tool", "tool_call_id": call_id, "content": _tool_output(rng, name, args, chars)})
    return AgenticConversation(messages, assistant_at, AGENT_TOOLS)


def _render(tok: Any, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    text = tok.apply_chat_template(
        template_view(messages), tools=AGENT_TOOLS, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    return tok.encode(text, add_special_tokens=False)


def render_ids(tok: Any, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
    """The family template's render of ``messages`` as vLLM renders it (``template_view``), with :data:`AGENT_TOOLS`."""
    return _render(tok, messages, add_generation_prompt)


def _stop_ids(tok: Any, family: str) -> tuple[int, int]:
    """(the template's terminator, the other stop id a generation may end with)."""
    names = ("<|eot_id|>", "<|end_of_text|>") if family == "llama3" else ("<|im_end|>", "<|endoftext|>")
    return tok.convert_tokens_to_ids(names[0]), tok.convert_tokens_to_ids(names[1])


def _tokens_per_char(tok: Any, rng: random.Random) -> float:
    sample = "\n".join(_code_line(rng) for _ in range(200))
    return len(tok.encode(sample, add_special_tokens=False)) / len(sample)


def _sentence(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _code_line(rng: random.Random) -> str:
    parts = [rng.choice(_WORDS) + rng.choice(_PUNCT) for _ in range(rng.randint(2, 9))]
    return " " * (4 * rng.randint(0, 3)) + "".join(parts)


def _calls(rng: random.Random, turn: int, n: int) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for i in range(n):
        name = rng.choice(("read_file", "run_shell", "search_code", "read_file", "write_file"))
        path = rng.choice(_PATHS)
        if name == "read_file":
            start = rng.randint(1, 400)
            args: dict[str, Any] = {"path": path, "start_line": start, "end_line": start + rng.randint(20, 200)}
        elif name == "run_shell":
            args = {"command": f"python -m pytest -x -q \"{path}\" -k 'unicode and not slow'", "timeout_s": 120}
        elif name == "search_code":
            args = {"query": r"def (decode|unescape)_\w+\(", "path_glob": "src/**/*.py", "max_results": 20}
        else:
            body = "\n".join(_code_line(rng) for _ in range(rng.randint(3, 12)))
            args = {"path": path, "content": f'"""Escapes: \\u00e9 → é, tab\\t."""\n{body}\n'}
        out.append((f"call_{turn}_{i}", name, args))
    return out


def _generation(
    tok: Any,
    family: str,
    rng: random.Random,
    text: str,
    reasoning: str | None,
    calls: list[tuple[str, str, dict[str, Any]]],
) -> list[int]:
    """The ids a model samples for this turn (no stop id): canonical tokens, some words split in two."""

    def sampled(s: str) -> list[int]:
        ids: list[int] = []
        for i, word in enumerate(s.split(" ")):
            piece = word if i == 0 else " " + word
            if len(piece) > 3 and rng.random() < 0.15:
                ids += tok.encode(piece[:2], add_special_tokens=False) + tok.encode(piece[2:], add_special_tokens=False)
            else:
                ids += tok.encode(piece, add_special_tokens=False)
        return ids

    def marker(s: str) -> list[int]:  # <tool_call> now and then written in plain pieces, not the added token
        if rng.random() < 0.1:
            return [t for ch in s for t in tok.encode(ch, add_special_tokens=False)]
        return tok.encode(s, add_special_tokens=False)

    ids: list[int] = []
    if reasoning is not None:
        ids += tok.encode("<think>\n", add_special_tokens=False) + sampled(reasoning)
        ids += tok.encode("\n</think>\n\n", add_special_tokens=False)
    if family == "llama3":  # Llama's JSON tool calls are the whole output
        return ids + sampled("; ".join(json.dumps({"name": n, "parameters": a}) for _, n, a in calls))
    if text:
        ids += sampled(text)
    for i, (_, name, args) in enumerate(calls):
        if i or text:
            ids += tok.encode("\n", add_special_tokens=False)
        ids += marker("<tool_call>")
        ids += sampled("\n" + json.dumps({"name": name, "arguments": args}) + "\n")
        ids += marker("</tool_call>")
    return ids


def _tool_output(rng: random.Random, name: str, args: dict[str, Any], chars: int) -> str:
    """A tool's answer of about ``chars`` characters, shaped like what the tool returns."""
    if name == "run_shell":
        head = f"exit status: {rng.choice((0, 1, 2))}\nstdout:\n"
    elif name == "search_code":
        head = json.dumps({"matches": [{"path": args.get("path_glob", "src"), "line": rng.randint(1, 900)}]}) + "\n"
    elif name == "write_file":
        return json.dumps({"written": args["path"], "bytes": len(args["content"])})
    else:
        head = f"# {args['path']} lines {args.get('start_line', 1)}-{args.get('end_line', 1)}\n"
    lines = [head]
    size = len(head)
    while size < chars:
        line = _code_line(rng)
        lines.append(line + "\n")
        size += len(line) + 1
    return "".join(lines)[: max(chars, len(head))]
