"""vLLM tool parser ``ngv_json``: tool calls written as bare or fenced JSON (:mod:`nemo_gym_adapter.vllm.json_calls`),
for models whose template asks for ``<tool_call>`` tags they do not emit (Qwen2.5-Coder-0.5B-Instruct writes
``{"name": ..., "arguments": ...}`` and puts ~1e-10 on ``<tool_call>``). vLLM ships none that fits: ``hermes`` needs
the tags (0 of 19 outputs parsed), ``llama3_json`` refuses every request with tools when the vocabulary has no
``<|python_tag|>`` (HTTP 500), ``xlam`` takes only JSON lists.

Registered two ways, both vLLM's own:
- lazily, by this package's vLLM general plugin (``nemo_gym_adapter.vllm.plugin``, entry point
  ``vllm.general_plugins``), in every vLLM process where the package is installed. That is the path verl's replicas
  take: verl builds vLLM's app with ``build_app`` + ``init_app_state`` and never imports a ``--tool-parser-plugin``;
  vLLM loads general plugins when it builds its engine arguments, before the app looks the parser up;
- eagerly when this file is imported, so ``--tool-parser-plugin <this file>`` works for a plain vLLM server too.
Select it with ``--enable-auto-tool-choice --tool-call-parser ngv_json`` (verl: ``engine_kwargs.vllm``).

The parser never raises (vLLM answers an exception with HTTP 500, which the adapter would have to mask as an
infrastructure failure): a call it cannot read is content, and the environment scores a turn without a call.
Streaming returns the text as content (Gym never streams; calls are read from complete outputs only).

Runs on vLLM 0.25+ (``vllm.entrypoints.generate.base.protocol``) and on 0.20-0.24 (``vllm.entrypoints.openai.engine
.protocol``); ``ToolParser`` / ``ToolParserManager`` live in ``vllm.tool_parsers`` in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager

from nemo_gym_adapter.vllm.json_calls import parse_json_calls

try:  # vLLM 0.25+
    from vllm.entrypoints.generate.base.protocol import (
        DeltaMessage,
        ExtractedToolCallInformation,
        FunctionCall,
        ToolCall,
    )
except ImportError:  # vLLM 0.20-0.24
    from vllm.entrypoints.openai.engine.protocol import (  # type: ignore[no-redef,import-not-found,unused-ignore]
        DeltaMessage,
        ExtractedToolCallInformation,
        FunctionCall,
        ToolCall,
    )

NAME = "ngv_json"


class JsonToolParser(ToolParser):
    """Bare / fenced / tagged JSON tool calls (see the module docstring)."""

    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        try:
            content, calls = parse_json_calls(model_output)
        except Exception:  # parse_json_calls never raises on a string; a non-string output must not become a 500
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        tool_calls = [
            ToolCall(type="function", function=FunctionCall(name=c.name, arguments=c.arguments)) for c in calls
        ]
        return ExtractedToolCallInformation(tools_called=bool(tool_calls), tool_calls=tool_calls, content=content)

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: Any,
    ) -> DeltaMessage | None:
        return DeltaMessage(content=delta_text)


def register() -> None:
    """Register :class:`JsonToolParser` as ``ngv_json`` (idempotent)."""
    ToolParserManager.register_module(NAME, force=True, module=JsonToolParser)


register()
