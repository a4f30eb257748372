"""The ``ngv_json`` tool parser against a vLLM release's real classes (run in each ``stubbed`` release's venv, 0.24.0,
0.33.0 and 0.34.0, by tests/integration/vllm/test_vllm_releases.py; not collected by the trainer venv's pytest).

Real: the release's FastAPI app built with ``--enable-auto-tool-choice --tool-call-parser ngv_json`` the way verl
builds it (``build_app`` + ``init_app_state``, no ``--tool-parser-plugin``), the parser registered by our vLLM general
plugin's function (``plugin.register_tool_parsers``), ``OpenAIServingChat`` and vLLM's tool-parser registry. Stubbed:
the engine (``hook_cases.ScriptedEngine``: "generates" the scripted text). Each model output below comes back as an
HTTP 200: the calls as ``tool_calls``, anything that is not a call as content (never a 500); the control is vLLM's own
``hermes`` on the same outputs, which reads none of the bare calls.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.conversations import TOOLS
from tests.vllm_releases.hook_cases import Server, build_server, loop, vllm_release  # noqa: F401

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
SCHEMA_ECHO = '{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}'
# (what the model writes, the calls the answer must carry)
OUTPUTS = [
    (CALL, [("get_weather", {"city": "Paris"})]),
    (f"```json\n{CALL}\n```", [("get_weather", {"city": "Paris"})]),
    (f"Let me look.\n{CALL}", [("get_weather", {"city": "Paris"})]),
    (f"{SCHEMA_ECHO}\n{CALL}", [("get_weather", {"city": "Paris"})]),
    ('[{"name": "get_weather", "arguments": {"city": "Oslo"}}]', [("get_weather", {"city": "Oslo"})]),
    (SCHEMA_ECHO, []),
    ('{"name": "get_weather", "arguments": {"city": "Par', []),  # cut at the budget
    ("It is sunny in Paris.", []),
]


@pytest.fixture(scope="session")
def parser_server(vllm_release, loop):  # noqa: F811
    """Factory: the release's real app over a ScriptedEngine with the given tool parser (built once per parser)."""
    from nemo_gym_adapter.vllm.plugin import register_tool_parsers

    register_tool_parsers()  # what the general plugin does in verl's server actor (vllm.tool_parsers is imported)
    built: dict[str, Server] = {}

    def get(parser: str) -> Server:
        if parser not in built:
            built[parser] = build_server("qwen25", parser, loop)
        return built[parser]

    return get


def _answer(server: Server, text: str) -> tuple[int, dict[str, Any]]:
    server.engine.script = [text]
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = server.chat(messages, tools=TOOLS, tool_choice="auto", max_tokens=200)
    return r.status_code, (r.json() if r.status_code == 200 else {"error": r.text})


def test_the_parser_is_registered_by_the_plugin_function(parser_server):
    from vllm.tool_parsers import ToolParserManager

    from nemo_gym_adapter.vllm.tool_parser import JsonToolParser

    parser_server("ngv_json")
    assert ToolParserManager.get_tool_parser("ngv_json") is JsonToolParser


@pytest.mark.parametrize(("text", "calls"), OUTPUTS)
def test_every_output_is_a_200_with_its_calls(parser_server, text, calls):
    status, body = _answer(parser_server("ngv_json"), text)
    assert status == 200, body
    message = body["choices"][0]["message"]
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]
    assert got == calls
    assert body["choices"][0]["finish_reason"] == ("tool_calls" if calls else "stop")
    if not calls:
        assert message["content"] == text


def test_hermes_reads_none_of_the_bare_calls_the_control(parser_server):
    server = parser_server("hermes")
    for text, _ in OUTPUTS[:5]:
        status, body = _answer(server, text)
        assert status == 200 and not body["choices"][0]["message"].get("tool_calls"), body
