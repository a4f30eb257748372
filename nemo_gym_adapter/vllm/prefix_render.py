"""The splice's ``prefix_render`` on vLLM at template cost, reusing the full render's token ids (used by ``vllm.hooks``).

The splice needs the token ids of ``messages[:k+1]`` rendered without a generation prompt; rendering them through
vLLM again would cost as much as the request's own render. :func:`fast_prefix_ids` renders the prefix to *text* with
vLLM's renderer (Jinja only) and reuses the full render's ids segment by segment
(:func:`nemo_gym_adapter.tokens.prefix_reuse.prefix_render_by_segments`, backend-neutral: why that is exact is in its
docstring). Whenever it cannot prove exactness (no rendered text, multimodal parts, prompt embeddings, special tokens
added by the request) it returns None and the caller renders through vLLM's hook instead. Imported by ``vllm.hooks``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from nemo_gym_adapter.tokens.prefix_reuse import (
    StopTexts,
    prefix_ids_by_segments,
    prefix_render_by_segments,
    stop_texts_for,
)
from nemo_gym_adapter.tokens.stops import Stops

__all__ = [
    "StopTexts",
    "build_chat_params",
    "fast_prefix_ids",
    "prefix_ids_by_segments",
    "prefix_render_by_segments",
    "stop_texts_for",
]


async def fast_prefix_ids(
    serving: Any,
    prefix_request: Any,
    prefix_messages: list[Any],
    render_args: tuple,
    full: Mapping[str, Any],
    full_stops: Stops,
) -> Stops | None:
    """Render ``prefix_messages`` to text with vLLM's renderer, then ``prefix_render_by_segments``; None = not exact.

    ``serving``: vLLM's ``OnlineRenderer`` (0.25+) or ``OpenAIServingRender`` (0.20-0.24): ``.renderer`` and
    ``.model_config``. ``render_args``: ``(default_template, content_format, default_template_kwargs, tool_dicts)``
    as given to ``preprocess_chat``; ``full``: the full render's engine input (needs its ``prompt`` text);
    ``full_stops``: its ``prompt_token_ids`` with their turn ends (``Stops`` of the template's stop ids).
    The chat parameters are built as ``preprocess_chat`` builds them for a text-only request.
    """
    default_template, content_format, template_kwargs, tool_dicts = render_args
    full_text = full.get("prompt")
    tokenizer = serving.renderer.tokenizer
    if (
        not isinstance(full_text, str)
        or getattr(prefix_request, "add_special_tokens", False)
        or getattr(serving.model_config, "enable_prompt_embeds", False)
    ):
        return None
    stops = stop_texts_for(tokenizer, full_stops.stop_ids)
    if stops is None:
        return None
    kwargs = dict(template_kwargs or {})
    if tool_dicts is not None:
        kwargs["tools"] = tool_dicts
    kwargs["tokenize"] = False
    chat_params = build_chat_params(serving, prefix_request, default_template, content_format).with_defaults(kwargs)
    _, prompt = await serving.renderer.render_messages_async(prefix_messages, chat_params)
    text = prompt.get("prompt") if isinstance(prompt, dict) else None
    if not isinstance(text, str) or set(prompt) - {"prompt"}:
        return None
    return prefix_render_by_segments(
        text, full_text, full_stops, stops, lambda s: tokenizer.encode(s, add_special_tokens=False)
    )


def build_chat_params(serving: Any, request: Any, default_template: str | None, content_format: Any) -> Any:
    """``request.build_chat_params`` as ``preprocess_chat`` calls it: from vLLM 0.33 a chat or Responses request also
    takes the server's ``--reasoning-effort-map`` (``serving.reasoning_effort_map``), which rewrites the requested
    effort (and so ``enable_thinking``) before the template sees it; a request type whose ``build_chat_params`` has no
    such parameter (``/tokenize``'s) is not given it, nor is anything on a release without the map (<= 0.32)."""
    effort_map = getattr(serving, "reasoning_effort_map", None)
    if effort_map and "reasoning_effort_map" in inspect.signature(request.build_chat_params).parameters:
        return request.build_chat_params(default_template, content_format, reasoning_effort_map=effort_map)
    return request.build_chat_params(default_template, content_format)
