"""Unit tests of the vLLM token-ID patch with fakes of vLLM (no vLLM import, no server).

``FakeOnlineRenderer`` has ``preprocess_chat`` with vLLM's real signature and renders with the real tiny-model
tokenizer (Hugging Face), so the splice, the fast prefix render and the wrapper's error handling run for real; only
vLLM's classes are fakes, installed as modules under vLLM's names for the duration of a test.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from nemo_gym_adapter.errors import ServerError, SetupError, TokenAlignmentError
from nemo_gym_adapter.vllm import hooks as vllm_hooks
from nemo_gym_adapter.vllm import patch as vllm_patch
from nemo_gym_adapter.vllm import prefix_render as vllm_prefix_render
from nemo_gym_adapter.vllm import resume as vllm_resume
from nemo_gym_adapter.vllm.abort import ABORT_GUARD_TARGETS
from nemo_gym_adapter.vllm.hooks import find_anchor, hook_target_for
from nemo_gym_adapter.vllm.request_limits import ContextLengthExceeded, clamp_output_budget
from tests.support.conversations import piecewise
from tests.unit.vllm.test_abort import FakeOpenAIServingChat, FakeOpenAIServingCompletion

MAX_MODEL_LEN = 512


# ----------------------------------------------------------------------------------------------------- fakes


class FakeVLLMValidationError(ValueError):
    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value


@dataclasses.dataclass
class FakeChatParams:
    chat_template: str | None
    kwargs: dict

    def with_defaults(self, defaults: dict | None = None, **_: Any) -> FakeChatParams:
        return FakeChatParams(self.chat_template, {**(defaults or {}), **self.kwargs})


class FakeChatRequest(BaseModel):
    """The fields of vLLM's ChatCompletionRequest the patch touches (extra keys allowed, as in vLLM)."""

    model_config = ConfigDict(extra="allow")
    messages: list[dict]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    kv_transfer_params: dict | None = None

    def build_chat_params(self, default_template: str | None, content_format: Any) -> FakeChatParams:
        return FakeChatParams(default_template, {"add_generation_prompt": self.add_generation_prompt})

    def build_tok_params(self, model_config: Any) -> int:
        return self.max_completion_tokens or self.max_tokens or 0


class FakeTokenizeRequest(BaseModel):
    """vLLM's TokenizeChatRequest has no output budget."""

    model_config = ConfigDict(extra="allow")
    messages: list[dict]
    add_generation_prompt: bool = True
    continue_final_message: bool = False

    def build_chat_params(self, default_template: str | None, content_format: Any) -> FakeChatParams:
        return FakeChatParams(default_template, {"add_generation_prompt": self.add_generation_prompt})

    def build_tok_params(self, model_config: Any) -> int:
        return 0


class FakeRenderer:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.text_renders = 0

    def render_text(self, messages: list[dict], params: FakeChatParams) -> str:
        kwargs = {k: v for k, v in params.kwargs.items() if k in ("tools", "add_generation_prompt")}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)

    async def render_messages_async(self, messages: list[dict], params: FakeChatParams) -> tuple[list, dict]:
        self.text_renders += 1
        return [], {"prompt": self.render_text(messages, params)}


class FakeModelConfig:
    max_model_len = MAX_MODEL_LEN
    enable_prompt_embeds = False

    def try_get_generation_config(self) -> dict:
        return {"eos_token_id": [3002, 3000]}  # tiny qwen25: <|im_end|>, <|endoftext|>


class FakeOnlineRenderer:
    """vLLM's OnlineRenderer as far as the hook sees it: same ``preprocess_chat`` signature, a length check."""

    def __init__(self, tokenizer: Any) -> None:
        self.renderer = FakeRenderer(tokenizer)
        self.model_config = FakeModelConfig()
        self.calls: list[dict] = []

    async def preprocess_chat(
        self,
        request,
        messages,
        default_template,
        default_template_content_format,
        default_template_kwargs,
        tool_dicts=None,
        parser=None,
        *,
        skip_mm_cache=False,
    ):
        self.calls.append({"n_messages": len(messages), "parser": parser, "gen_prompt": request.add_generation_prompt})
        params = request.build_chat_params(default_template, default_template_content_format).with_defaults(
            {**(default_template_kwargs or {}), **({"tools": tool_dicts} if tool_dicts else {})}
        )
        text = self.renderer.render_text(messages, params)
        ids = self.renderer.tokenizer.encode(text, add_special_tokens=False)
        budget = request.build_tok_params(self.model_config)
        return [{"role": m["role"]} for m in messages], [self._checked(ids, budget, prompt=text)]

    async def preprocess_completion(self, request, prompt_input, prompt_embeds, *, skip_mm_cache=False):
        prompts = [prompt_input] if isinstance(prompt_input, str) else list(prompt_input)
        budget = request.build_tok_params(self.model_config)
        return [self._checked(self.renderer.tokenizer.encode(p, add_special_tokens=False), budget) for p in prompts]

    def _checked(self, ids: list[int], budget: int, **extra: Any) -> dict:
        if budget > MAX_MODEL_LEN:  # what vLLM's TokenizeParams checks do, with their parameter names
            raise FakeVLLMValidationError(
                f"max_tokens={budget} cannot be greater than max_model_len", parameter="max_tokens"
            )
        if len(ids) > MAX_MODEL_LEN - budget:
            raise FakeVLLMValidationError(
                f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you requested {budget} "
                f"output tokens and your prompt contains {len(ids)} input tokens",
                parameter="input_tokens",
                value=len(ids),
            )
        return {"type": "token", "prompt_token_ids": ids, **extra}

    use_harmony = False  # vLLM: model_type == "gpt_oss"

    async def render_chat(self, request, *, skip_mm_cache=False):
        """vLLM's branch: harmony models never reach ``preprocess_chat``."""
        if self.use_harmony:
            return "rendered by openai_harmony"
        return await self.preprocess_chat(
            request, request.messages, None, "auto", None, TOOLS, skip_mm_cache=skip_mm_cache
        )


class FakeOpenAIServingRender(FakeOnlineRenderer):
    """vLLM 0.20-0.24's home of the same method."""


def _fake_vllm(version: str, *, with_hook: bool = True) -> dict[str, types.ModuleType]:
    root = types.ModuleType("vllm")
    root.__version__ = version
    online = types.ModuleType("vllm.renderers.online_renderer")
    serving = types.ModuleType("vllm.entrypoints.serve.render.serving")
    if with_hook:
        online.OnlineRenderer = type("OnlineRenderer", (FakeOnlineRenderer,), {})
        serving.OpenAIServingRender = type("OpenAIServingRender", (FakeOpenAIServingRender,), {})
    else:
        online.OnlineRenderer = type("OnlineRenderer", (), {})
    exceptions = types.ModuleType("vllm.exceptions")
    exceptions.VLLMValidationError = FakeVLLMValidationError
    guarded = {}  # where apply_patch installs the abort guard (test_vllm_abort)
    for target, fake in zip(ABORT_GUARD_TARGETS, (FakeOpenAIServingChat, FakeOpenAIServingCompletion), strict=True):
        class_name = target.qualname.split(".")[0]
        guarded[target.module] = types.ModuleType(target.module)
        setattr(guarded[target.module], class_name, type(class_name, (fake,), {}))
    return {
        "vllm": root,
        "vllm.renderers.online_renderer": online,
        "vllm.entrypoints.serve.render.serving": serving,
        "vllm.exceptions": exceptions,
        **guarded,
    }


@pytest.fixture
def fake_vllm(monkeypatch):
    """Install fake vLLM modules of a given version; returns the hook module."""

    def install(version: str = "0.31.0", *, with_hook: bool = True) -> dict[str, types.ModuleType]:
        modules = _fake_vllm(version, with_hook=with_hook)
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        return modules

    return install


@pytest.fixture(autouse=True)
def fresh_patch_options(monkeypatch):
    """The patch's options are process-wide: every test starts from the defaults and leaves them as they were."""
    monkeypatch.setitem(vllm_hooks.OPTIONS, "assistant_edits", "keep_ids")


@pytest.fixture(scope="module")
def qwen_tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir("qwen25"))


@pytest.fixture
def patched_renderer(fake_vllm, qwen_tokenizer):
    modules = fake_vllm("0.31.0")
    report = vllm_patch.apply_patch()
    assert not report.already_patched
    return modules["vllm.renderers.online_renderer"].OnlineRenderer(qwen_tokenizer)


# --------------------------------------------------------------------------------------- versions and applying


@pytest.mark.parametrize(
    ("version", "hook"),
    [
        ("0.20.0", "OpenAIServingRender"),
        ("0.24.0", "OpenAIServingRender"),
        ("0.24.1.dev3+gabc", "OpenAIServingRender"),
        ("0.25.0", "OnlineRenderer"),
        ("0.31.0+cpu", "OnlineRenderer"),
        ("0.32.1", "OnlineRenderer"),
        ("0.33.0", "OnlineRenderer"),
        ("0.34.0", "OnlineRenderer"),
    ],
)
def test_supported_versions_map_to_their_hook(version, hook):
    assert hook_target_for(version).qualname == f"{hook}.preprocess_chat"


@pytest.mark.parametrize("version", ["0.19.9", "0.35.0", "1.0.0", "garbage", ""])
def test_unsupported_version_fails_loudly_naming_it(version):
    with pytest.raises(SetupError, match=f"vLLM '{version}' is not supported"):
        hook_target_for(version)


def test_apply_patch_installs_once_and_reports_already_patched(fake_vllm):
    modules = fake_vllm("0.31.0")
    cls = modules["vllm.renderers.online_renderer"].OnlineRenderer
    first = vllm_patch.apply_patch()
    installed = cls.__dict__["preprocess_chat"]
    second = vllm_patch.apply_patch()
    assert (first.already_patched, second.already_patched) == (False, True)
    assert first.hook == "vllm.renderers.online_renderer.OnlineRenderer.preprocess_chat"
    assert first.vllm_version == "0.31.0"
    assert cls.__dict__["preprocess_chat"] is installed  # not wrapped twice
    assert vllm_patch.is_patched()
    from nemo_gym_adapter.vllm import abort as vllm_abort

    assert vllm_abort.is_guarded()  # the abort guard comes with the patch


async def test_harmony_request_with_ids_is_a_400_not_silently_unspliced(patched_renderer, qwen_tokenizer):
    messages, _ = _conversation(qwen_tokenizer)
    cls = type(patched_renderer)
    assert getattr(cls.__dict__["render_chat"], vllm_hooks.SENTINEL, None) is not None
    _, (engine_input,) = await patched_renderer.render_chat(FakeChatRequest(messages=messages, max_tokens=16))
    assert "prompt" not in engine_input  # not harmony: the splice ran through preprocess_chat
    patched_renderer.use_harmony = True
    with pytest.raises(FakeVLLMValidationError, match=r"openai_harmony .* messages\[1\]") as info:
        await patched_renderer.render_chat(FakeChatRequest(messages=messages, max_tokens=16))
    assert info.value.parameter == "messages"
    plain = [{k: v for k, v in m.items() if "_ids" not in k and "log_probs" not in k} for m in messages]
    assert await patched_renderer.render_chat(FakeChatRequest(messages=plain)) == "rendered by openai_harmony"
    vllm_patch.apply_patch()  # idempotent: the guard is not wrapped twice
    assert getattr(cls.render_chat, vllm_hooks.SENTINEL) is FakeOnlineRenderer.render_chat


def test_apply_patch_uses_the_0_24_hook(fake_vllm):
    modules = fake_vllm("0.24.0")
    report = vllm_patch.apply_patch()
    assert report.hook == "vllm.entrypoints.serve.render.serving.OpenAIServingRender.preprocess_chat"
    assert hasattr(modules["vllm.entrypoints.serve.render.serving"].OpenAIServingRender.preprocess_chat, "__wrapped__")
    assert not hasattr(modules["vllm.renderers.online_renderer"].OnlineRenderer.preprocess_chat, "__wrapped__")


def test_apply_patch_sets_the_assistant_edits_policy_on_every_call(fake_vllm):
    fake_vllm("0.31.0")
    assert vllm_patch.apply_patch("refuse").assistant_edits == "refuse"
    assert vllm_hooks.OPTIONS["assistant_edits"] == "refuse"
    again = vllm_patch.apply_patch()  # already installed: the option still changes
    assert again.already_patched and again.assistant_edits == "keep_ids" == vllm_hooks.OPTIONS["assistant_edits"]
    with pytest.raises(SetupError, match="assistant_edits must be one of"):
        vllm_patch.apply_patch("ignore")


def test_apply_patch_raises_when_the_target_is_missing(fake_vllm):
    fake_vllm("0.31.0", with_hook=False)
    with pytest.raises(SetupError, match="OnlineRenderer.preprocess_chat does not exist"):
        vllm_patch.apply_patch()


def test_apply_patch_raises_for_an_unsupported_vllm(fake_vllm):
    fake_vllm("0.40.2")
    with pytest.raises(SetupError, match="vLLM '0.40.2' is not supported"):
        vllm_patch.apply_patch()


# --------------------------------------------------------------------------------------------- pure pieces


@pytest.mark.parametrize(
    ("prompt", "max_len", "requested", "expected"),
    [(100, 512, 50, 50), (500, 512, 50, 12), (511, 512, 50, 1), (100, 512, None, None), (100, None, 7, 7)],
)
def test_clamp_output_budget(prompt, max_len, requested, expected):
    assert clamp_output_budget(prompt, max_len, requested) == expected


@pytest.mark.parametrize(("prompt", "requested"), [(512, 50), (600, None), (513, 1)])
def test_clamp_raises_vllms_context_message_when_the_prompt_alone_does_not_fit(prompt, requested):
    with pytest.raises(ContextLengthExceeded, match="This model's maximum context length is 512 tokens"):
        clamp_output_budget(prompt, 512, requested)


def test_find_anchor_cases():
    plain = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert find_anchor(FakeChatRequest(messages=plain), plain) is None
    with_ids = [*plain[:1], {**plain[1], "prompt_token_ids": [1], "generation_token_ids": [2]}, plain[0]]
    anchor = find_anchor(FakeChatRequest(messages=with_ids), with_ids)
    assert (anchor.index, anchor.model_prefix, anchor.required) == (1, [1, 2], None)
    # Disaggregated-serving reuse already fixes the ids: leave the request to vLLM.
    reuse = FakeChatRequest(messages=with_ids, kv_transfer_params={"prompt_token_ids": [9]})
    assert find_anchor(reuse, with_ids) is None
    # Gym's prefix supply without ids on messages: anchored at the last assistant message.
    required = FakeChatRequest(messages=plain, required_prefix_token_ids=[5, 6])
    anchor = find_anchor(required, [*plain, {"role": "user", "content": "c"}])
    assert (anchor.index, anchor.model_prefix, anchor.required) == (1, [5, 6], [5, 6])
    # No assistant message at all (NeMo RL's merged-tokens case): the required prefix alone, index -1.
    alone = find_anchor(FakeChatRequest(messages=plain[:1], required_prefix_token_ids=[5]), plain[:1])
    assert (alone.index, alone.model_prefix, alone.from_messages) == (-1, [5], False)
    with pytest.raises(TokenAlignmentError, match=r"required_prefix_token_ids\[0\] must be .*'x' \(str\)"):
        find_anchor(FakeChatRequest(messages=plain, required_prefix_token_ids=["x"]), plain)
    with pytest.raises(TokenAlignmentError, match="required_prefix_token_ids must be a list of token ids, got str"):
        find_anchor(FakeChatRequest(messages=plain, required_prefix_token_ids="5 6"), plain)
    # With the engine's vocabulary: an id past it is named, in a message and in the required prefix.
    with pytest.raises(TokenAlignmentError, match=r"messages\[1\]\.generation_token_ids\[0\] = 2 is out of vocab"):
        find_anchor(FakeChatRequest(messages=with_ids), with_ids, 2)
    with pytest.raises(TokenAlignmentError, match=r"required_prefix_token_ids\[1\] = 6 is out of vocabulary"):
        find_anchor(required, plain, 6)


# ------------------------------------------------------------------------------------------ the wrapper, live

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
IM_END, ENDOFTEXT = "<|im_end|>", "<|endoftext|>"


def _render_ids(tok, messages, add_generation_prompt=True) -> list[int]:
    text = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=add_generation_prompt)
    return tok.encode(text, add_special_tokens=False)


def _conversation(tok, content="Skinny weather in Paris", stop=IM_END, user_tail="And Oslo?", pad_words=0):
    first = [{"role": "user", "content": "What is the weather? " + "weather " * pad_words}]
    prompt = _render_ids(tok, first)
    generation = piecewise(tok, content) + ([tok.convert_tokens_to_ids(stop)] if stop else [])
    assistant = {
        "role": "assistant",
        "content": content,
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
        "generation_log_probs": [-0.5] * len(generation),
    }
    return [*first, assistant, {"role": "user", "content": user_tail}], prompt + generation


def _expected(tok, messages, history) -> list[int]:
    """History + what the template writes after the assistant turn (text-level, independent of the splice)."""
    plain = [{k: v for k, v in m.items() if not k.endswith("_ids") and k != "generation_log_probs"} for m in messages]
    full = tok.apply_chat_template(plain, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    head = tok.apply_chat_template(plain[:2], tools=TOOLS, tokenize=False, add_generation_prompt=False)
    cut = -1
    for _ in range(head.count(IM_END)):
        cut = full.index(IM_END, cut + 1)
    ended = history[-1] in (tok.convert_tokens_to_ids(IM_END), tok.convert_tokens_to_ids(ENDOFTEXT))
    tail = full[cut + len(IM_END) :] if ended else full[cut:]
    return history + tok.encode(tail, add_special_tokens=False)


async def _render(renderer, request, tools=TOOLS):
    return await renderer.preprocess_chat(request, request.messages, None, "auto", None, tools, parser="PARSER")


@pytest.mark.parametrize("stop", [IM_END, ENDOFTEXT, None])
async def test_spliced_prompt_is_the_model_history_plus_the_rendered_tail(patched_renderer, qwen_tokenizer, stop):
    messages, history = _conversation(qwen_tokenizer, stop=stop)
    request = FakeChatRequest(messages=messages, max_tokens=16)
    _, (engine_input,) = await _render(patched_renderer, request)
    expected = _expected(qwen_tokenizer, messages, history)
    assert engine_input["prompt_token_ids"] == expected
    assert expected != _render_ids(qwen_tokenizer, messages)  # stock vLLM would re-encode the history
    assert "prompt" not in engine_input  # stale text dropped
    # The request is left as the caller built it (the prefix render works on a copy).
    assert (request.add_generation_prompt, request.max_tokens) == (True, 16)
    # Fast path: the full render went through the hook once, with the caller's parser; the prefix as text only.
    assert [c["parser"] for c in patched_renderer.calls] == ["PARSER"]
    assert patched_renderer.renderer.text_renders == 1


async def test_slow_prefix_path_gives_the_same_prompt(patched_renderer, qwen_tokenizer, monkeypatch):
    messages, history = _conversation(qwen_tokenizer, stop=ENDOFTEXT)
    _, (fast,) = await _render(patched_renderer, FakeChatRequest(messages=messages, max_tokens=16))

    async def unavailable(*args, **kwargs):
        return None

    monkeypatch.setattr(vllm_hooks, "fast_prefix_ids", unavailable)
    patched_renderer.calls.clear()
    _, (slow,) = await _render(patched_renderer, FakeChatRequest(messages=messages, max_tokens=16))
    assert slow["prompt_token_ids"] == fast["prompt_token_ids"] == _expected(qwen_tokenizer, messages, history)
    # Prefix through the hook: messages[:k+1], no generation prompt, parser=None (its state was consumed).
    assert patched_renderer.calls[1] == {"n_messages": 2, "parser": None, "gen_prompt": False}


async def test_requests_without_ids_are_left_to_vllm(patched_renderer, qwen_tokenizer):
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "x"},
    ]
    _, (engine_input,) = await _render(patched_renderer, FakeChatRequest(messages=messages, max_tokens=16))
    assert engine_input["prompt_token_ids"] == _render_ids(qwen_tokenizer, messages)
    assert "prompt" in engine_input and len(patched_renderer.calls) == 1


async def test_tokenize_requests_get_the_same_splice(patched_renderer, qwen_tokenizer):
    messages, _ = _conversation(qwen_tokenizer)
    _, (chat,) = await _render(patched_renderer, FakeChatRequest(messages=messages, max_tokens=16))
    _, (tokenize,) = await _render(patched_renderer, FakeTokenizeRequest(messages=messages))
    assert tokenize["prompt_token_ids"] == chat["prompt_token_ids"]


@pytest.mark.parametrize(
    ("ids", "fragment"),
    [
        ({"prompt_token_ids": [1, 2, 3], "generation_token_ids": [4]}, "token history does not match"),
        ({"prompt_token_ids": [1, "x"], "generation_token_ids": [4]}, "int token id"),
        ({"prompt_token_ids": [1, 2]}, "generation_token_ids"),
    ],
)
async def test_alignment_errors_become_a_400_naming_the_problem(patched_renderer, ids, fragment):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", **ids}]
    with pytest.raises(FakeVLLMValidationError, match=fragment) as info:
        await _render(patched_renderer, FakeChatRequest(messages=[*messages, {"role": "user", "content": "x"}]))
    assert "nemo-gym-verl token splice" in str(info.value) and info.value.parameter == "messages"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
async def test_budget_is_clamped_where_stock_vllm_would_reject(patched_renderer, qwen_tokenizer, field):
    messages, _ = _conversation(qwen_tokenizer, pad_words=300)
    request = FakeChatRequest(messages=messages, **{field: 400})
    with pytest.raises(FakeVLLMValidationError):  # the unpatched render rejects prompt + 400 > 512
        await FakeOnlineRenderer(qwen_tokenizer).preprocess_chat(request, messages, None, "auto", None, TOOLS)
    _, (engine_input,) = await _render(patched_renderer, request)
    assert getattr(request, field) == MAX_MODEL_LEN - len(engine_input["prompt_token_ids"]) < 400


async def test_prompt_that_alone_exceeds_the_context_is_vllms_400(patched_renderer, qwen_tokenizer):
    # Renders to < 512 ids, but the model's piecewise ids of the answer make the spliced prompt longer.
    messages, history = _conversation(qwen_tokenizer, content="Skinny weather " * 140 + "end")
    assert len(_render_ids(qwen_tokenizer, messages)) < MAX_MODEL_LEN < len(history)
    request = FakeChatRequest(messages=messages, max_tokens=8)
    with pytest.raises(FakeVLLMValidationError, match="maximum context length is 512 tokens") as info:
        await _render(patched_renderer, request)
    assert info.value.parameter == "input_tokens" and request.max_tokens == 8


async def test_budget_is_restored_when_the_full_render_fails(patched_renderer, qwen_tokenizer):
    messages, _ = _conversation(qwen_tokenizer, pad_words=700)  # too long for 512 even without output tokens
    request = FakeChatRequest(messages=messages, max_tokens=8, max_completion_tokens=9)
    with pytest.raises(FakeVLLMValidationError, match="maximum context length"):
        await _render(patched_renderer, request)
    assert (request.max_tokens, request.max_completion_tokens) == (8, 9)


async def test_required_prefix_token_ids_is_honoured_and_checked(patched_renderer, qwen_tokenizer):
    messages, history = _conversation(qwen_tokenizer)
    expected = _expected(qwen_tokenizer, messages, history)
    ok = FakeChatRequest(messages=messages, required_prefix_token_ids=history)
    _, (engine_input,) = await _render(patched_renderer, ok)
    assert engine_input["prompt_token_ids"] == expected
    # No ids on the messages (Gym's prefix supply alone): the required prefix is the model prefix.
    bare = [{k: v for k, v in m.items() if "_ids" not in k and "log_probs" not in k} for m in messages]
    _, (engine_input,) = await _render(
        patched_renderer, FakeChatRequest(messages=bare, required_prefix_token_ids=history)
    )
    assert engine_input["prompt_token_ids"] == expected
    conflicting = FakeChatRequest(messages=messages, required_prefix_token_ids=[history[0] + 1, *history[1:]])
    with pytest.raises(FakeVLLMValidationError, match="required_prefix_token_ids"):
        await _render(patched_renderer, conflicting)


async def test_history_edited_in_place_is_a_400_naming_the_message(patched_renderer, qwen_tokenizer):
    messages, _ = _conversation(qwen_tokenizer)
    _, (engine_input,) = await _render(patched_renderer, FakeChatRequest(messages=messages, max_tokens=16))
    edited = [{**messages[0], "content": "What is the weather in Rome? "}, *messages[1:]]
    with pytest.raises(FakeVLLMValidationError, match=r"messages\[0\] \(user\) differs") as info:
        await _render(patched_renderer, FakeChatRequest(messages=edited, max_tokens=16))
    assert "Rome" in str(info.value) and info.value.parameter == "messages"


@pytest.mark.parametrize("policy", ["keep_ids", "refuse"])
async def test_assistant_edited_with_its_ids_kept_follows_the_policy(fake_vllm, qwen_tokenizer, policy):
    modules = fake_vllm("0.31.0")
    vllm_patch.apply_patch(policy)
    renderer = modules["vllm.renderers.online_renderer"].OnlineRenderer(qwen_tokenizer)
    messages, history = _conversation(qwen_tokenizer)
    _, (unedited,) = await _render(renderer, FakeChatRequest(messages=messages, max_tokens=16))
    edited = [messages[0], {**messages[1], "content": "Rainy weather in Paris"}, messages[2]]
    request = FakeChatRequest(messages=edited, max_tokens=16)
    if policy == "keep_ids":
        _, (engine_input,) = await _render(renderer, request)
        assert engine_input["prompt_token_ids"] == unedited["prompt_token_ids"]
        assert engine_input["prompt_token_ids"][: len(history)] == history
    else:
        with pytest.raises(FakeVLLMValidationError, match=r"messages\[1\]\.content is not what"):
            await _render(renderer, request)


# ------------------------------------------------------------------------------------------ fast prefix render


def test_stop_texts_need_a_fast_tokenizer_and_verbatim_stop_tokens(qwen_tokenizer):
    stops = frozenset({3000, 3002})
    found = vllm_prefix_render.stop_texts_for(qwen_tokenizer, stops)
    assert found is not None and found.ids == {ENDOFTEXT: 3000, IM_END: 3002}

    class FakeSlowTokenizer:
        is_fast = False
        added_tokens_decoder = qwen_tokenizer.added_tokens_decoder

    assert vllm_prefix_render.stop_texts_for(FakeSlowTokenizer(), stops) is None
    # A stop id that is an ordinary BPE token (not split off before BPE): no exactness guarantee.
    assert vllm_prefix_render.stop_texts_for(qwen_tokenizer, stops | {5}) is None


def test_prefix_ids_by_segments_refuses_ids_that_do_not_match_the_text(qwen_tokenizer):
    stops = vllm_prefix_render.stop_texts_for(qwen_tokenizer, frozenset({3000, 3002}))
    text = f"a{IM_END}b{IM_END}c"
    ids = qwen_tokenizer.encode(text, add_special_tokens=False)

    def encode(s):
        return qwen_tokenizer.encode(s, add_special_tokens=False)

    assert vllm_prefix_render.prefix_ids_by_segments(f"a{IM_END}x", text, ids, stops, encode) == encode(f"a{IM_END}x")
    assert vllm_prefix_render.prefix_ids_by_segments("a", text, ids[:-3], stops, encode) is None  # a stop id missing


_PIECES = [
    "Skinny",
    " weather",
    " Skinny",
    "\n",
    "\n\n",
    "  ",
    "é",
    '{"city": "Oslo"}',
    "<tool_call>",
    "</tool_call>",
    "<|im_start|>",
    "user",
    "assistant\n",
    "12",
    "34",
    "Oslo",
    "Rome",
    " ",
    IM_END,
    ENDOFTEXT,
    IM_END + "\n",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "ipython<|end_header_id|>\n\n",
]
_STOPS = {"qwen25": (ENDOFTEXT, IM_END), "llama3": ("<|eot_id|>", "<|end_of_text|>")}


@pytest.fixture(scope="module")
def tokenizers(tiny_model_dir):
    from transformers import AutoTokenizer

    return {family: AutoTokenizer.from_pretrained(tiny_model_dir(family)) for family in _STOPS}


@pytest.mark.parametrize("family", list(_STOPS))
@settings(max_examples=150, deadline=None)
@given(
    full_pieces=st.lists(st.sampled_from(_PIECES), max_size=40),
    keep=st.integers(min_value=0, max_value=40),
    edit=st.lists(st.sampled_from(_PIECES), max_size=6),
    tail=st.lists(st.sampled_from(_PIECES), max_size=6),
)
def test_prefix_ids_by_segments_equals_tokenizing_the_prefix(tokenizers, family, full_pieces, keep, edit, tail):
    """The exactness claim behind the fast path: reusing segment ids never differs from tokenizing the text."""
    tok = tokenizers[family]
    stops = vllm_prefix_render.stop_texts_for(tok, frozenset(tok.convert_tokens_to_ids(t) for t in _STOPS[family]))
    assert stops is not None

    def encode(text):
        return tok.encode(text, add_special_tokens=False)

    full_text = "".join(full_pieces)
    # A prefix that shares some segments, then differs (like Qwen3's think block) and ends with its own tail.
    prefix_text = "".join(full_pieces[:keep] + edit + tail)
    got = vllm_prefix_render.prefix_ids_by_segments(prefix_text, full_text, encode(full_text), stops, encode)
    assert got == encode(prefix_text)


# --------------------------------------------------------------------------------------------- Ray (faked)


class FakeRef:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error


class FakeActorHandle:
    def __init__(self, ref: FakeRef):
        self.__ray_call__ = types.SimpleNamespace(remote=lambda fn, *args: ref)


def _fake_ray(monkeypatch):
    ray = types.ModuleType("ray")
    exceptions = types.ModuleType("ray.exceptions")

    class GetTimeoutError(Exception):
        pass

    exceptions.GetTimeoutError = GetTimeoutError

    def get(ref, timeout=None):
        if ref.error is not None:
            raise ref.error
        return ref.value

    ray.get = get
    ray.exceptions = exceptions
    ray.get_runtime_context = lambda: types.SimpleNamespace(get_actor_name=lambda: "vllm_server_0_0")
    ray.util = types.SimpleNamespace(get_node_ip_address=lambda: "10.0.0.7")
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "ray.exceptions", exceptions)
    return exceptions


class FakeRunningActor:
    """A handle whose ``__ray_call__`` runs the function on an actor object here, as Ray runs it in the actor."""

    def __init__(self):
        self.__ray_call__ = types.SimpleNamespace(remote=lambda fn, *args: FakeRef(fn(object(), *args)))


def test_apply_patch_to_actors_carries_the_assistant_edits_policy(monkeypatch, fake_vllm):
    _fake_ray(monkeypatch)
    fake_vllm("0.31.0")
    monkeypatch.setitem(vllm_resume.OPTIONS, "enabled", True)
    monkeypatch.setattr(vllm_resume.SERVER, "ref", vllm_resume.SERVER.ref)
    actors = {"vllm_server_0_0": FakeRunningActor()}
    (report,) = vllm_patch.apply_patch_to_actors(actors, assistant_edits="refuse", partial_rollouts=False)
    assert (report.actor, report.assistant_edits, report.node_ip) == ("vllm_server_0_0", "refuse", "10.0.0.7")
    assert vllm_hooks.OPTIONS["assistant_edits"] == "refuse"
    assert report.partial_rollouts is False and vllm_resume.OPTIONS["enabled"] is False
    assert vllm_resume.SERVER.ref() is not None  # resumed segments read their weight version from that actor


def test_apply_patch_to_actors_names_the_actor_that_failed(monkeypatch):
    exceptions = _fake_ray(monkeypatch)
    good = vllm_patch.PatchReport("0.31.0", "hook", False, 1, "vllm_server_0_0")
    actors = {
        "vllm_server_0_0": FakeActorHandle(FakeRef(good)),
        "vllm_server_1_0": FakeActorHandle(FakeRef(error=RuntimeError("boom"))),
    }
    with pytest.raises(ServerError, match="failed in actor vllm_server_1_0: boom"):
        vllm_patch.apply_patch_to_actors(actors)
    slow = {"vllm_server_2_0": FakeActorHandle(FakeRef(error=exceptions.GetTimeoutError()))}
    with pytest.raises(ServerError, match="actor vllm_server_2_0 did not answer within 5s"):
        vllm_patch.apply_patch_to_actors(slow, timeout=5)
    assert vllm_patch.apply_patch_to_actors([FakeActorHandle(FakeRef(good))]) == [good]


# ------------------------------------------------------------------------------------------------ launcher


def test_launcher_takes_its_own_assistant_edits_flag_out_of_the_vllm_arguments():
    from nemo_gym_adapter.errors import AdapterConfigError
    from nemo_gym_adapter.vllm.server import pop_assistant_edits

    assert pop_assistant_edits(["--model", "m"]) == ("keep_ids", ["--model", "m"])
    assert pop_assistant_edits(["--ngv-assistant-edits", "refuse", "--port", "1"]) == ("refuse", ["--port", "1"])
    assert pop_assistant_edits(["--ngv-assistant-edits=keep_ids"]) == ("keep_ids", [])
    for bad in (["--ngv-assistant-edits", "drop"], ["--ngv-assistant-edits"]):
        with pytest.raises(AdapterConfigError, match="--ngv-assistant-edits must be one of"):
            pop_assistant_edits(bad)


def test_launcher_reads_the_keys_vllm_would_require_under_v1():
    """The standalone server guards every route with these (vLLM's own precedence: --api-key, else VLLM_API_KEY)."""
    from nemo_gym_adapter.vllm.server import api_keys

    assert api_keys(["--model", "m"], {}) == []
    assert api_keys(["--model", "m"], {"VLLM_API_KEY": "env"}) == ["env"]
    assert api_keys(["--api-key", "a", "b", "--port", "1"], {"VLLM_API_KEY": "env"}) == ["a", "b"]
    assert api_keys(["--api-key=a", "--api-key", "c"], {}) == ["c"]  # argparse: the last flag wins
    assert api_keys(["--api-key="], {"VLLM_API_KEY": ""}) == []


def test_launcher_reads_and_refuses_several_api_servers():
    from nemo_gym_adapter.errors import AdapterConfigError
    from nemo_gym_adapter.vllm.server import api_server_count, main

    assert api_server_count(["--model", "m"]) is None
    assert api_server_count(["--api-server-count", "2"]) == 2
    assert api_server_count(["--model", "m", "-asc=1"]) == 1
    with pytest.raises(AdapterConfigError, match="--api-server-count=3"):
        main(["--model", "m", "--api-server-count", "3"])


def test_the_launcher_without_the_patch_still_requires_the_key_on_every_route(monkeypatch):
    """``python -m nemo_gym_adapter.vllm.server --ngv-no-patch`` (``collect --no-patch``): vLLM's own rendering, the
    access guard still in front of every route; the flag never reaches vLLM's parser. The control: without the flag
    the patch is applied."""
    from nemo_gym_adapter.access import guard
    from nemo_gym_adapter.vllm import patch, plugin, server

    applied, served = [], []
    monkeypatch.setattr(patch, "apply_patch", lambda *a: applied.append(a) or pytest.fail("patched"))
    monkeypatch.setattr(plugin, "register_tool_parsers", lambda: None)
    monkeypatch.setattr(server, "_module_exists", lambda name: False)
    monkeypatch.setattr(server.runpy, "run_module", lambda *a, **kw: served.append(list(server.sys.argv[1:])))
    monkeypatch.setattr(server.sys, "argv", ["server"])
    monkeypatch.setenv("VLLM_API_KEY", "the-run-key")
    try:
        server.main(["--model", "m", server.NO_PATCH_FLAG])
        assert served == [["--model", "m"]] and not applied
        assert guard.is_guarded()
    finally:
        guard.remove_guard()
    monkeypatch.setattr(patch, "apply_patch", lambda *a: applied.append(a) or pytest.fail("the control: patched"))
    with pytest.raises(pytest.fail.Exception, match="the control: patched"):
        server.main(["--model", "m"])
