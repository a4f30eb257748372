"""Partial rollouts on vLLM's OpenAI server: a turn an engine pause aborted is resumed in place, not regenerated.

Why: verl 0.9.1's async trainers pause every vLLM engine with mode ``abort`` before each weight sync
(``vLLMHttpServer.abort_all_requests`` -> ``AsyncLLM.pause_generation``; docs/V1_NOTES.md). verl's own agent loops
resume an aborted request with prompt + partial tokens (``FullyAsyncLLMServerClient``); Gym's HTTP calls cannot, so
until now the abort guard (:mod:`nemo_gym_adapter.vllm.abort`) answered 503 and Gym regenerated the turn from its
start: every token generated before the sync was thrown away.

How: the engine call of a non-streaming ``/v1/chat/completions`` or ``/v1/completions`` request is wrapped. When its
final output ended ``finish_reason="abort"`` and the turn can be resumed (:func:`nemo_gym_adapter.tokens.resume.refusal`),
the same engine gets a new request right away: prompt = the request's engine prompt + the model's own tokens so far,
sampling = the request's own, with what the budget had left (``tokens.resume.resumed_limits``; the context clamp
holds) and a new seed. The paused engine queues it (every vLLM pause mode queues new requests) and runs it after
``resume_generation``, on the weights of the sync, with a fresh prefix cache. Its output is merged with the earlier
segments into one ``RequestOutput``: all token ids, all log-probs (each segment's from the weights that generated
it), the request's own prompt, the last segment's finish. The text is recomputed over all ids with the engine's own
incremental detokenizer (:func:`replay`), primed with the request's prompt as the engine primes it: the resumed
request's own text is not the continuation when a character is split at the seam (measured on vLLM 0.31: it can
even restart with prompt text), and its stop-string check never sees a stop string that starts before the seam.
When the replay finds one, the answer ends there as vLLM would have ended it (``finish_reason="stop"``; the ids up
to the token that completed it; counted in ``seam_stop_cuts``). vLLM's serving code then builds the answer from the
merged output as from any other, so Gym gets one ordinary completion (and the abort guard never sees an abort).

A turn that cannot be resumed (a reason of ``tokens.resume.REFUSALS``, counted per reason) keeps its abort: the guard
answers 503 and Gym regenerates it, as before. Each segment's weight version is read from verl's server actor
(``global_steps``, registered by :func:`set_server` when the patch is applied through Ray; ``None`` elsewhere), and a
resumed turn's segments are kept in :data:`LEDGER` under ``tokens.resume.turn_key`` of its prompt and generated ids.

Where it hooks (vLLM 0.24 and 0.31 alike): ``OpenAIServingChat.create_chat_completion`` and
``OpenAIServingCompletion.create_completion`` mark their (non-streaming) requests with a context variable, and
``generate`` of their engine client's class (``AsyncLLM`` in verl) resumes the calls made under that mark; every
other call of the engine (verl's own token-in/token-out ``generate``, streaming, beam search) is the original, untouched.
"""

from __future__ import annotations

import collections
import contextvars
import copy
import dataclasses
import functools
import importlib
import logging
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from nemo_gym_adapter.errors import SetupError
from nemo_gym_adapter.tokens import resume as plan
from nemo_gym_adapter.vllm.abort import was_aborted

logger = logging.getLogger(__name__)

# (module, "Class.method"): the serving methods whose non-streaming requests may be resumed.
SCOPE_TARGETS = (
    ("vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat.create_chat_completion"),
    ("vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion.create_completion"),
)
SENTINEL = "__ngv_resume__"
OPTIONS = {"enabled": True}  # nemo_gym.partial_rollouts, set by vllm.patch.apply_patch
_SCOPE: contextvars.ContextVar[Any] = contextvars.ContextVar("ngv_resume_scope", default=None)
# Engine prompt keys a resumed prompt may carry over (a plain token prompt); any other key is not resumed.
_TOKEN_PROMPT_KEYS = frozenset(
    {"type", "prompt_token_ids", "prompt", "prompt_token_offsets", "prompt_is_token_ids", "arrival_time", "cache_salt"}
)
_COUNTS: collections.Counter[str] = collections.Counter()
LEDGER = plan.Ledger()


class _Server:
    """verl's server actor of this process (weakly held): its weight version and whether it refuses new requests."""

    ref: Callable[[], Any] = staticmethod(lambda: None)

    def version(self) -> int | None:
        value = getattr(self.ref(), "global_steps", None)
        return value if isinstance(value, int) else None

    def rejecting(self) -> bool:
        # verl's vLLMHttpServer: abort_all_requests(reject_request=True) when a replica leaves rotation.
        return bool(getattr(self.ref(), "_rejecting", False))


SERVER = _Server()


def set_server(actor_self: Any) -> None:
    """Read segment weight versions (``global_steps``) and the reject flag from ``actor_self``, verl's server actor."""
    try:
        SERVER.ref = weakref.ref(actor_self)
    except TypeError:  # an object without weak references (the actor lives as long as the process anyway)
        SERVER.ref = lambda: actor_self


def counters() -> dict[str, int]:
    """This process's partial-rollout counts since it started: ``interrupted_turns`` (turns an abort cut),
    ``resumes`` (resumed requests), ``resumed_turns`` (turns answered whole after a resume), ``resumed_tokens``
    (tokens kept across seams, i.e. not regenerated), ``refused_turns`` and ``refused/<reason>``,
    ``seam_stop_cuts``/``seam_cut_tokens`` (answers a stop string across a seam ended, and the tokens after it)."""
    keys = ("interrupted_turns", "resumes", "resumed_turns", "resumed_tokens", "refused_turns", "seam_stop_cuts")
    return {**dict.fromkeys(keys, 0), "seam_cut_tokens": 0, **_COUNTS}


def _count_refusal(reason: str) -> None:
    _COUNTS["refused_turns"] += 1
    _COUNTS[f"refused/{reason}"] += 1
    if _COUNTS[f"refused/{reason}"] == 1:  # once per reason and process: a pause aborts many turns at once
        logger.warning("an aborted generation was not resumed (%s): it is answered 503 and regenerated whole", reason)


def install_resume() -> bool:
    """Wrap the :data:`SCOPE_TARGETS` methods once in this process; True when they already were. ``SetupError``
    naming a missing method (nothing is wrapped then)."""
    found = []
    for module, qualname in SCOPE_TARGETS:
        class_name, method = qualname.split(".")
        try:
            cls = getattr(importlib.import_module(module), class_name)
            found.append((cls, method, getattr(cls, method)))
        except (ImportError, AttributeError) as e:
            raise SetupError(f"partial rollouts: vLLM has no {module}.{qualname} (moved in this vLLM version?)") from e
    already = True
    for cls, method, current in found:
        if getattr(current, SENTINEL, None) is None:
            setattr(cls, method, make_scope_wrapper(current))
            already = False
    return already


def make_scope_wrapper(original: Any) -> Any:
    """``create_chat_completion``/``create_completion`` that marks a non-streaming request as resumable (and wraps
    its engine client's ``generate`` once, :func:`wrap_engine`)."""

    @functools.wraps(original)
    async def create(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(request, "stream", False):  # streamed pieces were already sent: nothing to resume
            return await original(self, request, *args, **kwargs)
        wrap_engine(type(self.engine_client))
        token = _SCOPE.set(types.SimpleNamespace(tokenizer=getattr(getattr(self, "renderer", None), "tokenizer", None)))
        try:
            return await original(self, request, *args, **kwargs)
        finally:
            _SCOPE.reset(token)

    setattr(create, SENTINEL, original)
    return create


def wrap_engine(engine_cls: Any) -> None:
    """Wrap ``engine_cls.generate`` once (idempotent): calls made under a resumable request resume after aborts."""
    current = engine_cls.generate
    if getattr(current, SENTINEL, None) is None:
        engine_cls.generate = make_generate_wrapper(current)


def make_generate_wrapper(original: Any) -> Any:
    """The engine's ``generate``: the original generator, or :func:`resuming` over it for a call made under a
    resumable request with final-only output (a non-streaming OpenAI answer)."""

    @functools.wraps(original)
    def generate(self: Any, prompt: Any, sampling_params: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
        scope = _SCOPE.get()
        kind = getattr(getattr(sampling_params, "output_kind", None), "name", None)
        if scope is None or args or kind != "FINAL_ONLY":
            return original(self, prompt, sampling_params, request_id, *args, **kwargs)
        return resuming(self, original, prompt, sampling_params, request_id, kwargs, scope.tokenizer)

    setattr(generate, SENTINEL, original)
    return generate


async def resuming(
    engine: Any, original: Any, prompt: Any, params: Any, request_id: str, kwargs: dict[str, Any], tokenizer: Any
) -> Any:
    """Async generator of one final ``RequestOutput``: the engine's, or the merge of the segments of a turn that
    was aborted and resumed (module docstring)."""
    tokenizer = getattr(getattr(engine, "output_processor", None), "tokenizer", None) or tokenizer
    # The request's own output, then each resumed segment that carried tokens (a resumed request aborted before its
    # first token -- a pause that aborts again, as verl's sleep after its abort does on GPUs -- leaves nothing).
    parts: list[Any] = []
    versions: list[int | None] = []  # each part's weight version
    attempts = 0  # resumed requests so far
    gen = original(engine, prompt, params, request_id, **kwargs)
    while True:
        last = None
        async for output in gen:
            last = output
        if last is None:  # no output at all: vLLM's serving answers its own error
            return
        version = SERVER.version()  # weights change only while the engine is paused: this segment's weights
        if not _aborted(last):
            yield last if not parts else _merged([*parts, last], [*versions, version], tokenizer, params)
            return
        if not parts:
            _COUNTS["interrupted_turns"] += 1
        kept = _ids([*parts, last])
        sampling = sampling_of(params, getattr(tokenizer, "eos_token_id", None))
        token_prompt = is_token_prompt(prompt)
        prompt_ids = list(prompt["prompt_token_ids"]) if token_prompt else []
        max_model_len = getattr(getattr(engine, "model_config", None), "max_model_len", None)
        reason = plan.refusal(
            sampling,
            kept,
            segments=sum(1 for p in [*parts, last] if _ids([p])),
            attempts=attempts,
            enabled=OPTIONS["enabled"],
            rejecting=SERVER.rejecting(),
            token_prompt=token_prompt,
            room=None if max_model_len is None else max_model_len - len(prompt_ids),
        )
        if reason is not None:
            _count_refusal(reason)
            yield last if not parts else _merged([*parts, last], [*versions, version], tokenizer, params, text=False)
            return
        if not parts or _ids([last]):
            parts.append(last)
            versions.append(version)
        attempts += 1
        _COUNTS["resumes"] += 1
        max_tokens, min_tokens = plan.resumed_limits(sampling, len(kept), len(prompt_ids), max_model_len)
        following = params.clone()
        following.max_tokens, following.min_tokens = max_tokens, min_tokens
        following.seed = plan.resumed_seed(params.seed, attempts)
        for name in ("prompt_logprobs", "prompt_logprob_token_ids", "prompt_logprob_start"):
            if hasattr(following, name):  # the prompt's log-probs are the first segment's
                setattr(following, name, None)
        resumed_prompt = {k: v for k, v in prompt.items() if k in ("type", "cache_salt")}
        resumed_prompt["prompt_token_ids"] = prompt_ids + kept
        logger.debug("resuming %s after %d tokens (attempt %d)", request_id, len(kept), attempts)
        gen = original(engine, resumed_prompt, following, f"{request_id}-ngv-resume-{attempts}", **kwargs)


def _aborted(output: Any) -> bool:
    # An abort can also end a request before it has a completion (verl handles empty outputs the same way).
    return was_aborted(output) or (bool(getattr(output, "finished", False)) and not output.outputs)


def _ids(parts: Sequence[Any]) -> list[int]:
    return [int(t) for p in parts for o in p.outputs[:1] for t in o.token_ids]


def is_token_prompt(prompt: Any) -> bool:
    """A plain token prompt (vLLM's ``TokensInput``): ids, nothing multimodal, no embeddings, no encoder."""
    return (
        isinstance(prompt, Mapping)
        and isinstance(prompt.get("prompt_token_ids"), list)
        and prompt.get("type", "token") == "token"
        and set(prompt) <= _TOKEN_PROMPT_KEYS
    )


def sampling_of(params: Any, eos_token_id: int | None) -> plan.Sampling:
    """:class:`~nemo_gym_adapter.tokens.resume.Sampling` of vLLM's ``SamplingParams`` (0.24 and 0.31)."""
    stops = set(getattr(params, "stop_token_ids", None) or ()) | set(getattr(params, "all_stop_token_ids", None) or ())
    if not getattr(params, "ignore_eos", False) and eos_token_id is not None:
        stops.add(int(eos_token_id))
    extra = getattr(params, "extra_args", None) or {}
    set_params = {
        "presence_penalty": bool(getattr(params, "presence_penalty", 0.0)),
        "frequency_penalty": bool(getattr(params, "frequency_penalty", 0.0)),
        "structured_outputs": getattr(params, "structured_outputs", None) is not None,
        "bad_words": bool(getattr(params, "bad_words", None)),
        "thinking_token_budget": getattr(params, "thinking_token_budget", None) is not None,
        "repetition_detection": getattr(params, "repetition_detection", None) is not None,
        "kv_transfer": bool(extra.get("kv_transfer_params")),
    }
    return plan.Sampling(
        n=int(getattr(params, "n", 1) or 1),
        max_tokens=getattr(params, "max_tokens", None),
        min_tokens=int(getattr(params, "min_tokens", 0) or 0),
        seed=getattr(params, "seed", None),
        stop_token_ids=frozenset(stops),
        output_dependent=tuple(name for name, is_set in set_params.items() if is_set),
    )


def replay(
    tokenizer: Any, prompt_ids: Sequence[int], params: Any, token_ids: Sequence[int], stop_terminated: bool
) -> tuple[str, int, str | None]:
    """The text vLLM's own detokenizer makes of ``token_ids`` after ``prompt_ids``, fed one token at a time as the
    engine feeds it (stop strings and ``min_tokens`` checked as it checks them): ``(text, n, stop)``, where ``n``
    ids are kept (fewer than given when a stop string ended the answer) and ``stop`` is that string.
    ``stop_terminated``: the last id is the stop token the engine finished on (left out of the text)."""
    from vllm.v1.engine.detokenizer import IncrementalDetokenizer

    request = types.SimpleNamespace(
        request_id="ngv-replay", prompt_token_ids=list(prompt_ids), prompt_embeds=None, sampling_params=params
    )
    detokenizer = IncrementalDetokenizer.from_new_request(tokenizer, request)
    last = len(token_ids) - 1
    for i, token in enumerate(token_ids):
        stop = detokenizer.update([int(token)], stop_terminated and i == last)
        if stop is not None:
            return detokenizer.get_next_output_text(True, False), i + 1, stop
    return detokenizer.get_next_output_text(True, False), len(token_ids), None


def _merged(parts: list[Any], versions: list[int | None], tokenizer: Any, params: Any, text: bool = True) -> Any:
    """One ``RequestOutput`` of a turn's segments (outputs of ``n == 1`` requests): the first one's prompt, every
    segment's ids and log-probs, the last one's finish; the text replayed over all ids (``text``; a refused turn,
    answered 503 anyway, keeps the segments' texts). A resumed (not refused) turn is counted and recorded in
    :data:`LEDGER`."""
    first, last = parts[0], parts[-1]
    outs = [p.outputs[0] for p in parts if p.outputs]
    template = last.outputs[0] if last.outputs else outs[-1] if outs else None
    if template is None:  # aborted before any completion, every time: nothing to merge
        return last
    with_tokens = [o for o in outs if len(o.token_ids)] or [template]
    ids = _ids(parts)
    logprobs = plan.concat([o.logprobs for o in with_tokens])
    finish, stop_reason = template.finish_reason, template.stop_reason
    if not text or tokenizer is None or not getattr(params, "detokenize", True):
        answer, keep, stop = "".join(o.text for o in outs), len(ids), None
    else:
        token_stop = finish == "stop" and not isinstance(stop_reason, str)
        answer, keep, stop = replay(tokenizer, first.prompt_token_ids, params, ids, token_stop)
    if stop is not None:  # a stop string the segments' own checks could not see (it spans a seam)
        if keep < len(ids) or finish != "stop":
            _COUNTS["seam_stop_cuts"] += 1
            _COUNTS["seam_cut_tokens"] += len(ids) - keep
        finish, stop_reason = "stop", stop
        ids = ids[:keep]
        logprobs = None if logprobs is None else logprobs[:keep]
    cumulative = [o.cumulative_logprob for o in with_tokens] if keep == len(_ids(parts)) else [None]
    experts = [getattr(o, "routed_experts", None) for o in with_tokens]
    completion = dataclasses.replace(
        template,
        text=answer,
        token_ids=ids,
        logprobs=logprobs,
        cumulative_logprob=None if None in cumulative else float(sum(cumulative)),  # type: ignore[arg-type]
        finish_reason=finish,
        stop_reason=stop_reason,
    )
    if any(e is not None for e in experts) and hasattr(completion, "routed_experts"):
        import numpy as np

        completion.routed_experts = (
            None if None in experts else np.concatenate([e for e in experts if e is not None], axis=0)[:keep]
        )
    merged = copy.copy(last)
    for name in ("request_id", "prompt", "prompt_token_ids", "prompt_logprobs", "prompt_token_id_logprobs"):
        if hasattr(first, name):
            setattr(merged, name, getattr(first, name))
    merged.num_cached_tokens = getattr(first, "num_cached_tokens", None)
    merged.outputs = [completion]
    if text and finish != "abort":
        segments = _segments(parts, versions, keep)
        _COUNTS["resumed_turns"] += 1
        _COUNTS["resumed_tokens"] += sum(s.tokens for s in segments[:-1])
        LEDGER.record(plan.turn_key(first.prompt_token_ids, ids), segments)
    return merged


def _segments(parts: Sequence[Any], versions: Sequence[int | None], keep: int) -> list[plan.Segment]:
    """Each part's length (the tail cut to ``keep`` ids in all) and weight version."""
    segments, left = [], keep
    for part, version in zip(parts, versions, strict=True):
        n = min(left, len(part.outputs[0].token_ids) if part.outputs else 0)
        segments.append(plan.Segment(n, version))
        left -= n
    return segments
