"""The SGLang patch's raw-body reader: which request carries ids, its flags, alignment errors kept for the render,
and the per-request ContextVar around SGLang's ``handle_request`` (fakes only; the real server: tests/sglang/)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from nemo_gym_adapter.sglang.request_ids import CURRENT, SENTINEL, make_request_wrapper, read_request_ids
from nemo_gym_adapter.tokens.anchor import SPLICE_ERROR

USER = {"role": "user", "content": "hi"}
ASSISTANT = {"role": "assistant", "content": "yo", "prompt_token_ids": [1, 2], "generation_token_ids": [3, 4]}


def test_a_request_without_ids_is_left_to_sglang_with_its_flags_read():
    ids = read_request_ids({"messages": [USER], "return_token_ids": True}, parsed_messages=1)
    assert ids.anchor is None and ids.error is None and not ids.splices
    assert ids.return_token_ids and not ids.tokens_as_ids and ids.generates


def test_ids_on_an_assistant_message_anchor_the_splice_there():
    body = {"messages": [USER, ASSISTANT, USER], "return_tokens_as_token_ids": True}
    ids = read_request_ids(body, parsed_messages=3, generates=False)
    assert ids.anchor is not None and (ids.anchor.index, ids.anchor.model_prefix) == (1, [1, 2, 3, 4])
    assert ids.anchor.required is None and ids.anchor.from_messages
    assert ids.tokens_as_ids and not ids.return_token_ids and not ids.generates
    assert ids.messages[1]["generation_token_ids"] == [3, 4]  # the raw messages keep their ids


def test_a_required_prefix_alone_anchors_at_the_last_assistant_message():
    body = {"messages": [USER, {"role": "assistant", "content": "yo"}, USER], "required_prefix_token_ids": [5, 6]}
    ids = read_request_ids(body, parsed_messages=3)
    assert ids.anchor is not None and (ids.anchor.index, ids.anchor.model_prefix) == (1, [5, 6])
    assert not ids.anchor.from_messages


def test_malformed_ids_are_kept_as_the_error_the_render_raises():
    broken = {**ASSISTANT, "prompt_token_ids": [1, "x"]}
    ids = read_request_ids({"messages": [USER, broken]}, parsed_messages=2)
    assert ids.anchor is None and ids.splices
    assert ids.error is not None and ids.error.startswith(SPLICE_ERROR) and "int token id" in ids.error


def test_a_required_prefix_without_any_assistant_message_anchors_before_the_conversation():
    """NeMo RL's merged-tokens case (issue 19): the prefix alone is the model prefix, index -1, no prefix render."""
    ids = read_request_ids({"messages": [USER], "required_prefix_token_ids": [1]}, parsed_messages=1)
    assert ids.error is None and ids.anchor is not None
    assert (ids.anchor.index, ids.anchor.model_prefix, ids.anchor.renders_prefix) == (-1, [1], False)


def test_ids_are_refused_when_the_parsed_request_holds_another_number_of_messages():
    ids = read_request_ids({"messages": [USER, ASSISTANT]}, parsed_messages=1)
    assert ids.anchor is None and ids.error is not None and "cannot be matched" in ids.error
    ids = read_request_ids({"messages": [USER, USER]}, parsed_messages=1)  # no ids: nothing to misplace
    assert ids.error is None


class FakeRawRequest:
    def __init__(self, path: str, body: bytes) -> None:
        self.url = SimpleNamespace(path=path)
        self._body = body

    async def body(self) -> bytes:
        return self._body


def test_the_wrapper_sets_the_request_ids_for_the_request_and_resets_them():
    seen = []

    async def handle_request(self, request, raw_request):
        seen.append(CURRENT.get())
        return "answer"

    wrapped = make_request_wrapper(handle_request)
    assert getattr(wrapped, SENTINEL) is handle_request
    request = SimpleNamespace(messages=[USER, ASSISTANT, USER])
    body = json.dumps({"messages": [USER, ASSISTANT, USER], "return_token_ids": True}).encode()

    async def run() -> None:
        assert await wrapped(None, request, FakeRawRequest("/v1/chat/completions", body)) == "answer"
        assert await wrapped(None, request, FakeRawRequest("/tokenize", body)) == "answer"
        await wrapped(None, request, FakeRawRequest("/v1/completions", body))  # not a chat body
        await wrapped(None, request, FakeRawRequest("/v1/chat/completions", b"not json"))
        assert CURRENT.get() is None

    asyncio.run(run())
    chat, tokenize, completions, broken = seen
    assert chat.anchor.index == 1 and chat.generates and chat.return_token_ids
    assert tokenize.anchor.index == 1 and not tokenize.generates
    assert completions is None and broken is None
