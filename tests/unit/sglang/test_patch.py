"""Installing the SGLang patch on fake SGLang 0.5.12 classes: all six hooks once (idempotent, reported), inherited
methods wrapped on each subclass and given back by ``unpatch``, other versions and missing methods refused, the
actor-side checks (no tokenizer, verl's max_model_len). The real SGLang: tests/sglang/."""

from __future__ import annotations

import sys
import types

import pytest

from nemo_gym_adapter.errors import ServerError, SetupError
from nemo_gym_adapter.sglang import hooks, patch
from nemo_gym_adapter.sglang.request_ids import SENTINEL

OPENAI = "sglang.srt.entrypoints.openai"


def _fake_sglang(version: str, *, missing: str | None = None) -> dict[str, types.ModuleType]:
    def method(self, *args, **kwargs):
        return "original"

    class OpenAIServingBase:
        handle_request = method

    chat = {"_apply_jinja_template": method, "_apply_conversation_template": method, "_build_chat_response": method}
    chat.pop(missing or "", None)
    classes = {
        "serving_chat": type("OpenAIServingChat", (OpenAIServingBase,), chat),
        "serving_tokenize": type("OpenAIServingTokenize", (OpenAIServingBase,), {}),
        "serving_completions": type("OpenAIServingCompletion", (), {"_build_completion_response": method}),
    }
    modules = {name: types.ModuleType(name) for name in ("sglang", "sglang.srt", "sglang.srt.entrypoints", OPENAI)}
    modules["sglang"].__version__ = version  # type: ignore[attr-defined]
    for name, cls in classes.items():
        module = types.ModuleType(f"{OPENAI}.{name}")
        setattr(module, cls.__name__, cls)
        modules[module.__name__] = module
    modules["base"] = types.ModuleType("base")
    modules["base"].OpenAIServingBase = OpenAIServingBase  # type: ignore[attr-defined]
    return modules


@pytest.fixture
def fake_sglang(monkeypatch):
    monkeypatch.setitem(hooks.OPTIONS, "assistant_edits", "keep_ids")
    monkeypatch.setitem(hooks.OPTIONS, "max_model_len", None)

    def install(version: str = "0.5.12", **kw) -> dict[str, types.ModuleType]:
        modules = _fake_sglang(version, **kw)
        for name, module in modules.items():
            monkeypatch.setitem(sys.modules, name, module)
        return modules

    return install


def _classes(modules):
    return (
        modules[f"{OPENAI}.serving_chat"].OpenAIServingChat,
        modules[f"{OPENAI}.serving_tokenize"].OpenAIServingTokenize,
        modules[f"{OPENAI}.serving_completions"].OpenAIServingCompletion,
        modules["base"].OpenAIServingBase,
    )


def test_apply_patch_wraps_every_hook_once_and_reports_it(fake_sglang):
    chat, tokenize, completion, base = _classes(fake_sglang())
    report = patch.apply_patch("refuse", max_model_len=2048)
    assert (report.backend, report.version, report.already_patched) == ("sglang", "0.5.12", False)
    assert report.hook == f"{OPENAI}.serving_chat.OpenAIServingChat._apply_jinja_template"
    assert len(report.hooks) == 6 and (report.assistant_edits, report.max_model_len) == ("refuse", 2048)
    for cls, method in [
        (chat, "_apply_jinja_template"),
        (chat, "_apply_conversation_template"),
        (chat, "_build_chat_response"),
        (chat, "handle_request"),
        (tokenize, "handle_request"),
        (completion, "_build_completion_response"),
    ]:
        assert getattr(cls.__dict__[method], SENTINEL, None) is not None, (cls, method)
    assert "handle_request" not in base.__dict__ or getattr(base.handle_request, SENTINEL, None) is None
    assert hooks.OPTIONS == {**hooks.OPTIONS, "assistant_edits": "refuse", "max_model_len": 2048}
    assert patch.is_patched() and patch.apply_patch().already_patched
    patch.unpatch()
    assert not patch.is_patched()
    assert "handle_request" not in chat.__dict__ and "handle_request" not in tokenize.__dict__  # inherited again
    assert getattr(chat._apply_jinja_template, SENTINEL, None) is None


def test_other_versions_and_missing_methods_are_refused_naming_them(fake_sglang):
    fake_sglang("0.5.10")
    with pytest.raises(SetupError, match=r"SGLang '0.5.10' is not supported .* 0.5.12"):
        patch.apply_patch()
    modules = fake_sglang(missing="_build_chat_response")
    with pytest.raises(SetupError, match="OpenAIServingChat._build_chat_response is missing"):
        patch.apply_patch()
    assert getattr(_classes(modules)[0].__dict__["_apply_jinja_template"], SENTINEL, None) is None  # nothing wrapped
    with pytest.raises(SetupError, match="assistant_edits must be one of"):
        patch.apply_patch("drop")


def test_inside_an_actor_a_server_without_tokenizer_is_refused_and_verls_max_model_len_taken(fake_sglang, monkeypatch):
    fake_sglang()
    monkeypatch.setattr(patch, "actor_identity", lambda actor: ("sglang_server_0_0", "10.0.0.7"))
    no_tokenizer = types.SimpleNamespace(tokenizer_manager=types.SimpleNamespace(tokenizer=None))
    with pytest.raises(SetupError, match="actor_rollout_ref.rollout.skip_tokenizer_init=False"):
        patch._patch_inside_actor(no_tokenizer)
    server = types.SimpleNamespace(
        tokenizer_manager=types.SimpleNamespace(tokenizer=object()), config=types.SimpleNamespace(max_model_len=4096)
    )
    report = patch._patch_inside_actor(server, "refuse")
    assert (report.actor, report.node_ip, report.max_model_len) == ("sglang_server_0_0", "10.0.0.7", 4096)
    assert hooks.OPTIONS["max_model_len"] == 4096


def test_the_actor_that_failed_is_named(monkeypatch):
    def call_on_actors(handles, fn, *args, timeout, what):
        raise ServerError(f"{what} failed in actor sglang_server_1_0: boom")

    monkeypatch.setattr(patch, "call_on_actors", call_on_actors)
    with pytest.raises(ServerError, match="SGLang token-ID patch failed in actor sglang_server_1_0"):
        patch.apply_patch_to_actors({"sglang_server_1_0": object()})
