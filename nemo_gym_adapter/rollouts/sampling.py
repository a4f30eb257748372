"""What the trainer's sampling settings become in each row's ``responses_create_params``, so that every one of them
reaches the engine with every request. Pure: no I/O, rows never modified.

Why per request: verl starts every vLLM server with the *training* sampling settings as its generation-config
defaults (``override_generation_config``: temperature, top_k, top_p, max tokens); whatever a request leaves out is the
training value. Validation that sends only temperature and top_p samples with the training ``top_k``.

The Responses API that Gym's agents take has fields for ``temperature``, ``top_p`` and ``max_output_tokens`` only.
The engine's other sampling parameters (``top_k``, ``repetition_penalty``, ``ignore_eos``) travel in the request's
``metadata.extra_body``, a JSON object in a string: Gym's ``vllm_model`` server merges it into the chat-completions
body it sends the engine (vLLM and SGLang both take these fields there), and ``simple_agent`` keeps a row's metadata on
every turn. :func:`request_params` applies a step's overrides (:meth:`Sampling.overrides`) to one row:

* ``temperature``, ``top_p``: the trainer's replace the row's own (the policy is trained on the trainer's
  sampling distribution, not on a row's);
* ``max_output_tokens``: a cap, the smaller of the row's own and the trainer's response budget
  (``rollout.response_length``): a row asking for fewer tokens gets fewer, none gets more than the trainer trains;
* engine parameters: merged into the row's ``metadata.extra_body`` (its other keys -- a structured-output grammar, a
  seed -- are kept; the trainer's win on a clash).

An agent that builds its model requests from scratch, dropping the row's metadata, sends only what it sends.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

MAX_OUTPUT_TOKENS = "max_output_tokens"
ENGINE_FIELDS = "metadata.extra_body"
"""Key of :meth:`Sampling.overrides` whose dict is merged into the row's ``metadata.extra_body``."""


@dataclass(frozen=True)
class Sampling:
    """One step's sampling settings (training: ``actor_rollout_ref.rollout.*``; validation: its ``val_kwargs``).
    ``None``: not sent (the row's own value, else the engine's default)."""

    temperature: float | None
    top_p: float | None
    max_output_tokens: int | None
    top_k: int | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None

    def greedy(self) -> Sampling:
        """The same settings with greedy decoding, as verl's ``apply_greedy_sampling_params``."""
        return replace(self, temperature=0.0, top_p=1.0, top_k=-1)

    def overrides(self) -> dict[str, Any]:
        """The ``responses_create_params`` overrides :func:`request_params` applies (``None`` values left out)."""
        first_class = {"temperature": self.temperature, "top_p": self.top_p, MAX_OUTPUT_TOKENS: self.max_output_tokens}
        engine = {"top_k": self.top_k, "repetition_penalty": self.repetition_penalty, "ignore_eos": self.ignore_eos}
        out: dict[str, Any] = {k: v for k, v in first_class.items() if v is not None}
        engine = {k: v for k, v in engine.items() if v is not None}
        if engine:
            out[ENGINE_FIELDS] = engine
        return out


def request_params(params: Mapping[str, Any] | None, overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of a row's ``responses_create_params`` with a step's ``overrides`` applied (the module docstring's
    rules); other override keys replace the row's value, ``None`` values are skipped. Raises ``ValueError`` naming
    the field when the row's ``metadata.extra_body`` is not a JSON object (Gym's ``vllm_model`` would fail on it)."""
    out = dict(params or {})
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key == MAX_OUTPUT_TOKENS:
            own = out.get(MAX_OUTPUT_TOKENS)
            out[key] = min(own, value) if _is_count(own) else value
        elif key == ENGINE_FIELDS:
            out["metadata"] = _with_engine_fields(out.get("metadata"), value)
        else:
            out[key] = value
    return out


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _with_engine_fields(metadata: Any, fields: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``metadata`` whose ``extra_body`` JSON also holds ``fields`` (theirs win)."""
    out = dict(metadata or {})
    raw = out.get("extra_body") or "{}"
    try:
        extra = json.loads(raw)
    except (TypeError, ValueError) as e:
        raise ValueError(f"responses_create_params.metadata.extra_body is not JSON ({raw!r:.80}): {e}") from e
    if not isinstance(extra, dict):
        raise ValueError(f"responses_create_params.metadata.extra_body is not a JSON object ({raw!r:.80})")
    out["extra_body"] = json.dumps({**extra, **fields})
    return out
