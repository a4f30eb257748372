"""The token-ID fields of one SGLang request, read from its raw body (SGLang's request model drops them).

SGLang 0.5.12's ``ChatCompletionRequest`` and its message models (``entrypoints/openai/protocol.py:597``, ``:520``,
``:543``) do not allow extra fields, so what Gym sends beyond the OpenAI schema never reaches the handler: the
``prompt_token_ids``/``generation_token_ids`` on assistant messages, ``required_prefix_token_ids`` (prefix supply),
``return_token_ids`` and ``return_tokens_as_token_ids``. :func:`make_request_wrapper` wraps ``handle_request``
(``serving_base.py:73``; inherited by ``OpenAIServingChat`` and ``OpenAIServingTokenize``, so it is set on each of those
classes), reads the raw body (Starlette keeps the bytes FastAPI already read) of ``/v1/chat/completions``,
``/tokenize`` and ``/v1/tokenize`` and puts a :class:`RequestIds` in :data:`CURRENT` for the rest of the request: a
``ContextVar``, because the render (:mod:`nemo_gym_adapter.sglang.hooks`) and the answer
(:mod:`nemo_gym_adapter.sglang.answer`) run later in the same task, while other requests interleave on the server's
one event loop.

The anchor is found here, from the raw messages (:func:`nemo_gym_adapter.tokens.anchor.find_anchor`, the vLLM hook's
code); a malformed id field is kept as an error and raised by the render, inside SGLang's own ``try``, which answers
400 with the message. The raw and the parsed message lists must have the same length, or ids are refused, never
attached to the wrong message. Pure apart from the wrapper; no SGLang import. Imported by ``sglang.hooks``,
``sglang.answer`` and ``sglang.patch``.
"""

from __future__ import annotations

import contextvars
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.tokens.anchor import REQUIRED_PREFIX_KEY, SPLICE_ERROR, Anchor, find_anchor, required_prefix

SENTINEL = "__ngv_original__"  # attribute on every installed wrapper, pointing at SGLang's original method
# Paths whose body is an OpenAI chat request (or a tokenize request with chat messages); chat is the one that generates.
ID_PATHS = ("/v1/chat/completions", "/tokenize", "/v1/tokenize")
CHAT_PATH = "/v1/chat/completions"


@dataclass
class RequestIds:
    """What one request's raw body says beyond SGLang's request model, and the prompt its render produced."""

    messages: list[Mapping[str, Any]] = field(default_factory=list)  # the raw messages, ids kept
    anchor: Anchor | None = None  # None: nothing to splice
    error: str | None = None  # a malformed id field: raised (400) when the request is rendered
    return_token_ids: bool = False  # vLLM's flag: prompt_token_ids + choices[i].token_ids in the answer
    tokens_as_ids: bool = False  # vLLM's flag: log-prob tokens as "token_id:N"
    generates: bool = True  # False for /tokenize: no output budget to clamp
    prompt_ids: list[int] | None = None  # the engine prompt (spliced or not), set by the render

    @property
    def splices(self) -> bool:
        """The request carries ids (or a malformed id field): the render must splice (or refuse)."""
        return self.anchor is not None or self.error is not None


CURRENT: contextvars.ContextVar[RequestIds | None] = contextvars.ContextVar("ngv_sglang_request_ids", default=None)


def read_request_ids(
    body: Mapping[str, Any], *, parsed_messages: int, generates: bool = True, vocab_size: int | None = None
) -> RequestIds:
    """The token-ID fields of a raw chat (or tokenize) request ``body``; ``parsed_messages``: how many messages
    SGLang's request model holds; ``vocab_size``: :func:`vocab_size` of the server, every id is checked against it
    (``splice.check_token_ids``). Never raises: an alignment problem is kept in ``error`` for the render."""
    messages = body.get("messages")
    ids = RequestIds(
        messages=list(messages) if isinstance(messages, list) else [],
        return_token_ids=body.get("return_token_ids") is True,
        tokens_as_ids=body.get("return_tokens_as_token_ids") is True,
        generates=generates,
    )
    try:
        ids.anchor = find_anchor(ids.messages, required_prefix(body.get(REQUIRED_PREFIX_KEY), vocab_size), vocab_size)
        if ids.anchor is not None and len(ids.messages) != parsed_messages:
            raise TokenAlignmentError(
                f"the request body holds {len(ids.messages)} messages but SGLang parsed {parsed_messages}: the token "
                "ids cannot be matched to their messages"
            )
    except TokenAlignmentError as e:
        ids.anchor, ids.error = None, f"{SPLICE_ERROR}: {e}"
    return ids


def vocab_size(serving: Any) -> int | None:
    """How many token ids the server takes: the larger of its tokenizer's size and the model's vocabulary (SGLang
    refuses ids from ``model_config.vocab_size`` on, ``tokenizer_manager._validate_input_ids_in_vocab``); None
    without a tokenizer manager."""
    manager = getattr(serving, "tokenizer_manager", None)
    sizes = []
    tokenizer = getattr(manager, "tokenizer", None)
    if tokenizer is not None:
        try:
            sizes.append(len(tokenizer))
        except TypeError:  # a tokenizer without a length: the model's vocabulary alone
            pass
    model = getattr(getattr(manager, "model_config", None), "vocab_size", None)
    if isinstance(model, int):
        sizes.append(model)
    return max(sizes) if sizes else None


def _loads(raw: bytes) -> Any:
    try:
        import orjson  # SGLang's own JSON library (faster on long id lists)

        return orjson.loads(raw)
    except ImportError:
        return json.loads(raw)


def make_request_wrapper(original: Any) -> Any:
    """``handle_request(self, request, raw_request)`` that sets :data:`CURRENT` from the raw body for the request's
    duration (None for other paths and bodies); carries SGLang's original under :data:`SENTINEL`."""

    @functools.wraps(original)
    async def handle_request(self: Any, request: Any, raw_request: Any = None) -> Any:
        ids = None
        path = getattr(getattr(raw_request, "url", None), "path", "") or ""
        if raw_request is not None and path.endswith(ID_PATHS):
            try:
                body = _loads(await raw_request.body())
            except ValueError:  # not JSON: SGLang's own validation answers it
                body = None
            if isinstance(body, dict):
                parsed = len(getattr(request, "messages", None) or [])
                ids = read_request_ids(
                    body, parsed_messages=parsed, generates=path.endswith(CHAT_PATH), vocab_size=vocab_size(self)
                )
        token = CURRENT.set(ids)
        try:
            return await original(self, request, raw_request)
        finally:
            CURRENT.reset(token)

    setattr(handle_request, SENTINEL, original)
    return handle_request
