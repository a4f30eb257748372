"""One parsed Gym ``/run`` result → its token trajectory (:func:`build_trajectory`): the rules. Pure: no I/O, inputs
never modified.

One row (:func:`build_trajectory`): the model calls of ``response.output`` (items carrying token ids) must be
*contiguous*: the prompt of call k+1 starts with prompt_k + generation_k exactly. Then

* prompt ids = call 0's prompt;
* response ids = everything after it up to the end of the last generation (generated tokens plus the
  tool/env/template tokens between calls), i.e. ``(prompt_last + generation_last)[len(prompt_0):]``;
* sampled spans ``[start, end)`` (response coordinates) = where the model sampled; response mask is 1 exactly
  there and rollout logprobs are the generation logprobs there, 0 elsewhere;
* response budget = ``max(0, min(response_length, max_model_len - len(prompt)))``; a longer response is cut at
  the end of the last generation that fits (a turn boundary), or mid-generation when not even the first fits;
  the trajectory is flagged ``truncated`` and keeps its reward.

Masked samples (never dropped; reward 0; ``masked_reason`` says why; see
:class:`~nemo_gym_adapter.rollouts.trajectory.MaskReason`): Gym's ``mask_sample``; verifier errors (the environment
could not score the rollout: a result with ``mask_sample`` and a verifier ``failure_kind``), unless
``verifier_errors`` says ``reward0`` for the environment; optionally any ``failure_kind`` (off by default: Gym
documents ``failure_kind`` as orthogonal to ``mask_sample`` and e.g. ``nemo_user_sim`` names a kind on valid
zero-reward samples); context overflow (a model call without ids plus ``incomplete_details``); model calls without
ids; model calls with ids but not one finite log-prob per generated token (``missing_log_probs``: never trained on
invented values); no model call; non-contiguous history (``contiguity="mask"``; ``"truncate"`` keeps the contiguous
prefix of calls and flags ``truncated``, ``"raise"`` raises :class:`TokenAlignmentError`; ``"split"`` masks it here
too, and :mod:`nemo_gym_adapter.rollouts.segments` makes it one trajectory per prefix-consistent segment); prompt
longer than ``prompt_length`` or leaving no response budget; no sampled token; otherwise trainable tokens whose result
lacks a reward component the trainer reads (``required_components``: ``missing_reward_component``, checked last so
that a token problem keeps its own reason). Rows without a usable result (client
failures -- timeout, request failed, unroutable, server down, aborted, an environment's own 5xx -- and unparseable
results) are masked by :mod:`nemo_gym_adapter.rollouts.outcome`.

What the model calls are (which carry no ids, where the history stops being contiguous) is :mod:`model_calls`'s
answer; this module decides what the row becomes. No per-token Python loop: a row costs a few list-slice comparisons
and numpy conversions. The trajectories become verl tensors in :mod:`nemo_gym_adapter.rollouts.padding`.
"""

from __future__ import annotations

import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from nemo_gym_adapter.errors import TokenAlignmentError
from nemo_gym_adapter.rollouts.forced import forced_tokens
from nemo_gym_adapter.rollouts.model_calls import calls_without_ids, contiguous_prefix
from nemo_gym_adapter.rollouts.reward_components import missing as missing_components
from nemo_gym_adapter.rollouts.trajectory import MaskReason, Trajectory, TrajectoryConfig
from nemo_gym_adapter.wire.payloads import GymRunResult, reward_components

# Gym 0.7 failure kinds that mean "the verifier could not score this rollout" (nemo_gym/failure_kinds.py).
VERIFIER_FAILURE_KINDS = frozenset({"verifier_error", "judge_failed", "judge_unparseable"})


# array.array type codes of the dtypes built from Gym's JSON lists: it converts a list of Python numbers about a
# third faster than np.array (no type discovery), and the array then shares its buffer (benchmarks/bench_postprocess.py).
_ARRAY_CODES = {np.dtype(np.int64): "q", np.dtype(np.float32): "f"}


def _frozen(values: Sequence[Any] | np.ndarray, dtype: Any) -> np.ndarray:
    code = _ARRAY_CODES.get(np.dtype(dtype))
    try:
        if code is None or not isinstance(values, list):
            raise TypeError
        arr = np.frombuffer(array.array(code, values), dtype=dtype)
    except (TypeError, OverflowError):  # not a list of plain numbers, or out of the C type's range: numpy decides
        arr = np.array(values, dtype=dtype)
    arr.flags.writeable = False
    return arr


def _frozen_concat(parts: Sequence[Sequence[Any]], dtype: Any, n: int) -> np.ndarray:
    """The first ``n`` values of the concatenated ``parts``, read-only; each part converted on its own (no joined
    Python list: building one costs as much as converting it)."""
    if len(parts) == 1:
        return _frozen(parts[0][:n] if len(parts[0]) > n else parts[0], dtype)
    arr = np.concatenate([_frozen(p, dtype) for p in parts])[:n]
    arr.flags.writeable = False
    return arr


_NO_IDS = _frozen([], np.int64)
_NO_LOGPROBS = _frozen([], np.float32)


def outside_vocab(ids: np.ndarray, vocab_size: int | None) -> str | None:
    """The first id of ``ids`` below 0 or (with ``vocab_size``) at or above it, as ``"<id> at position <k>"``; None
    when all fit. Two numpy reductions per array; the position only on the error path."""
    if ids.size == 0:
        return None
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and (vocab_size is None or high < vocab_size):
        return None
    bad = (ids < 0) if vocab_size is None else (ids < 0) | (ids >= vocab_size)
    k = int(np.flatnonzero(bad)[0])
    return f"{int(ids[k])} at position {k}"


def _where(row_index: int | None) -> str:
    return f"row {row_index}" if row_index is not None else "row"


def build_trajectory(
    result: GymRunResult,
    *,
    env_name: str,
    config: TrajectoryConfig,
    row_index: int | None = None,
    latency_s: float | None = None,
) -> Trajectory:
    """One parsed ``/run`` result → its :class:`Trajectory` (masked when unusable; see the module docstring).

    Raises:
        TokenAlignmentError: only with ``config.contiguity == "raise"`` and a non-contiguous history; the message
            names the row, the JSON path of the offending prompt, the first differing position, expected vs actual.
    """
    where = _where(row_index)
    output = result.response.output
    calls = result.model_calls()
    common: dict[str, Any] = dict(
        env_name=env_name,
        gym_reward=result.reward,
        failure_kind=result.failure_kind,
        latency_s=latency_s,
        row_index=row_index,
        num_turns=len(calls),
        numeric=result.numeric_fields(),
    )
    first_prompt = calls[0][1].prompt_token_ids if calls else []
    # A masked row keeps its real prompt when it fits (useful in logs), else it gets one pad token at padding.
    kept_prompt = _frozen(first_prompt, np.int64) if 0 < len(first_prompt) <= config.prompt_length else _NO_IDS
    # Ids outside the vocabulary never reach the batch, not even as a masked row's prompt: the actor's embedding lookup
    # would fail on them (on GPU, a device-side assert that ends the run).
    bad_prompt = outside_vocab(kept_prompt, config.vocab_size)
    if bad_prompt is not None:
        kept_prompt = _NO_IDS

    def masked(reason: MaskReason, detail: str, **extra: Any) -> Trajectory:
        return Trajectory(prompt_ids=kept_prompt, masked_reason=reason, detail=detail, **{**common, **extra})

    if bad_prompt is not None:
        return masked(
            MaskReason.INVALID_RESULT,
            f"{where}: response.output[{calls[0][0]}].prompt_token_ids holds {bad_prompt}, outside the model's "
            f"vocabulary [0, {config.vocab_size})",
        )

    gym_says = ": ".join(x for x in (result.failure_kind, result.failure_reason) if x)
    verifier_error = result.mask_sample and result.failure_kind in VERIFIER_FAILURE_KINDS
    reward = float(result.reward)
    if verifier_error and config.verifier_error_policy(env_name) == "reward0":
        reward = 0.0  # trained as a failure to score, below; every token check still applies
    elif verifier_error:
        return masked(MaskReason.VERIFIER_ERROR, f"{where}: the verifier could not score it ({gym_says})")
    elif result.mask_sample:
        return masked(MaskReason.MASK_SAMPLE, f"{where}: Gym set mask_sample" + (f" ({gym_says})" if gym_says else ""))
    if config.mask_on_failure_kind and result.failure_kind:
        return masked(MaskReason.FAILURE_KIND, f"{where}: Gym named failure_kind ({gym_says})")
    missing = calls_without_ids(output)
    if missing:
        incomplete = result.response.incomplete_details
        if incomplete is not None and missing[-1] == max(i for i, it in enumerate(output) if it.is_model_output):
            return masked(
                MaskReason.CONTEXT_OVERFLOW,
                f"{where}: last model call (response.output[{missing[-1]}]) has no token ids and "
                f"incomplete_details.reason={incomplete.reason!r}",
            )
        return masked(
            MaskReason.MISSING_TOKEN_IDS,
            f"{where}: model call(s) ending at response.output{missing} carry no token ids (is the Gym model "
            "server configured for training, return_token_id_information: true?)",
        )
    if not calls:
        return masked(MaskReason.NO_MODEL_CALL, f"{where}: response.output has no model call ({len(output)} items)")
    no_log_probs = result.calls_without_log_probs()
    if no_log_probs:
        return masked(
            MaskReason.MISSING_LOG_PROBS,
            f"{where}: model call(s) at response.output{no_log_probs} carry token ids but not one log-prob per "
            "generated token (a request with top_logprobs: null, or a server that does not return them); not trained "
            "on invented values",
        )
    if len(first_prompt) > config.prompt_length:
        return masked(
            MaskReason.PROMPT_TOO_LONG,
            f"{where}: prompt has {len(first_prompt)} tokens > prompt_length {config.prompt_length}",
        )
    budget = config.response_length
    if config.max_model_len is not None:
        budget = max(0, min(budget, config.max_model_len - len(first_prompt)))
    if budget == 0:
        return masked(
            MaskReason.PROMPT_TOO_LONG,
            f"{where}: prompt has {len(first_prompt)} tokens, leaving no room under max_model_len "
            f"{config.max_model_len}",
        )

    n_ok, break_detail = contiguous_prefix(calls, where)
    truncated = n_ok < len(calls)
    if truncated:
        if config.contiguity == "raise":
            raise TokenAlignmentError(break_detail)
        if config.contiguity in ("mask", "split"):  # split: rollouts.segments splits what is masked here
            return masked(MaskReason.NON_CONTIGUOUS, break_detail, contiguity_failure=True)
    kept = [item for _, item in calls[:n_ok]]

    # Spans of the sampled tokens, in response coordinates (response starts right after prompt_0).
    base = len(first_prompt)
    spans = [
        (len(c.prompt_token_ids) - base, len(c.prompt_token_ids) - base + len(c.generation_token_ids)) for c in kept
    ]
    end = spans[-1][1]
    if end > budget:
        fit = [k for k, (_, e) in enumerate(spans) if e <= budget]
        if fit:  # cut at the end of the last generation that fits: a turn boundary
            spans, end = spans[: fit[-1] + 1], spans[fit[-1]][1]
        else:  # not even the first generation fits: cut inside it
            spans, end = [(0, budget)], budget
        kept = kept[: len(spans)]
        truncated = True
    n_sampled = sum(e - s for s, e in spans)
    if n_sampled == 0:
        return masked(MaskReason.EMPTY_GENERATION, f"{where}: the model calls sampled no tokens")
    sampled_logprobs = _frozen_concat([c.generation_log_probs for c in kept], np.float32, n_sampled)
    if not np.isfinite(sampled_logprobs).all():
        return masked(MaskReason.MISSING_LOG_PROBS, f"{where}: a generation log-prob is not finite (NaN or inf)")

    absent = missing_components(common["numeric"], config.required_components)
    if absent:
        carried = sorted(reward_components(common["numeric"]))
        return masked(
            MaskReason.MISSING_REWARD_COMPONENT,
            f"{where}: the result has no reward component {absent} that the trainer reads (it carries {carried}); "
            "never borrowed from another sample nor read as 0",
        )

    last = kept[-1]
    response_parts = (
        [last.prompt_token_ids[base:], last.generation_token_ids] if len(kept) > 1 else [last.generation_token_ids]
    )
    response_ids = _frozen_concat(response_parts, np.int64, end)
    bad_response = outside_vocab(response_ids, config.vocab_size)
    if bad_response is not None:
        return masked(
            MaskReason.INVALID_RESULT,
            f"{where}: the response's token ids (tool and template tokens between calls, or generated ones) hold "
            f"{bad_response}, outside the model's vocabulary [0, {config.vocab_size})",
        )
    return Trajectory(
        prompt_ids=kept_prompt,  # = first_prompt here: it fits prompt_length (checked above)
        response_ids=response_ids,
        sampled_spans=tuple(spans),
        sampled_logprobs=sampled_logprobs,
        forced=forced_tokens(sampled_logprobs, config.forced_token_min_logprob),
        reward=reward,
        verifier_error=verifier_error,
        truncated=truncated,
        contiguity_failure=n_ok < len(calls),
        detail=break_detail,
        **{**common, "num_turns": len(kept)},
    )
