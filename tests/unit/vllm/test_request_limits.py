"""Issue 19 items 1, 3, 4 and 5 at the hook, with ``test_patch``'s fakes of vLLM (real tiny qwen25 tokenizer):

- the output budget clamped on every chat and ``/v1/completions`` request, with or without ids; a prompt that leaves
  no room at all is vLLM's context 400 naming the client's budget (``vllm.request_limits``);
- ``logprobs: true`` with ``top_logprobs: null`` refused naming ``top_logprobs``;
- ``required_prefix_token_ids`` on a conversation without an assistant message (NeMo RL's merged-tokens shape);
- NeMo RL's token fields on ``choices[].message`` (``vllm.token_fields``), through the abort guard.

Each hook case also runs the same request unpatched (the control: what stock vLLM answers). Fixtures: ``conftest``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import types

import pytest
from pydantic import BaseModel, ConfigDict

from nemo_gym_adapter.vllm import patch as vllm_patch
from nemo_gym_adapter.vllm.abort import make_abort_guard
from nemo_gym_adapter.vllm.token_fields import FIELDS, attach_token_fields
from tests.unit.vllm.test_abort import FakeOpenAIServingChat
from tests.unit.vllm.test_patch import (
    MAX_MODEL_LEN,
    TOOLS,
    FakeChatRequest,
    FakeOnlineRenderer,
    FakeVLLMValidationError,
    _render,
    _render_ids,
)


class LogprobChatRequest(FakeChatRequest):
    logprobs: bool | None = None
    top_logprobs: int | None = 0


class FakeCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    max_tokens: int | None = 16

    def build_tok_params(self, model_config) -> int:
        return self.max_tokens or 0


def _user(words: int = 0) -> list[dict]:
    return [{"role": "user", "content": "What is the weather? " + "weather " * words}]


# ------------------------------------------------------------------------------------------------ the budget


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_turn_one_budget_is_clamped_not_refused(patched_renderer, qwen_tokenizer, field):
    """No ids on the request (turn 1): a budget over the context is clamped to the room the prompt leaves."""
    request = FakeChatRequest(messages=_user(), **{field: 10_000})
    with pytest.raises(FakeVLLMValidationError, match="cannot be greater than max_model_len"):  # control
        await FakeOnlineRenderer(qwen_tokenizer).preprocess_chat(request, request.messages, None, "auto", None, TOOLS)
    _, (engine_input,) = await _render(patched_renderer, request)
    assert engine_input["prompt_token_ids"] == _render_ids(qwen_tokenizer, _user())
    assert getattr(request, field) == MAX_MODEL_LEN - len(engine_input["prompt_token_ids"])
    fits = FakeChatRequest(messages=_user(), max_tokens=8)
    await _render(patched_renderer, fits)
    assert fits.max_tokens == 8  # a budget that fits is left as asked


async def test_turn_one_prompt_over_the_context_is_the_400_naming_the_clients_budget(patched_renderer):
    request = FakeChatRequest(messages=_user(words=600), max_tokens=8, max_completion_tokens=9)
    with pytest.raises(FakeVLLMValidationError, match="you requested 9 output tokens") as info:
        await _render(patched_renderer, request)
    assert "maximum context length is 512 tokens" in str(info.value) and info.value.parameter == "input_tokens"
    assert (request.max_tokens, request.max_completion_tokens) == (8, 9)


async def test_a_prompt_that_fills_the_context_exactly_leaves_no_room(patched_renderer, qwen_tokenizer):
    words = next(w for w in range(0, 520) if len(_render_ids(qwen_tokenizer, _user(w))) >= MAX_MODEL_LEN)
    if len(_render_ids(qwen_tokenizer, _user(words))) > MAX_MODEL_LEN:
        pytest.skip("no padding renders to exactly max_model_len tokens")
    with pytest.raises(FakeVLLMValidationError, match="maximum context length"):
        await _render(patched_renderer, FakeChatRequest(messages=_user(words), max_tokens=8))


async def test_requests_without_a_budget_go_to_vllm_untouched(patched_renderer):
    request = FakeChatRequest(messages=_user())
    _, (engine_input,) = await _render(patched_renderer, request)
    assert request.max_tokens is None and "prompt" in engine_input and len(patched_renderer.calls) == 1


async def test_completions_budget_is_clamped(patched_renderer, qwen_tokenizer):
    prompts = ["Skinny weather " * 20, "Paris"]
    request = FakeCompletionRequest(max_tokens=10_000)
    with pytest.raises(FakeVLLMValidationError):  # control: stock vLLM refuses
        await FakeOnlineRenderer(qwen_tokenizer).preprocess_completion(request, prompts, None)
    inputs = await patched_renderer.preprocess_completion(request, prompts, None)
    longest = max(len(i["prompt_token_ids"]) for i in inputs)
    assert request.max_tokens == MAX_MODEL_LEN - longest
    small = FakeCompletionRequest(max_tokens=4)
    await patched_renderer.preprocess_completion(small, "Paris", None)
    assert small.max_tokens == 4


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_a_budget_that_is_no_token_count_is_a_400_naming_it(patched_renderer, field):
    """2**63 (issue 27's hostile class) is refused; the largest 32-bit count is still clamped (the control)."""
    with pytest.raises(FakeVLLMValidationError, match=f"{field}={2**63} is not a token count") as info:
        await _render(patched_renderer, FakeChatRequest(messages=_user(), **{field: 2**63}))
    assert info.value.parameter == field
    clamped = FakeChatRequest(messages=_user(), **{field: 2**31 - 1})
    await _render(patched_renderer, clamped)
    assert getattr(clamped, field) < MAX_MODEL_LEN
    with pytest.raises(FakeVLLMValidationError, match="max_tokens=.* is not a token count"):
        await patched_renderer.preprocess_completion(FakeCompletionRequest(max_tokens=2**63), "Paris", None)


def test_completion_wrapper_is_installed_once(fake_vllm):
    modules = fake_vllm("0.31.0")
    vllm_patch.apply_patch()
    cls = modules["vllm.renderers.online_renderer"].OnlineRenderer
    first = cls.preprocess_completion
    assert getattr(first, vllm_patch.SENTINEL) is FakeOnlineRenderer.preprocess_completion
    vllm_patch.apply_patch()
    assert cls.preprocess_completion is first


# ------------------------------------------------------------------------------------------------ log-probs


async def test_logprobs_with_top_logprobs_null_is_a_400_naming_the_field(patched_renderer):
    bad = LogprobChatRequest(messages=_user(), logprobs=True, top_logprobs=None, max_tokens=4)
    with pytest.raises(FakeVLLMValidationError, match="top_logprobs") as info:
        await _render(patched_renderer, bad)
    assert info.value.parameter == "top_logprobs"
    for fine in (
        LogprobChatRequest(messages=_user(), logprobs=True, top_logprobs=0),
        LogprobChatRequest(messages=_user(), logprobs=None, top_logprobs=None),
        FakeChatRequest(messages=_user()),  # no such field (/tokenize, the Responses API)
    ):
        await _render(patched_renderer, fine)


# ------------------------------------------------------------------------------------ required prefix alone


async def test_required_prefix_without_an_assistant_message(patched_renderer, qwen_tokenizer):
    """NeMo RL's merged-tokens case at the hook: the prefix (the render up to the user text, " Skinny" in two tokens,
    no turn end) is kept as sent and followed by the template's turn end and generation prompt."""
    tok = qwen_tokenizer
    messages = [{"role": "user", "content": "What is the weather? Skinny"}]
    full = _render_ids(tok, messages)
    cut = full.index(tok.convert_tokens_to_ids("<|im_end|>"), full.index(tok.convert_tokens_to_ids("<|im_start|>"), 1))
    (skinny,) = tok.encode(" Skinny", add_special_tokens=False)
    at = full.index(skinny)
    pieces = next(p for c in range(1, 7) if len(p := tok.encode(" Skinny"[:c]) + tok.encode(" Skinny"[c:])) == 2)
    required = full[:at] + pieces + full[at + 1 : cut]
    _, (engine_input,) = await _render(
        patched_renderer, FakeChatRequest(messages=messages, required_prefix_token_ids=required, max_tokens=4)
    )
    assert engine_input["prompt_token_ids"] == required + full[cut:]
    edited = [{"role": "user", "content": "What is the climate? Skinny"}]
    with pytest.raises(FakeVLLMValidationError, match="does not spell the conversation") as info:
        await _render(patched_renderer, FakeChatRequest(messages=edited, required_prefix_token_ids=required))
    assert info.value.parameter == "messages"


# --------------------------------------------------------------------------------- NeMo RL's message fields


@dataclasses.dataclass
class Logprob:
    logprob: float


def _response(n_logprobs: int):
    message = types.SimpleNamespace(content="hi")
    logprobs = types.SimpleNamespace(content=[Logprob(-0.25 * (i + 1)) for i in range(n_logprobs)])
    return types.SimpleNamespace(choices=[types.SimpleNamespace(index=0, message=message, logprobs=logprobs)])


def _final(prompt, generated):
    return types.SimpleNamespace(prompt_token_ids=prompt, outputs=[types.SimpleNamespace(index=0, token_ids=generated)])


def test_token_fields_on_the_message_when_log_probs_were_asked_for():
    response = attach_token_fields(types.SimpleNamespace(logprobs=True), _response(2), _final([1, 2, 3], (7, 8)))
    message = response.choices[0].message
    assert (message.prompt_token_ids, message.generation_token_ids) == ([1, 2, 3], [7, 8])
    assert message.generation_log_probs == [-0.25, -0.5]


@pytest.mark.parametrize(
    ("request_logprobs", "n_logprobs"), [(None, 2), (False, 2), (True, 1)], ids=["not asked", "false", "mismatch"]
)
def test_no_token_fields_rather_than_a_partial_or_wrong_bundle(request_logprobs, n_logprobs):
    response = attach_token_fields(
        types.SimpleNamespace(logprobs=request_logprobs), _response(n_logprobs), _final([1, 2, 3], (7, 8))
    )
    assert not any(hasattr(response.choices[0].message, f) for f in FIELDS)


def test_the_chat_guard_attaches_them_from_the_last_engine_output():
    class Serving(FakeOpenAIServingChat):
        async def chat_completion_full_generator(self, request, result_generator, *args, **kw):
            async for _ in result_generator:
                pass
            return _response(2)

    guarded = make_abort_guard(Serving.chat_completion_full_generator)

    async def outputs():
        yield _final([1, 2, 3], (7,))
        yield types.SimpleNamespace(**vars(_final([1, 2, 3], (7, 8))))

    response = asyncio.run(guarded(Serving(), types.SimpleNamespace(logprobs=True), outputs(), "id", "m"))
    assert response.choices[0].message.generation_token_ids == [7, 8]
