"""The SGLang answer wrapper: vLLM's token fields when asked, SGLang's own answer otherwise, a counted 503 for an
aborted generation (fakes only; the real server: tests/sglang/)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from nemo_gym_adapter.sglang import answer
from nemo_gym_adapter.sglang.request_ids import CURRENT, RequestIds
from nemo_gym_adapter.wire.payloads import GENERATION_ABORTED


def _ret(finish: dict, ids=(7, 8)) -> dict:
    pairs = [(-0.5, t, "x") for t in ids]
    return {"output_ids": list(ids), "meta_info": {"finish_reason": finish, "output_token_logprobs": pairs}}


class FakeResponse:
    """What ``_build_chat_response`` returns: a pydantic model with ``model_dump``."""

    def model_dump(self) -> dict:
        content = [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -0.5}]
        return {"choices": [{"message": {"content": "ab"}, "logprobs": {"content": content}}], "usage": {}}


class FakeServing:
    def create_error_response(self, message, err_type="BadRequestError", status_code=400):
        return SimpleNamespace(message=message, err_type=err_type, status_code=status_code)


def test_aborted_is_read_from_sglangs_finish_reason():
    assert answer.was_aborted(_ret({"type": "abort", "message": None}))
    assert not answer.was_aborted(_ret({"type": "stop", "matched": 8}))
    assert not answer.was_aborted({"meta_info": {}})


def test_the_token_fields_are_added_exactly_when_asked():
    ids = RequestIds(return_token_ids=True, tokens_as_ids=True, prompt_ids=[1, 2, 3])
    body = answer.token_fields(FakeResponse().model_dump(), [_ret({"type": "stop"})], ids)
    assert body["prompt_token_ids"] == [1, 2, 3] and body["choices"][0]["token_ids"] == [7, 8]
    assert [e["token"] for e in body["choices"][0]["logprobs"]["content"]] == ["token_id:7", "token_id:8"]
    only_tokens = answer.token_fields(
        FakeResponse().model_dump(), [_ret({"type": "stop"})], RequestIds(tokens_as_ids=True)
    )
    assert "prompt_token_ids" not in only_tokens and "token_ids" not in only_tokens["choices"][0]


def test_the_wrapper_answers_503_for_an_abort_and_leaves_other_answers_alone():
    def build(self, request, ret, created):
        return FakeResponse()

    wrapped = answer.make_response_wrapper(build)
    before = answer.aborted_total()
    refused = wrapped(FakeServing(), None, [_ret({"type": "abort"})], 0)
    assert refused.status_code == 503 and refused.message.startswith(GENERATION_ABORTED)
    assert refused.message == answer.ABORT_MESSAGE and answer.aborted_total() == before + 1
    stock = wrapped(FakeServing(), None, [_ret({"type": "stop"})], 0)
    assert isinstance(stock, FakeResponse)  # no request ids (or no flags): SGLang's own answer
    token = CURRENT.set(RequestIds(return_token_ids=True, prompt_ids=[1]))
    try:
        extended = wrapped(FakeServing(), None, [_ret({"type": "stop"})], 0)
    finally:
        CURRENT.reset(token)
    body = json.loads(extended.body)
    assert body["prompt_token_ids"] == [1] and body["choices"][0]["token_ids"] == [7, 8]
    completions = answer.make_response_wrapper(build, chat=False)
    assert completions(FakeServing(), None, [_ret({"type": "abort"})], 0).status_code == 503
