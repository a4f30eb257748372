"""Gym ``/run`` results → token trajectories (one per row). Pure: no I/O, inputs never modified.

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

Masked samples (never dropped; reward 0; ``masked_reason`` says why; see :class:`MaskReason`): Gym's
``mask_sample``; verifier errors (the environment could not score the rollout: a result with ``mask_sample`` and a
verifier ``failure_kind``, or a ``/run`` 5xx whose error chain starts in the environment's code, ``rollouts.gym_errors``),
unless ``verifier_errors`` says ``reward0`` for the environment and the tokens are there; optionally any ``failure_kind`` (off by default: Gym documents ``failure_kind`` as orthogonal to
``mask_sample`` and e.g. ``nemo_user_sim`` names a kind on valid zero-reward samples); client failures (timeout,
request failed, unroutable, server down, aborted: a vLLM abort Gym could not retry, see ``vllm.abort``); unparseable results; context overflow (a model call without ids plus
``incomplete_details``); model calls without ids; model calls with ids but not one finite log-prob per generated token
(``missing_log_probs``: never trained on invented values); no model call; non-contiguous history (``contiguity="mask"``;
``"truncate"`` keeps the contiguous prefix of calls and flags ``truncated``, ``"raise"`` raises
:class:`TokenAlignmentError`; ``"split"`` masks it here too, and :mod:`nemo_gym_adapter.rollouts.segments` makes it one
trajectory per prefix-consistent segment); prompt longer than ``prompt_length`` or leaving no response budget; no
sampled token.

A masked trajectory keeps its prompt when known and fitting (useful in logs) and has no response tokens; every
unmasked one has at least one sampled token (what :mod:`nemo_gym_adapter.rollouts.padding` relies on to make masked rows
identifiable from ``response_mask`` alone).

What the model calls are (which carry no ids, where the history stops being contiguous) is :mod:`model_calls`'s
answer; this module decides what the row becomes. No per-token Python loop: a row costs a few list-slice comparisons
and numpy conversions. The trajectories become verl tensors in :mod:`nemo_gym_adapter.rollouts.padding`.
"""

from __future__ import annotations

import array
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from nemo_gym_adapter.errors import AdapterConfigError, AdapterError, GymServerError, TokenAlignmentError
from nemo_gym_adapter.rollouts.forced import forced_tokens
from nemo_gym_adapter.rollouts.model_calls import calls_without_ids, contiguous_prefix
from nemo_gym_adapter.wire import GENERATION_ABORTED, GymRunResult, parse_run_result

ContiguityPolicy = Literal["mask", "truncate", "split", "raise"]
CONTIGUITY_POLICIES = ("mask", "truncate", "split", "raise")
VerifierErrorPolicy = Literal["mask", "reward0"]
DEFAULT_KEY = "_default"  # Gym's own spelling for "every other agent" (rollout_collection agent_map, num_repeats)
# Gym 0.7 failure kinds that mean "the verifier could not score this rollout" (nemo_gym/failure_kinds.py).
VERIFIER_FAILURE_KINDS = frozenset({"verifier_error", "judge_failed", "judge_unparseable"})


class MaskReason(str, enum.Enum):
    """Why a sample is masked (low cardinality: safe as a metric key)."""

    MASK_SAMPLE = "mask_sample"  # the environment said its reward is not a valid measurement
    FAILURE_KIND = "failure_kind"  # Gym named a failure_kind (only with mask_on_failure_kind=True)
    TIMEOUT = "timeout"  # the client gave up waiting for /run
    REQUEST_FAILED = "request_failed"  # connection error, HTTP error answer, undecodable body, client error
    UNROUTABLE = "unroutable"  # the row names no agent the running Gym serves
    SERVER_DOWN = "server_down"  # a server the row needs (agent, resources, model, vLLM replica) was dead
    ABORTED = "aborted"  # vLLM aborted a model call (weight sync) and Gym's retries of it failed too (vllm.abort)
    INVALID_RESULT = "invalid_result"  # /run answered with something that is not a valid result
    # The environment could not score the rollout: Gym says so (mask_sample with failure_kind verifier_error /
    # judge_failed / judge_unparseable, its own convention: nemo_gym/judge.py judge_failsafe), or /run answered 5xx
    # with Gym's error chain starting in the environment's code (rollouts.gym_errors: e.g. a resources server refusing
    # an unparseable action). Masked by default; TrajectoryConfig.verifier_errors can make them reward 0.
    VERIFIER_ERROR = "verifier_error"
    CONTEXT_OVERFLOW = "context_overflow"  # vLLM refused the prompt: a call without ids + incomplete_details
    MISSING_TOKEN_IDS = "missing_token_ids"  # a model call without ids (model server not in training mode?)
    MISSING_LOG_PROBS = "missing_log_probs"  # a model call with ids but not one finite log-prob per generated token
    NO_MODEL_CALL = "no_model_call"  # the trajectory contains no model call at all
    NON_CONTIGUOUS = "non_contiguous"  # a prompt does not extend the previous prompt + generation
    PROMPT_TOO_LONG = "prompt_too_long"  # prompt > prompt_length, or no response budget left under max_model_len
    EMPTY_GENERATION = "empty_generation"  # no sampled token to train on
    # A valid result lacks a reward component the trainer reads (a GDPO key, the group filter's metric): never
    # borrowed from a group-mate nor read as 0 (rollouts.reward_components).
    MISSING_REWARD_COMPONENT = "missing_reward_component"


# The rollout client's RolloutFailure.reason codes that are not plain request failures.
_CLIENT_REASONS = {
    "timeout": MaskReason.TIMEOUT,
    "unknown_agent": MaskReason.UNROUTABLE,
    "ambiguous_agent": MaskReason.UNROUTABLE,
    "server_down": MaskReason.SERVER_DOWN,
}


class FailureRecord(Protocol):
    """What the rollout client reports for a row without a result (``client.RolloutFailure``)."""

    @property
    def reason(self) -> str: ...  # "timeout", "connection", "http_<status>", "bad_json", "unknown_agent", ...

    @property
    def detail(self) -> str: ...


class OutcomeLike(Protocol):
    """One row's outcome from the rollout client (``client.RolloutOutcome``)."""

    @property
    def index(self) -> int: ...

    @property
    def latency_s(self) -> float: ...

    @property
    def result(self) -> Mapping[str, Any] | None: ...

    @property
    def failure(self) -> FailureRecord | None: ...


@dataclass(frozen=True)
class TrajectoryConfig:
    """``prompt_length``/``response_length``/``max_model_len`` as in ``actor_rollout_ref.rollout``."""

    prompt_length: int
    response_length: int
    max_model_len: int | None = None
    contiguity: ContiguityPolicy = "mask"
    mask_on_failure_kind: bool = False
    # {env: mask | reward0, "_default": ...}: what a verifier error becomes. mask (default): a masked sample, never a
    # fabricated score. reward0: the rollout is trained with reward 0 -- for environments whose verifier raises on
    # unparseable output, so that an untrained model can still be taught the format. Needs the rollout's tokens: a
    # Gym result carrying them; an HTTP 500 carries none, so it stays masked whatever the policy.
    verifier_errors: Mapping[str, VerifierErrorPolicy] = field(default_factory=dict)
    # Sampled tokens whose rollout log-prob is >= this are left out of the loss (rollouts.forced): tokens constrained
    # decoding forced. None: every sampled token is trained.
    forced_token_min_logprob: float | None = None
    key_prefix: str = "trajectory"

    def verifier_error_policy(self, env_name: str) -> VerifierErrorPolicy:
        """What a verifier error of ``env_name`` becomes: its own entry, else ``_default``'s, else ``mask``."""
        return self.verifier_errors.get(env_name, self.verifier_errors.get(DEFAULT_KEY, "mask"))

    def check_envs(self, agents: Sequence[str]) -> None:
        """Refuse ``verifier_errors`` keys that name no agent of the running Gym (a typo would silently keep
        ``mask``): ``AdapterConfigError`` naming the key and the agents there are."""
        unknown = sorted(set(self.verifier_errors) - {DEFAULT_KEY, *agents})
        if unknown:
            raise AdapterConfigError(
                f"{self.key_prefix}.verifier_errors: {unknown} name no agent of the running Gym; its agents are "
                f"{sorted(agents)} (or use {DEFAULT_KEY} for every environment)"
            )

    def __post_init__(self) -> None:
        bad = []
        if self.prompt_length < 1:
            bad.append(f"prompt_length={self.prompt_length!r} (must be >= 1)")
        if self.response_length < 1:
            bad.append(f"response_length={self.response_length!r} (must be >= 1)")
        if self.max_model_len is not None and self.max_model_len < 2:
            bad.append(f"max_model_len={self.max_model_len!r} (must be >= 2 or null)")
        if self.contiguity not in CONTIGUITY_POLICIES:
            bad.append(f"contiguity={self.contiguity!r} (must be one of {', '.join(CONTIGUITY_POLICIES)})")
        if self.forced_token_min_logprob is not None and not self.forced_token_min_logprob <= 0:
            bad.append(f"forced_token_min_logprob={self.forced_token_min_logprob!r} (a log-prob: must be <= 0 or null)")
        for env, policy in self.verifier_errors.items():
            if policy not in ("mask", "reward0"):
                bad.append(f"verifier_errors.{env}={policy!r} (must be 'mask' or 'reward0')")
        if bad:
            raise AdapterConfigError("; ".join(f"{self.key_prefix}.{b}" for b in bad))


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


@dataclass(frozen=True, eq=False)  # eq on numpy arrays is ambiguous; compare fields explicitly
class Trajectory:
    """One row's token trajectory (arrays are read-only).

    ``sampled_logprobs`` holds the logprobs of the sampled tokens only, concatenated in span order
    (``len == num_generated``). ``reward`` is what training sees (0 when masked); ``gym_reward`` what Gym reported;
    ``numeric`` every other numeric field of Gym's result (``wire.GymRunResult.numeric_fields``: the verifier's own
    fields, each reward component as ``reward_components/<name>``), masked or not; empty without a result.
    """

    env_name: str
    prompt_ids: np.ndarray = field(default_factory=lambda: _NO_IDS)
    response_ids: np.ndarray = field(default_factory=lambda: _NO_IDS)
    sampled_spans: tuple[tuple[int, int], ...] = ()
    sampled_logprobs: np.ndarray = field(default_factory=lambda: _NO_LOGPROBS)
    reward: float = 0.0
    gym_reward: float | None = None
    num_turns: int = 0
    masked_reason: MaskReason | None = None
    detail: str = ""
    truncated: bool = False
    contiguity_failure: bool = False
    verifier_error: bool = False  # the verifier could not score it (trained with reward 0 under policy reward0)
    failure_kind: str | None = None
    latency_s: float | None = None
    row_index: int | None = None
    segment: int = 0  # contiguity="split": this trajectory's place among its rollout's segments (rollouts.segments)
    segments: int = 1  # ... and how many the rollout has (1: its calls form one history)
    numeric: Mapping[str, float] = field(default_factory=dict)  # the result's numeric fields (numeric_fields)
    forced: np.ndarray | None = None  # over the sampled tokens: left out of the loss (rollouts.forced); None: none

    @property
    def num_forced(self) -> int:
        return 0 if self.forced is None else int(self.forced.sum())

    @property
    def masked(self) -> bool:
        return self.masked_reason is not None

    @property
    def num_generated(self) -> int:
        return sum(end - start for start, end in self.sampled_spans)

    def response_mask(self) -> np.ndarray:
        """Dense 0/1 mask over ``response_ids`` (built per span, for inspection and tests)."""
        mask = np.zeros(len(self.response_ids), dtype=np.int64)
        for start, end in self.sampled_spans:
            mask[start:end] = 1
        return mask

    def rollout_log_probs(self) -> np.ndarray:
        """Dense logprobs over ``response_ids``: generation logprobs where sampled, 0 elsewhere."""
        dense = np.zeros(len(self.response_ids), dtype=np.float32)
        dense[self.response_mask().astype(bool)] = self.sampled_logprobs
        return dense


def _where(row_index: int | None) -> str:
    return f"row {row_index}" if row_index is not None else "row"


def failed_trajectory(
    failure: FailureRecord, *, env_name: str, row_index: int | None = None, latency_s: float | None = None
) -> Trajectory:
    """The masked trajectory of a row the rollout client could not get a result for."""
    reason = _CLIENT_REASONS.get(failure.reason, MaskReason.REQUEST_FAILED)
    if reason is MaskReason.REQUEST_FAILED and GENERATION_ABORTED in failure.detail:
        reason = MaskReason.ABORTED
    elif reason is MaskReason.REQUEST_FAILED and getattr(failure, "origin", None) == "environment":
        reason = MaskReason.VERIFIER_ERROR  # the environment's own code raised (no tokens came back: stays masked)
    return Trajectory(
        env_name=env_name,
        masked_reason=reason,
        detail=f"{failure.reason}: {failure.detail}",
        failure_kind=f"client:{failure.reason}",
        latency_s=latency_s,
        row_index=row_index,
    )


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

    def masked(reason: MaskReason, detail: str, **extra: Any) -> Trajectory:
        return Trajectory(prompt_ids=kept_prompt, masked_reason=reason, detail=detail, **{**common, **extra})

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

    last = kept[-1]
    response_parts = (
        [last.prompt_token_ids[base:], last.generation_token_ids] if len(kept) > 1 else [last.generation_token_ids]
    )
    return Trajectory(
        prompt_ids=kept_prompt,  # = first_prompt here: it fits prompt_length (checked above)
        response_ids=_frozen_concat(response_parts, np.int64, end),
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


def trajectory_from_outcome(outcome: OutcomeLike, *, env_name: str, config: TrajectoryConfig) -> Trajectory:
    """The rollout client's outcome for one row → its trajectory; the ``/run`` JSON is parsed here, once.

    A row that was never sent (``attempts == 0``: unroutable, not serialisable) has no latency, not 0 s.
    """
    latency = outcome.latency_s if getattr(outcome, "attempts", 1) else None
    if outcome.failure is not None:
        return failed_trajectory(outcome.failure, env_name=env_name, row_index=outcome.index, latency_s=latency)
    if outcome.result is None:
        raise AdapterError(f"row {outcome.index}: rollout outcome has neither a result nor a failure")
    where = f"row {outcome.index}: /run result"
    try:
        result = parse_run_result(outcome.result, where=where)
    except GymServerError as e:
        detail = str(e)
    else:
        try:
            return build_trajectory(
                result, env_name=env_name, config=config, row_index=outcome.index, latency_s=latency
            )
        except OverflowError:  # pydantic's StrictInt accepts any Python int, int64 does not
            detail = f"{where}: {result.first_id_beyond_int64()} does not fit in int64"
    return Trajectory(
        env_name=env_name,
        masked_reason=MaskReason.INVALID_RESULT,
        detail=detail,
        failure_kind="client:invalid_result",
        latency_s=latency,
        row_index=outcome.index,
    )
