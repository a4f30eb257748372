"""SGLang's answer as Gym reads it: the token ids and log-prob tokens in vLLM's shape, and 503 for an aborted turn.

**Token fields.** Gym's ``vllm_model`` (``return_token_id_information: true``) sends vLLM's flags and reads vLLM's
fields: ``return_tokens_as_token_ids`` -> every ``choices[i].logprobs.content[j].token`` is ``"token_id:N"``;
``return_token_ids`` (with ``request_prompt_and_generation_token_ids: true``) -> ``prompt_token_ids`` at the top level
and ``choices[i].token_ids``. Stock SGLang 0.5.12 drops both flags (its request model has no such fields), answers
log-prob tokens as text and has no id fields in ``ChatCompletionResponse`` (``protocol.py:920``), so Gym's capture
raises on every call ("must use the token_id:<int> format"). :func:`make_response_wrapper` wraps
``OpenAIServingChat._build_chat_response`` (``serving_chat.py:1112``) and adds exactly those fields when the request
asked (flags read from the raw body, :mod:`nemo_gym_adapter.sglang.request_ids`): the prompt is the one the engine got
(spliced or not), the generation SGLang's ``output_ids`` through the stop token, the ids of the log-prob tokens from
``meta_info.output_token_logprobs``. Without the flags the answer is SGLang's own, untouched.

**Aborted generations.** verl's ``abort_all_requests`` (async weight syncs) calls SGLang's
``pause_generation(mode="abort")``; the scheduler finishes each running request with ``FINISH_ABORT`` and SGLang
answers **200** with ``finish_reason: "abort"`` and the cut text (``tokenizer_manager.py:1241`` passes a graceful abort
through). Gym would take the cut turn as finished. Here such an answer becomes a **503** whose message starts with
:data:`ABORT_MARKER` (``wire.payloads.GENERATION_ABORTED``, which ``rollouts.trajectory`` recognises): Gym retries 503, the
retry waits in SGLang's paused tokenizer manager until ``resume_generation`` and is regenerated on the new weights,
as on vLLM (:mod:`nemo_gym_adapter.vllm.abort`). ``/v1/completions`` (``_build_completion_response``,
``serving_completions.py:470``) gets the same guard. Streaming is not guarded: Gym never streams. Each 503 is counted
in the serving process (:func:`aborted_total`, summed over verl's actors by ``sglang.patch.aborted_turns``).

Installed by :mod:`nemo_gym_adapter.sglang.patch`; fastapi (SGLang's dependency) is imported when an answer is built.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from nemo_gym_adapter.sglang.request_ids import CURRENT, SENTINEL, RequestIds
from nemo_gym_adapter.wire.payloads import GENERATION_ABORTED

ABORT_MARKER = f"{GENERATION_ABORTED} by the SGLang engine"
ABORT_MESSAGE = (
    f"{ABORT_MARKER} (finish_reason='abort': the engine was paused for a weight sync, or the request was aborted); "
    "the partial output is withheld so that it is not trained as a finished turn; retry the request"
)
# In this process: aborted answers turned into 503s, and the generated tokens they withheld (Gym's retry generates
# them again: SGLang has no partial rollouts here, docs/SGLANG.md).
_COUNTS = {"aborted": 0, "regenerated_tokens": 0}


def aborted_total() -> int:
    """How many aborted generations were answered 503 in this process since it started (chat and completions)."""
    return _COUNTS["aborted"]


def regenerated_tokens_total() -> int:
    """How many generated tokens those 503s withheld in this process."""
    return _COUNTS["regenerated_tokens"]


def was_aborted(ret_item: Mapping[str, Any]) -> bool:
    """True when one of SGLang's generation results (``ret`` of ``_build_*_response``) ended with an abort."""
    reason = (ret_item.get("meta_info") or {}).get("finish_reason")
    return isinstance(reason, Mapping) and reason.get("type") == "abort"


def refuse(serving: Any, ret: Sequence[Mapping[str, Any]] = ()) -> Any:
    """Count one aborted answer (and the generated tokens of ``ret``, the results it withholds) and return the
    serving object's own 503 error response naming the abort."""
    _COUNTS["aborted"] += 1
    _COUNTS["regenerated_tokens"] += sum(len(r.get("output_ids") or ()) for r in ret)
    return serving.create_error_response(
        ABORT_MESSAGE, err_type="ServiceUnavailableError", status_code=HTTPStatus.SERVICE_UNAVAILABLE
    )


def token_fields(body: dict[str, Any], ret: Sequence[Mapping[str, Any]], ids: RequestIds) -> dict[str, Any]:
    """``body`` (a chat completion as SGLang built it, ``model_dump()``) with the fields the request asked for."""
    for choice, item in zip(body["choices"], ret, strict=True):
        if ids.return_token_ids:
            choice["token_ids"] = [int(t) for t in item.get("output_ids") or []]
        logprobs = choice.get("logprobs")
        if ids.tokens_as_ids and isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            pairs = (item.get("meta_info") or {}).get("output_token_logprobs") or []
            for entry, pair in zip(logprobs["content"], pairs, strict=True):
                entry["token"] = f"token_id:{int(pair[1])}"  # SGLang's (logprob, token id, text)
    if ids.return_token_ids:
        body["prompt_token_ids"] = ids.prompt_ids
    return body


def json_response(body: dict[str, Any]) -> Any:
    """A 200 JSON answer (orjson where installed, as SGLang's own answers; long id lists serialise fast)."""
    from fastapi.responses import Response

    try:
        import orjson

        content = orjson.dumps(body)
    except ImportError:
        content = json.dumps(body).encode()
    return Response(content=content, media_type="application/json")


def make_response_wrapper(original: Any, *, chat: bool = True) -> Any:
    """``_build_chat_response`` (``chat``) or ``_build_completion_response``, both ``(self, request, ret, created)``:
    a 503 for an aborted generation; for chat, the token fields the request asked for. Carries the original under
    ``SENTINEL``."""

    @functools.wraps(original)
    def build_response(self: Any, request: Any, ret: Sequence[Mapping[str, Any]], created: int) -> Any:
        if any(was_aborted(r) for r in ret):
            return refuse(self, ret)
        response = original(self, request, ret, created)
        ids = CURRENT.get() if chat else None
        if ids is None or not (ids.return_token_ids or ids.tokens_as_ids) or not hasattr(response, "model_dump"):
            return response
        return json_response(token_fields(response.model_dump(), ret, ids))

    setattr(build_response, SENTINEL, original)
    return build_response
