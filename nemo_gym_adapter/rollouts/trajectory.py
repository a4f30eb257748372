"""A row's token trajectory and why a sample is masked: the types every later stage reads (padding, samples,
metrics, groups, dump), and :class:`TrajectoryConfig`, the lengths and policies a trajectory is built under.

A trajectory is one rollout as training sees it: prompt ids (call 0's prompt), response ids (everything after it up to
the end of the last generation: generated tokens plus the tool/env/template tokens between calls), the sampled spans
``[start, end)`` where the model sampled (response mask 1 there, rollout log-probs there, 0 elsewhere), the reward and
Gym's own result fields. A masked one (``masked_reason`` set, reward 0) is never dropped: it keeps its prompt when
known and fitting and has no response tokens; every unmasked one has at least one sampled token (what
:mod:`nemo_gym_adapter.rollouts.padding` relies on to make masked rows identifiable from ``response_mask`` alone).

Built from a parsed ``/run`` result by :mod:`nemo_gym_adapter.rollouts.builder` (the rules), from the rollout client's
outcome by :mod:`nemo_gym_adapter.rollouts.outcome`, one per prefix-consistent segment by
:mod:`nemo_gym_adapter.rollouts.segments`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from nemo_gym_adapter.errors import AdapterConfigError

ContiguityPolicy = Literal["mask", "truncate", "split", "raise"]
CONTIGUITY_POLICIES = ("mask", "truncate", "split", "raise")
# What a trajectory's trained tokens are: the model's own (generated: the ids it generated, in the contexts it saw) or,
# to measure what trainers without exact token ids do, the re-templated conversation (rollouts.retemplate).
TrainTokens = Literal["generated", "measure_retemplated"]
TRAIN_TOKENS = ("generated", "measure_retemplated")
VerifierErrorPolicy = Literal["mask", "reward0"]
DEFAULT_KEY = "_default"  # Gym's own spelling for "every other agent" (rollout_collection agent_map, num_repeats)


def _empty(dtype: type) -> np.ndarray:
    arr: np.ndarray = np.zeros(0, dtype=dtype)
    arr.flags.writeable = False
    return arr


_NO_IDS = _empty(np.int64)
_NO_LOGPROBS = _empty(np.float32)


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
    # Reward components the trainer reads (GDPO's keys, a component used as the group filter's metric): a result
    # without one is masked missing_reward_component, never given a group-mate's value or 0 (rollouts.reward_components).
    required_components: tuple[str, ...] = ()
    # The model's vocabulary (its embedding rows, the HF config's vocab_size): a token id outside [0, vocab_size) in a
    # Gym result masks the row invalid_result (rollouts.builder). None: only negative ids are refused.
    vocab_size: int | None = None
    key_prefix: str = "trajectory"
    # "measure_retemplated" (a measurement mode, never a default): every rollout trained as its re-templated
    # conversation (rollouts.retemplate), rendered by ``renderer`` (the trainer's tokenizer: retemplate.ChatRenderer).
    train_tokens: TrainTokens = "generated"
    renderer: Any = field(default=None, compare=False, repr=False)

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
        if self.train_tokens not in TRAIN_TOKENS:
            bad.append(f"train_tokens={self.train_tokens!r} (must be one of {', '.join(TRAIN_TOKENS)})")
        elif self.train_tokens == "measure_retemplated" and self.renderer is None:
            bad.append("train_tokens='measure_retemplated' needs the trainer's tokenizer to render with (renderer)")
        if self.vocab_size is not None and self.vocab_size < 1:
            bad.append(f"vocab_size={self.vocab_size!r} (must be >= 1 or null)")
        if self.forced_token_min_logprob is not None and not self.forced_token_min_logprob <= 0:
            bad.append(f"forced_token_min_logprob={self.forced_token_min_logprob!r} (a log-prob: must be <= 0 or null)")
        for env, policy in self.verifier_errors.items():
            if policy not in ("mask", "reward0"):
                bad.append(f"verifier_errors.{env}={policy!r} (must be 'mask' or 'reward0')")
        if bad:
            raise AdapterConfigError("; ".join(f"{self.key_prefix}.{b}" for b in bad))


@dataclass(frozen=True, eq=False)  # eq on numpy arrays is ambiguous; compare fields explicitly
class Trajectory:
    """One row's token trajectory (arrays are read-only).

    ``sampled_logprobs`` holds the logprobs of the sampled tokens only, concatenated in span order
    (``len == num_generated``). ``reward`` is what training sees (0 when masked); ``gym_reward`` what Gym reported;
    ``numeric`` every other numeric field of Gym's result (``wire.payloads.GymRunResult.numeric_fields``: the verifier's own
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
    # Over the sampled (trained) tokens: a token the model never generated (train_tokens=measure_retemplated, where the
    # template re-rendered what it wrote: rollouts.retemplate); None: every trained token was generated.
    never_generated: np.ndarray | None = None
    # The rollout's model call each sampled span is (0-based); empty: span k is call k (a segment of a split rollout,
    # or a re-templated one whose later spans did not fit, says which calls its spans are).
    call_indices: tuple[int, ...] = ()

    @property
    def num_forced(self) -> int:
        return 0 if self.forced is None else int(self.forced.sum())

    @property
    def masked(self) -> bool:
        return self.masked_reason is not None

    @property
    def num_generated(self) -> int:
        return sum(end - start for start, end in self.sampled_spans)

    @property
    def num_never_generated(self) -> int:
        return 0 if self.never_generated is None else int(self.never_generated.sum())

    def token_turns(self) -> np.ndarray:
        """Dense over ``response_ids`` (int64): k + 1 on the sampled tokens of model call k, -(k + 1) on those of them
        the model never generated (:attr:`never_generated`), 0 elsewhere. What splits the rollout-vs-trainer log-prob
        gap into first and later turns (``onpolicy/first_turn/*``, ``onpolicy/later_turns/*``)."""
        turns = np.zeros(len(self.response_ids), dtype=np.int64)
        calls = self.call_indices or tuple(range(len(self.sampled_spans)))
        for (start, end), call in zip(self.sampled_spans, calls, strict=True):
            turns[start:end] = call + 1
        if self.never_generated is not None and self.never_generated.any():
            positions = np.concatenate([np.arange(s, e) for s, e in self.sampled_spans])
            turns[positions[self.never_generated]] *= -1
        return turns

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
