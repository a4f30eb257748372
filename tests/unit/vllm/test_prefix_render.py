"""The fast prefix render builds its chat parameters as the release's ``preprocess_chat`` does: vLLM 0.33 hands a chat
request the server's ``--reasoning-effort-map`` (which rewrites the requested effort, and so ``enable_thinking``,
before the template sees it); ``/tokenize``'s request type takes no map, and 0.24-0.32 have none. Fakes: the request
types record what they were given (their signatures are 0.33's, ``vllm/entrypoints/openai/chat_completion/
protocol.py`` and ``serve/tokenize/protocol.py``); the real classes run in ``tests/vllm_releases/hook_cases.py``."""

from __future__ import annotations

import types
from typing import Any

import pytest

from nemo_gym_adapter.vllm.prefix_render import build_chat_params


class FakeChatRequest033:
    """0.33's ChatCompletionRequest.build_chat_params signature (ResponsesRequest's is the same)."""

    def build_chat_params(
        self, default_template: str | None, content_format: Any, reasoning_effort_map: dict | None = None
    ) -> tuple:
        return ("chat", default_template, content_format, reasoning_effort_map)


class FakeTokenizeRequest:
    """TokenizeChatRequest (0.24-0.33): no map parameter."""

    def build_chat_params(self, default_template: str | None, content_format: Any) -> tuple:
        return ("tokenize", default_template, content_format)


EFFORTS = {"low": "none", "high": "medium"}


def test_a_chat_request_gets_the_servers_effort_map_as_preprocess_chat_gives_it():
    serving = types.SimpleNamespace(reasoning_effort_map=EFFORTS)  # 0.33's OnlineRenderer attribute
    assert build_chat_params(serving, FakeChatRequest033(), "tpl", "auto") == ("chat", "tpl", "auto", EFFORTS)


@pytest.mark.parametrize(
    "serving",
    [
        types.SimpleNamespace(reasoning_effort_map={}),  # 0.33 without --reasoning-effort-map: the same as no map
        types.SimpleNamespace(),  # 0.24-0.32: no such attribute
    ],
    ids=["empty-map", "no-map"],
)
def test_without_a_map_the_request_builds_its_params_as_before(serving):
    assert build_chat_params(serving, FakeChatRequest033(), "tpl", "auto") == ("chat", "tpl", "auto", None)


def test_a_request_type_without_the_parameter_is_not_given_the_map():
    serving = types.SimpleNamespace(reasoning_effort_map=EFFORTS)
    assert build_chat_params(serving, FakeTokenizeRequest(), None, "auto") == ("tokenize", None, "auto")
