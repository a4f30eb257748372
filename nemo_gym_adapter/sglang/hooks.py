"""The SGLang hook of the token-ID patch: the splice in SGLang 0.5.12's chat-template render.

Same contract as the vLLM hook (:mod:`nemo_gym_adapter.vllm.hooks`) and the same token math
(:mod:`nemo_gym_adapter.tokens`: anchor, splice, in-place edit check with the same-text retokenization rule,
``assistant_edits``, required prefix (also on a conversation without an assistant message), budget clamp, prefix ids
reused); only where SGLang is touched differs. In SGLang 0.5.12
(``sglang/srt/entrypoints/openai/serving_chat.py``):

* prompt ids come from ``OpenAIServingChat._apply_jinja_template`` (``:516``, sync), reached from ``_process_messages``
  (``:456``), which both ``/v1/chat/completions`` (``_convert_to_internal_request``, ``:389``) and ``/tokenize`` with
  messages (``serving_tokenize.py:97``) call: one hook, so Gym's ``/tokenize`` and the engine prompt agree.
  :func:`make_render_wrapper` runs SGLang's original with a recording tokenizer, so SGLang's own message processing
  (content formats, tool-call arguments parsed, ``Tool.model_dump()`` tools, ``chat_template_kwargs``) builds the
  template input; it then renders ``messages[:k+1]`` from that same input without a generation prompt (fast: two
  Jinja renders and the full render's ids reused segment by segment; slow: tokenized whole), splices, and clamps
  ``max_completion_tokens``/``max_tokens`` (read after the render by ``to_sampling_params``, ``protocol.py:833``) to the
  context: SGLang's ``context_len`` minus its reserved tokens, and verl's ``rollout.max_model_len`` when smaller
  (verl never passes it to SGLang). Errors are ``ValueError`` s: SGLang's ``handle_request`` answers 400 with the
  message (``serving_base.py:114``), which for a context overflow says "maximum context length" as Gym expects;
* ``_apply_conversation_template`` (``:713``, a named ``--chat-template`` conversation template) and the DeepSeek
  V3.2/V4 Python encoders (``chat_encoding_spec``, inside ``_apply_jinja_template``) bypass the Hugging Face template;
  a multimodal model renders text that SGLang re-tokenizes later. A request carrying ids there is refused (400),
  never silently re-rendered (:func:`make_conversation_guard`, :func:`make_render_wrapper`).

Requests without ids are SGLang's own (the wrapper only records the prompt ids for the answer). Which request carries
ids is read from its raw body (:mod:`nemo_gym_adapter.sglang.request_ids`). Installed by
:mod:`nemo_gym_adapter.sglang.patch`; SGLang is never imported here.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping
from typing import Any

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.sglang.request_ids import CURRENT, SENTINEL, RequestIds
from nemo_gym_adapter.tokens.anchor import REQUIRED_PREFIX_KEY, SPLICE_ERROR, splice_request
from nemo_gym_adapter.tokens.budget import check_budget, clamp_output_budget
from nemo_gym_adapter.tokens.prefix_reuse import prefix_render_by_segments, stop_texts_for
from nemo_gym_adapter.tokens.same_text import SameText
from nemo_gym_adapter.tokens.stops import Stops
from nemo_gym_adapter.tokens.turn_template import TurnTemplate, turn_template_from_tokenizer

# Process-wide options (the patch itself is process-wide): set by sglang.patch.apply_patch, read per request.
# max_model_len: verl's rollout.max_model_len, a clamp limit besides SGLang's own context length.
# fast_prefix: reuse the full render's ids for the prefix render when provably exact (tests switch it off).
OPTIONS: dict[str, Any] = {"assistant_edits": "keep_ids", "max_model_len": None, "fast_prefix": True}


class _RecordingTokenizer:
    """The server's tokenizer, recording the arguments of the last ``apply_chat_template`` call that succeeded."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.call: tuple[list, dict] | None = None

    def apply_chat_template(self, conversation: list, **kwargs: Any) -> Any:
        result = self._tokenizer.apply_chat_template(conversation, **kwargs)
        self.call = (conversation, dict(kwargs))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


class _Delegate:
    """``obj`` with some attributes replaced: the serving handler whose ``tokenizer_manager.tokenizer`` records."""

    def __init__(self, obj: Any, **replaced: Any) -> None:
        self.__dict__.update(replaced)
        self.__dict__["_obj"] = obj

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_obj"], name)


def make_render_wrapper(original: Any) -> Any:
    """``_apply_jinja_template(self, request, tools, is_multimodal)`` that splices the model's own tokens into the
    prompt of a request carrying ids (the module docstring); carries SGLang's original under ``SENTINEL``."""

    @functools.wraps(original)
    def _apply_jinja_template(self: Any, request: Any, tools: Any, is_multimodal: bool) -> Any:
        ids = CURRENT.get()
        if ids is None or not ids.splices:
            result = original(self, request, tools, is_multimodal)
            if ids is not None:
                ids.prompt_ids = list(result.prompt_ids) if isinstance(result.prompt_ids, list) else None
            return result
        if ids.error is not None:
            raise TokenAlignmentError(ids.error)
        _refuse_other_renderers(self, is_multimodal, ids)
        tokenizer = self.tokenizer_manager.tokenizer
        recorder = _RecordingTokenizer(tokenizer)
        proxy = _Delegate(self, tokenizer_manager=_Delegate(self.tokenizer_manager, tokenizer=recorder))
        result = original(proxy, request, tools, is_multimodal)
        try:
            prompt = _splice(self, request, result, recorder, ids)
        except TokenAlignmentError as e:
            raise TokenAlignmentError(f"{SPLICE_ERROR}: {e}") from e
        if ids.generates:
            _clamp(self, request, len(prompt))  # ContextLengthExceeded: a ValueError, SGLang's 400
        result.prompt_ids = ids.prompt_ids = prompt
        return result

    setattr(_apply_jinja_template, SENTINEL, original)
    return _apply_jinja_template


def _splice(serving: Any, request: Any, result: Any, recorder: _RecordingTokenizer, ids: RequestIds) -> list[int]:
    """The spliced prompt, from the template input SGLang built (``recorder``) and its full render (``result``)."""
    assert ids.anchor is not None
    if recorder.call is None or not isinstance(result.prompt_ids, list):
        raise TokenAlignmentError("SGLang did not render the request through the chat template")
    conversation, kwargs = recorder.call
    if getattr(request, "continue_final_message", False) or len(conversation) != len(ids.messages):
        raise TokenAlignmentError(
            f"the chat template was given {len(conversation)} messages for the request's {len(ids.messages)} "
            "(continue_final_message is not supported together with token ids)"
        )
    template, same_text = _templates_of(serving)
    tokenizer = recorder._tokenizer
    # The full render's turn ends, found once: the prefix reuse and the splice both work on them.
    full = Stops.of(list(result.prompt_ids), template.stop_ids)
    prefix_ids = None  # the required prefix alone (anchor.index -1): no assistant message to render through
    if ids.anchor.renders_prefix:
        prefix_ids = _prefix_ids(tokenizer, conversation, kwargs, ids.anchor.index, full, template)
    return splice_request(
        ids.anchor,
        ids.messages,
        prefix_ids,
        full,
        template,
        decode=tokenizer.decode,
        assistant_edits=OPTIONS["assistant_edits"],
        same_text=same_text,
    )


def _refuse_other_renderers(serving: Any, is_multimodal: bool, ids: RequestIds) -> None:
    """A 400 for a request with ids that SGLang would render around the Hugging Face chat template."""
    encoder = getattr(serving, "chat_encoding_spec", None)
    if encoder is None and not is_multimodal:
        return
    what = f"the {encoder} Python chat encoder" if encoder is not None else "a multimodal model's text render"
    index = ids.anchor.index if ids.anchor is not None else "?"
    where = REQUIRED_PREFIX_KEY if index == -1 else f"messages[{index}]"
    raise TokenAlignmentError(
        f"{SPLICE_ERROR}: this server renders chats with {what}, not the Hugging Face chat template the splice "
        f"re-renders, so the token ids of {where} would be ignored; not supported by the token-ID patch"
    )


def _prefix_ids(
    tokenizer: Any, conversation: list, kwargs: dict, index: int, full: Stops, template: TurnTemplate
) -> Stops | list[int]:
    """``conversation[:index+1]`` rendered without a generation prompt, with SGLang's own template input and kwargs.

    Fast path (:data:`OPTIONS` ``fast_prefix``): the full and the prefix text rendered (Jinja only) and the full
    render's ids reused segment by segment (``tokens.prefix_reuse``); otherwise, or when that is not provably exact,
    the prefix tokenized whole."""
    prefix_kwargs = {**kwargs, "add_generation_prompt": False}
    if OPTIONS["fast_prefix"]:
        stops = stop_texts_for(tokenizer, template.stop_ids)
        if stops is not None:
            full_text = tokenizer.apply_chat_template(conversation, **{**kwargs, "tokenize": False})
            prefix_text = tokenizer.apply_chat_template(
                conversation[: index + 1], **{**prefix_kwargs, "tokenize": False}
            )
            if isinstance(full_text, str) and isinstance(prefix_text, str):
                fast = prefix_render_by_segments(
                    prefix_text, full_text, full, stops, lambda s: tokenizer.encode(s, add_special_tokens=False)
                )
                if fast is not None:
                    return fast
    out = tokenizer.apply_chat_template(conversation[: index + 1], **prefix_kwargs)
    return list(out["input_ids"] if isinstance(out, Mapping) else out)


def context_limit(tokenizer_manager: Any) -> int:
    """The most tokens a request may hold: SGLang's context length minus the tokens it reserves (speculative
    decoding), and verl's ``rollout.max_model_len`` (:data:`OPTIONS`) when that is smaller."""
    limit = int(tokenizer_manager.context_len) - int(getattr(tokenizer_manager, "num_reserved_tokens", 0) or 0)
    if OPTIONS["max_model_len"]:
        limit = min(limit, int(OPTIONS["max_model_len"]))
    return limit


def _clamp(serving: Any, request: Any, prompt_len: int) -> None:
    """The output budget after the splice: prompt + output within :func:`context_limit` (``ContextLengthExceeded``,
    a 400, when nothing fits). SGLang reads ``max_completion_tokens or max_tokens``: the one set is clamped."""
    name = "max_completion_tokens" if getattr(request, "max_completion_tokens", None) is not None else "max_tokens"
    requested = getattr(request, name, None)
    check_budget(requested, name)  # BudgetOutOfRange: a ValueError, SGLang's 400
    budget = clamp_output_budget(prompt_len, context_limit(serving.tokenizer_manager), requested)
    if requested is not None:
        setattr(request, name, budget)


def make_conversation_guard(original: Any) -> Any:
    """``_apply_conversation_template`` (a named SGLang conversation template): a request carrying ids is a 400;
    others go to SGLang's ``original`` (carried under ``SENTINEL``)."""

    @functools.wraps(original)
    def _apply_conversation_template(self: Any, request: Any, is_multimodal: bool) -> Any:
        ids = CURRENT.get()
        if ids is not None and ids.splices:
            name = getattr(self.template_manager, "chat_template_name", None)
            raise TokenAlignmentError(
                f"{SPLICE_ERROR}: this server renders chats with the SGLang conversation template {name!r} "
                "(--chat-template), not a Hugging Face chat template, so the token ids on the messages would be "
                "ignored; serve the model's own chat template"
            )
        return original(self, request, is_multimodal)

    setattr(_apply_conversation_template, SENTINEL, original)
    return _apply_conversation_template


# Per tokenizer (weakly held): {chat template text -> (TurnTemplate, SameText or None)}.
_TEMPLATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def turn_template_of(serving: Any) -> TurnTemplate:
    """The TurnTemplate of the server's tokenizer and chat template, derived once (rendering a probe costs ~ms).
    Stop ids include the generation config's EOS ids (``model_config.hf_eos_token_id``): SGLang stops at them too."""
    return _templates_of(serving)[0]


def _templates_of(serving: Any) -> tuple[TurnTemplate, SameText | None]:
    """:func:`turn_template_of` and the tokenizer's exact text comparison (``tokens.same_text``: a history spelled in
    other tokens than the render is kept; None when its decode cannot be made exact), derived once per template."""
    tokenizer_manager = serving.tokenizer_manager
    tokenizer = tokenizer_manager.tokenizer
    per_tokenizer = _TEMPLATES.setdefault(tokenizer, {})
    key = getattr(tokenizer, "chat_template", None)
    key = key if isinstance(key, str) else None  # a dict of named templates: the default one is used
    if key not in per_tokenizer:
        eos = getattr(tokenizer_manager.model_config, "hf_eos_token_id", None) or ()
        eos_ids = [eos] if isinstance(eos, int) else [t for t in eos if type(t) is int]
        template = turn_template_from_tokenizer(tokenizer, eos_ids)
        per_tokenizer[key] = (template, SameText.for_tokenizer(tokenizer, template.added_ids))
    return per_tokenizer[key]
