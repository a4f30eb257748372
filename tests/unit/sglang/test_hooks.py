"""The SGLang render hook with a fake ``OpenAIServingChat`` that renders as SGLang 0.5.12's ``_apply_jinja_template``
does (the server's tokenizer, ``apply_chat_template(tokenize=True, add_generation_prompt=True, return_dict=False)``),
and the tiny Qwen2.5 tokenizer: the splice, the clamp, the refusals. The real SGLang: tests/sglang/hook_cases.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.sglang import hooks
from nemo_gym_adapter.sglang.request_ids import CURRENT, read_request_ids
from nemo_gym_adapter.tokens.budget import ContextLengthExceeded
from tests.support.conversations import piecewise

CONTEXT = 512


@pytest.fixture
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir("qwen25"))


def sglang_render(self, request, tools, is_multimodal):
    """What SGLang's ``_apply_jinja_template`` does for a text model (message dicts, tools, its tokenizer call)."""
    messages = [{k: v for k, v in m.items() if k in ("role", "content")} for m in request.messages]
    prompt_ids = self.tokenizer_manager.tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, tools=tools, return_dict=False
    )
    return SimpleNamespace(prompt="", prompt_ids=prompt_ids)


def _serving(tokenizer, **extra):
    model_config = SimpleNamespace(hf_eos_token_id={tokenizer.convert_tokens_to_ids("<|endoftext|>")})
    manager = SimpleNamespace(
        tokenizer=tokenizer, context_len=CONTEXT, num_reserved_tokens=0, model_config=model_config
    )
    return SimpleNamespace(tokenizer_manager=manager, **{"chat_encoding_spec": None, **extra})


def _conversation(tokenizer):
    first = [{"role": "user", "content": "What is the weather?"}]
    prompt = tokenizer.apply_chat_template(first, tokenize=True, add_generation_prompt=True, return_dict=False)
    generation = piecewise(tokenizer, "Skinny weather in Paris") + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    assistant = {"role": "assistant", "content": "Skinny weather in Paris"}
    messages = [*first, {**assistant, "prompt_token_ids": prompt, "generation_token_ids": generation}]
    return [*messages, {"role": "user", "content": "And Oslo?"}], prompt + generation


def _render(serving, messages, *, max_tokens=None, generates=True, **body):
    request = SimpleNamespace(
        messages=messages, continue_final_message=False, max_tokens=max_tokens, max_completion_tokens=None
    )
    ids = read_request_ids({"messages": messages, **body}, parsed_messages=len(messages), generates=generates)
    token = CURRENT.set(ids)
    try:
        result = hooks.make_render_wrapper(sglang_render)(serving, request, None, False)
    finally:
        CURRENT.reset(token)
    return result, request, ids


@pytest.mark.parametrize("fast", [True, False])
def test_the_render_keeps_the_models_tokens_and_renders_the_rest(tokenizer, monkeypatch, fast):
    monkeypatch.setitem(hooks.OPTIONS, "fast_prefix", fast)
    messages, history = _conversation(tokenizer)
    stock = sglang_render(_serving(tokenizer), SimpleNamespace(messages=messages), None, False).prompt_ids
    assert stock[: len(history)] != history  # SGLang alone re-encodes the piecewise generation
    result, _, ids = _render(_serving(tokenizer), messages)
    assert result.prompt_ids[: len(history)] == history and ids.prompt_ids == result.prompt_ids
    tail = tokenizer.decode(result.prompt_ids[len(history) :])
    assert tail == "\n<|im_start|>user\nAnd Oslo?<|im_end|>\n<|im_start|>assistant\n"


def test_a_request_without_ids_is_sglangs_own_render(tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    result, _, ids = _render(_serving(tokenizer), messages)
    assert (
        result.prompt_ids
        == sglang_render(_serving(tokenizer), SimpleNamespace(messages=messages), None, False).prompt_ids
    )
    assert ids.prompt_ids == result.prompt_ids


def test_the_budget_is_clamped_to_the_smaller_of_sglangs_and_verls_context(tokenizer, monkeypatch):
    messages, _ = _conversation(tokenizer)
    result, request, _ = _render(_serving(tokenizer), messages, max_tokens=10_000)
    assert request.max_tokens == CONTEXT - len(result.prompt_ids)
    monkeypatch.setitem(hooks.OPTIONS, "max_model_len", 100)
    result, request, _ = _render(_serving(tokenizer), messages, max_tokens=10_000)
    assert request.max_tokens == 100 - len(result.prompt_ids)
    _, request, _ = _render(_serving(tokenizer), messages, max_tokens=10_000, generates=False)  # /tokenize
    assert request.max_tokens == 10_000
    monkeypatch.setitem(hooks.OPTIONS, "max_model_len", 10)
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 10 tokens"):
        _render(_serving(tokenizer), messages, max_tokens=5)


def test_an_edited_history_and_other_renderers_are_refused(tokenizer):
    messages, _ = _conversation(tokenizer)
    edited = [{**messages[0], "content": "What is the weather in Rome?"}, *messages[1:]]
    with pytest.raises(TokenAlignmentError, match=r"nemo-gym-verl token splice: .*messages\[0\] \(user\) differs"):
        _render(_serving(tokenizer), edited)
    with pytest.raises(TokenAlignmentError, match="dsv4 Python chat encoder"):
        _render(_serving(tokenizer, chat_encoding_spec="dsv4"), messages)
    guard = hooks.make_conversation_guard(lambda self, request, is_multimodal: "rendered")
    serving = SimpleNamespace(template_manager=SimpleNamespace(chat_template_name="chatml"))
    token = CURRENT.set(read_request_ids({"messages": messages}, parsed_messages=len(messages)))
    try:
        with pytest.raises(TokenAlignmentError, match="conversation template 'chatml'"):
            guard(serving, SimpleNamespace(), False)
    finally:
        CURRENT.reset(token)
    assert guard(serving, SimpleNamespace(), False) == "rendered"  # no ids: SGLang's own
