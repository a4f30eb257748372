"""The rows of the latency toy (``configs/gym/toy_latency.yaml``, our Gym server ``gym_servers/resources_servers/
toy_latency``), deterministic:

    python scripts/make_toy_latency_data.py [--out configs/gym/data]

writes ``toy_latency.jsonl`` (32 training rows) and ``toy_latency_val.jsonl`` (8 held-out words). Each row asks for a
word's code with two tools, ``lookup_code(word)`` and ``submit_code(code)``, and its ``expected_code`` is what the
server's lookup answers. Like toy_lookup, every reply is one of three tool calls through vLLM structured output (Gym's
vllm_model merges ``metadata.extra_body`` into each chat request): look the word up, submit the right code, or submit
-1; with ``simple_agent`` ``max_steps: 2`` each rollout makes two model calls and two tool calls, and earns 1 when its
last submission is the right code. A tiny random model starts near 0.44 and can learn "submit a code that is not -1".
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

AGENT = "toy_latency_simple_agent"
SYSTEM = "Look up the code of the word with lookup_code, then submit it with submit_code."
WORDS = (
    "amber azure basil birch cedar cloud coral crane delta ember fable fern flint frost grove hazel heron iris ivory "
    "jade juniper kestrel lark linen maple marble meadow moss nectar onyx opal orchid pebble pine quartz raven reed "
    "sable sage slate"
).split()
TOOLS = [
    {
        "type": "function",
        "name": "lookup_code",
        "description": "Look up the code of a word.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string"}},
            "required": ["word"],
            "additionalProperties": False,
        },
    },
    {
        "type": "function",
        "name": "submit_code",
        "description": "Submit the code you looked up.",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "integer"}},
            "required": ["code"],
            "additionalProperties": False,
        },
    },
]


def word_code(word: str) -> int:
    """= ``word_code`` of the server (gym_servers/resources_servers/toy_latency/app.py), which Gym runs elsewhere."""
    return sum(map(ord, word)) % 1000


def call(name: str, arguments: dict) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def row(i: int, word: str) -> dict:
    code = word_code(word)
    choices = [
        call("lookup_code", {"word": word}),
        call("submit_code", {"code": code}),
        call("submit_code", {"code": -1}),
    ]
    return {
        "id": i,
        "responses_create_params": {
            "input": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"What is the code of '{word}'?"},
            ],
            "tools": TOOLS,
            "temperature": 1.0,
            "metadata": {"extra_body": json.dumps({"structured_outputs": {"choice": choices}}, separators=(",", ":"))},
        },
        "word": word,
        "expected_code": code,
        "agent_ref": AGENT,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "configs" / "gym" / "data")
    args = p.parse_args(argv)
    rows = [row(i, w) for i, w in enumerate(WORDS)]
    for name, part in (("toy_latency.jsonl", rows[:32]), ("toy_latency_val.jsonl", rows[32:])):
        (args.out / name).write_text("".join(json.dumps(r) + "\n" for r in part), encoding="utf-8")


if __name__ == "__main__":
    main()
