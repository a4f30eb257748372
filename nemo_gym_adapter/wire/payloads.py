"""Typed models of the NeMo Gym 0.7 payloads this adapter reads: dataset rows and ``/run`` results.

Parse once at the boundary (:func:`parse_run_result`, :func:`parse_dataset_row`), then use attributes. Every
model allows extra fields (``extra="allow"``): Gym rows carry free-form verifier fields, and results carry many
Responses-API fields we never read; none of them may be lost or rejected here. Models are frozen so code holding
a parsed payload cannot change it behind the caller's back (the older recipe mutated Gym results in place).

Shapes modelled (read from Gym 0.7.0: ``nemo_gym/openai_utils.py``, ``nemo_gym/base_resources_server.py``,
``nemo_gym/responses_converter.py``, ``responses_api_agents/simple_agent/app.py``):

* dataset row: ``responses_create_params`` (required; ``input`` a string or a list of items) + optional
  ``agent_ref`` (``{"name": ...}`` or a string) or ``task_source`` (0.7 collate output) + verifier fields;
* ``/run`` result: ``BaseVerifyResponse`` = the request + ``response`` + ``reward`` + ``mask_sample`` +
  ``failure_kind`` + ``failure_reason``. ``response.output`` is the whole trajectory; the *last* output item of
  each model call carries ``prompt_token_ids``/``generation_token_ids``/``generation_log_probs`` (all three or
  none, Gym's ``_validate_atomic_token_metadata``); tool outputs carry none. A vLLM context error becomes one
  empty assistant message *without* ids and ``incomplete_details.reason == "max_output_tokens"``.

No ``nemo_gym`` import: Gym runs in its own venv and is reached over HTTP only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    StrictInt,
    ValidationError,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from nemo_gym_adapter.errors import GymServerError
from nemo_gym_adapter.wire.tool_calls import call_fields

# How the patched engines' abort guards begin the message of a 503 for a generation the engine aborted (a weight
# sync): "ngv: generation aborted by the vLLM engine" (vllm.abort), "... by the SGLang engine" (sglang.answer). Gym
# relays it in a failed /run's detail, where rollouts.trajectory finds it (a masked `aborted` row).
GENERATION_ABORTED = "ngv: generation aborted"

# The fields of Gym 0.7.0's ``NeMoGymResponseCreateParamsNonStreaming``. Gym validates ``/run`` bodies with
# ``extra="forbid"``, so a typo here (``tool`` for ``tools``) would only surface as an HTTP 422 mid-training;
# the dataset loader checks against this list up front. Pinned to Gym 0.7.0.
RESPONSES_CREATE_PARAMS_FIELDS: frozenset[str] = frozenset(
    {
        "background",
        "include",
        "input",
        "instructions",
        "max_output_tokens",
        "max_tool_calls",
        "metadata",
        "model",
        "parallel_tool_calls",
        "previous_response_id",
        "prompt",
        "reasoning",
        "service_tier",
        "store",
        "context_management",
        "conversation",
        "moderation",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
        "stream_options",
        "temperature",
        "text",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "truncation",
        "user",
        "stream",
    }
)

# Gym's framework-owned top-level row keys (``nemo_gym/task_data.py`` RESERVED_ROW_KEYS); all others are verifier
# fields and pass through untouched.
RESERVED_ROW_KEYS: frozenset[str] = frozenset(
    {"responses_create_params", "agent_ref", "task_source", "_ng_task_index", "_ng_rollout_index"}
)

TOKEN_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")

# Output item types the *model* produces (as opposed to tool outputs or environment/user messages). Used to notice
# a model call that came back without token ids (context overflow, or a model server not configured for training).
_MODEL_ITEM_TYPES = frozenset({"function_call", "reasoning", "custom_tool_call"})


# Element types the fast paths of OutputItem accept as is (exact types: bool is not an int here, as in StrictInt).
_ONLY_INT = frozenset({int})
_ONLY_FLOAT = frozenset({float})


class WireModel(BaseModel):
    """Base of every Gym payload model: unknown fields kept, instances immutable."""

    model_config = ConfigDict(extra="allow", frozen=True)


class AgentRef(WireModel):
    """``agent_ref`` in its dict form (``{"name": ..., "type": ...}``); extra keys such as ``type`` are kept."""

    name: str


class ResponsesCreateParams(WireModel):
    """``responses_create_params``: only ``input`` is required; every other field passes through to Gym."""

    input: str | list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None


class DatasetRow(WireModel):
    """One Gym JSONL row. Verifier fields (``expected_answer``, ``question``, ...) are kept as extras."""

    responses_create_params: ResponsesCreateParams
    agent_ref: AgentRef | str | None = None
    task_source: str | None = None


class OutputItem(WireModel):
    """One item of ``response.output``. Model-call items may carry the token-id fields: both id fields or none; their
    log-probs may be missing or of another length (a trainable turn without log-probs: masked ``missing_log_probs``
    by the trajectory, not an invalid result)."""

    type: str | None = None
    role: str | None = None
    prompt_token_ids: list[StrictInt] | None = None
    generation_token_ids: list[StrictInt] | None = None
    generation_log_probs: list[float] | None = None

    @field_validator("prompt_token_ids", "generation_token_ids", mode="wrap")
    @classmethod
    def _ids_fast(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # The hot path of every result (~10k ids per 4k-token rollout: each call repeats the history). One C-level
        # pass over the element types accepts exactly what list[StrictInt] accepts (int, not bool, float or str)
        # at ~0.7x pydantic's per-element cost and without its copy; anything else goes to pydantic's own
        # validation, so the errors (JSON path of the first bad element, its value) stay pydantic's.
        if type(value) is list and _ONLY_INT.issuperset(map(type, value)):
            return value
        return handler(value)

    @field_validator("generation_log_probs", mode="wrap")
    @classmethod
    def _logprobs_fast(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        # Same for list[float]: a list of floats only is returned as is; ints, bools, strings, ... (converted or
        # rejected) are pydantic's.
        if type(value) is list and _ONLY_FLOAT.issuperset(map(type, value)):
            return value
        return handler(value)

    @model_validator(mode="after")
    def _atomic_token_fields(self) -> OutputItem:
        present = [f for f in TOKEN_FIELDS if getattr(self, f) is not None]
        ids_present = [f for f in TOKEN_FIELDS[:2] if getattr(self, f) is not None]
        if present and len(ids_present) != 2:
            missing = sorted(set(TOKEN_FIELDS[:2]) - set(ids_present))
            raise ValueError(f"token fields must come together: has {present}, missing {missing}")
        return self

    @property
    def log_probs_complete(self) -> bool:
        """One log-prob per generated token (the length check; the trajectory checks that they are finite)."""
        ids, logprobs = self.generation_token_ids, self.generation_log_probs
        return ids is not None and logprobs is not None and len(ids) == len(logprobs)

    @property
    def has_token_ids(self) -> bool:
        return self.prompt_token_ids is not None

    @property
    def is_model_output(self) -> bool:
        """Produced by the model (assistant message, tool call, reasoning), with or without token ids."""
        return (self.type == "message" and self.role == "assistant") or self.type in _MODEL_ITEM_TYPES


class ModelCall(NamedTuple):
    """The token ids of one model call (from the output item that carries them; never None here)."""

    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]


class IncompleteDetails(WireModel):
    reason: str | None = None


class GymResponse(WireModel):
    """``response`` of a ``/run`` result: the whole trajectory in ``output``."""

    output: list[OutputItem]
    incomplete_details: IncompleteDetails | None = None
    status: str | None = None


class GymRunResult(WireModel):
    """A ``/run`` result (Gym's ``BaseVerifyResponse`` or an environment's subclass of it)."""

    reward: float
    response: GymResponse
    mask_sample: bool = False
    failure_kind: str | None = None
    failure_reason: str | None = None

    @field_validator("reward")
    @classmethod
    def _finite_reward(cls, value: float) -> float:
        # A NaN/inf reward would silently poison every advantage in its GRPO group.
        if not math.isfinite(value):
            raise ValueError(f"reward must be finite, got {value!r}")
        return value

    def model_calls(self) -> list[tuple[int, ModelCall]]:
        """``(index in response.output, its ids)`` of every item that carries token ids, in trajectory order."""
        return [
            (i, ModelCall(item.prompt_token_ids, item.generation_token_ids, item.generation_log_probs or []))
            for i, item in enumerate(self.response.output)
            if item.prompt_token_ids is not None and item.generation_token_ids is not None
        ]

    def calls_without_log_probs(self) -> list[int]:
        """``response.output`` indices of model calls whose ids came back without (all their) log-probs."""
        return [
            i
            for i, item in enumerate(self.response.output)
            if item.prompt_token_ids is not None and not item.log_probs_complete
        ]

    def first_id_beyond_int64(self) -> str:
        """JSON path and value of the first token id int64 cannot hold (StrictInt accepts any Python int; error
        path only, so a Python loop is fine)."""
        for i, item in enumerate(self.response.output):
            for name in ("prompt_token_ids", "generation_token_ids"):
                for j, v in enumerate(getattr(item, name) or ()):
                    if not -(2**63) <= v < 2**63:
                        return f"response.output[{i}].{name}[{j}] = {v}"
        return "a token id"

    def numeric_fields(self) -> dict[str, float]:
        """Every numeric field of the result for metrics and dumps (item 5 of issue 20; NeMo RL logs them all).

        Top-level ints, floats and bools (as 0/1) other than ``reward`` and ``mask_sample`` (reported on their own)
        and Gym's ``_``-prefixed ids; each entry of Gym 0.7's multi-reward ``reward_components`` (``nemo_gym.
        base_resources_server.BaseMultiRewardVerifyResponse``: ``{name: value}``, ``reward`` their sum) as
        ``reward_components/<name>``. Non-finite values and anything else (strings, lists, nested objects) are left
        out: a verifier's free-form field never fails a row."""
        out: dict[str, float] = {}
        for key, value in (self.model_extra or {}).items():
            if key.startswith("_") or key in _NOT_RESULT_FIELDS:
                continue
            if key == REWARD_COMPONENTS and isinstance(value, Mapping):
                for name, component in value.items():
                    number = _finite_number(component)
                    if number is not None:
                        out[f"{REWARD_COMPONENTS}/{name}"] = number
                continue
            number = _finite_number(value)
            if number is not None:
                out[key] = number
        out.update(self.tool_call_fields())
        return out

    def tool_call_fields(self) -> dict[str, float]:
        """What the model's tool calls were worth, whatever the verifier checks (``tool_calls.call_fields``)."""
        calls = [item.model_extra or {} for item in self.response.output if item.type == "function_call"]
        return call_fields((self.model_extra or {}).get("responses_create_params"), calls)


REWARD_COMPONENTS = "reward_components"
"""Gym 0.7's multi-reward field (``{name: value}``); :meth:`GymRunResult.numeric_fields` keys them
``reward_components/<name>``."""
_NOT_RESULT_FIELDS = frozenset({"reward", "mask_sample"})


def _finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite int, float or bool (bools as 0/1); None otherwise."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond a float's range
        return None
    return number if math.isfinite(number) else None


def reward_components(numeric: Mapping[str, float]) -> dict[str, float]:
    """The ``reward_components/<name>`` entries of :meth:`GymRunResult.numeric_fields`, as ``{name: value}``."""
    prefix = f"{REWARD_COMPONENTS}/"
    return {k[len(prefix) :]: v for k, v in numeric.items() if k.startswith(prefix)}


def describe_validation_error(error: ValidationError, *, max_errors: int = 5) -> str:
    """One line per pydantic error, each with its JSON path (``response.output[3].generation_log_probs``)."""
    lines = []
    for err in error.errors()[:max_errors]:
        path = ""
        for part in err["loc"]:
            path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
        got = err.get("input")
        got_text = json.dumps(got, default=str)[:80] if not isinstance(got, Mapping) else "{...}"
        lines.append(f"{path or '<root>'}: {err['msg']} (got {got_text})")
    extra = error.error_count() - len(lines)
    if extra > 0:
        lines.append(f"... and {extra} more")
    return "; ".join(lines)


def parse_run_result(payload: Mapping[str, Any] | str | bytes, *, where: str = "/run result") -> GymRunResult:
    """Validate one ``/run`` answer. ``payload`` is the decoded JSON object or its text.

    Raises:
        GymServerError: the payload is not a valid result; the message names ``where`` and each bad JSON path.
    """
    try:
        if isinstance(payload, str | bytes):
            return GymRunResult.model_validate_json(payload)
        return GymRunResult.model_validate(payload)
    except ValidationError as e:
        raise GymServerError(f"{where}: not a valid Gym /run result: {describe_validation_error(e)}") from e


def parse_dataset_row(row: Mapping[str, Any]) -> DatasetRow:
    """Validate one dataset row (raises pydantic's ``ValidationError``; :mod:`dataset` adds file and line)."""
    return DatasetRow.model_validate(row)
