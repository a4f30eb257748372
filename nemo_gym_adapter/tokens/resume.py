"""Partial rollouts: the token math of resuming a generation an engine pause cut short (pure, engine-neutral).

Why: verl 0.9.1's async trainers abort every in-flight request before a weight sync (docs/V1_NOTES.md). A turn Gym
asked for over HTTP comes back ``finish_reason="abort"`` with the tokens generated so far. Instead of throwing those
away (a 503 that Gym retries from the turn's start), the engine module resumes the turn inside the server: the
model's own tokens are appended to the prompt and the rest is generated with the weights the engine holds after the
sync, until the turn finishes as it would have (stop, length). The client gets one ordinary completion; each
segment keeps the log-probs and weight version it was generated with.

The rules decided here (the engine module reads its engine's objects and calls these):

* **When a turn can be resumed** (:func:`refusal`): one completion per request (``n == 1``), a plain token prompt,
  and sampling that does not depend on the tokens already generated in a way a prompt cannot carry. Presence and
  frequency penalties count only *output* tokens, structured outputs and bad words keep a state over the output, a
  thinking budget and repetition detection count output tokens: moving the kept tokens into the prompt would change
  what the rest is sampled from, so such a turn is refused (answered as before the feature: 503, regenerated whole).
  ``repetition_penalty`` covers prompt and output alike and ``logit_bias``/``allowed_token_ids`` are per step, so
  they resume unchanged. A turn whose kept tokens already spend the budget, or end on a stop token, was finished
  (the abort raced the finish): refused rather than guessed.
* **The budget** (:func:`resumed_limits`): the resumed request gets what the turn had left, ``max_tokens - kept``
  (and ``min_tokens - kept``, at least 0), still clamped to the context: ``prompt + kept + rest <= max_model_len``.
* **The seed** (:func:`resumed_seed`): a request seed would restart the same random stream at the seam (the rest
  sampled with the numbers the first tokens used); each segment gets its own seed derived from it.
* **The seam** (text): the token ids are what is trained, so they are concatenated as generated; the *text* of the
  whole answer, and where a stop string ends it, are recomputed by the engine module over all ids with the engine's
  own detokenizer (a stop string may start before the seam and end after it, and a character may be split across
  it; the resumed request's own detokenizer sees neither).
* **What is kept** (:class:`Segment`, :class:`Ledger`): per resumed turn, each segment's length and weight version,
  under a digest of the prompt and generated ids (:func:`turn_key`), so the trainer side can look a turn up by the
  ids Gym hands back.

No engine import, no I/O: tested in ``tests/unit/tokens/test_resume.py``.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# At most this many segments with tokens per turn, and resumed requests in all (a resumed request aborted again
# before its first token counts only here): a turn past either is answered as before, 503.
MAX_SEGMENTS = 32
MAX_ATTEMPTS = 4 * MAX_SEGMENTS
# Sampling parameters whose effect depends on the tokens generated so far (see the module docstring).
OUTPUT_DEPENDENT = (
    "presence_penalty",
    "frequency_penalty",
    "structured_outputs",
    "bad_words",
    "thinking_token_budget",
    "repetition_detection",
    "kv_transfer",
)
# Why a turn was not resumed (low cardinality: metric keys).
REFUSALS = (
    "disabled",  # partial rollouts are off (nemo_gym.partial_rollouts: false)
    "rejecting",  # the server is leaving rotation (verl's reject_request): no resume is coming soon
    "n",  # several completions in one request
    "not_token_prompt",  # a multimodal, embeddings or encoder-decoder prompt
    *OUTPUT_DEPENDENT,
    "too_many_segments",  # MAX_SEGMENTS segments with tokens, or MAX_ATTEMPTS resumed requests
    "budget_spent",  # the kept tokens already fill max_tokens (the abort raced the length finish)
    "ended_on_stop_token",  # the kept tokens end on a stop token (the abort raced the stop)
)


@dataclass(frozen=True)
class Sampling:
    """What of a request's sampling decides whether and how it resumes (the engine module fills it in)."""

    n: int = 1
    max_tokens: int | None = None
    min_tokens: int = 0
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()  # stop ids *including* EOS unless ``ignore_eos``
    output_dependent: tuple[str, ...] = ()  # the OUTPUT_DEPENDENT parameters this request sets


@dataclass(frozen=True)
class Segment:
    """One uninterrupted piece of a turn: how many tokens, generated with which weight version (None: unknown)."""

    tokens: int
    version: int | None


def refusal(
    sampling: Sampling,
    kept_ids: Sequence[int],
    *,
    segments: int,
    attempts: int = 0,
    enabled: bool = True,
    rejecting: bool = False,
    token_prompt: bool = True,
    room: int | None = None,
) -> str | None:
    """Why a turn interrupted after ``kept_ids`` (all its tokens so far, in ``segments`` pieces with tokens, after
    ``attempts`` resumed requests) cannot be resumed, or None when it can. The reasons are :data:`REFUSALS`, checked in that order. ``room``: the context left after the
    request's prompt (``max_model_len - len(prompt)``), when known."""
    if not enabled:
        return "disabled"
    if rejecting:
        return "rejecting"
    if sampling.n != 1:
        return "n"
    if not token_prompt:
        return "not_token_prompt"
    for name in OUTPUT_DEPENDENT:
        if name in sampling.output_dependent:
            return name
    if segments >= MAX_SEGMENTS or attempts >= MAX_ATTEMPTS:
        return "too_many_segments"
    if (sampling.max_tokens is not None and len(kept_ids) >= sampling.max_tokens) or (
        room is not None and len(kept_ids) >= room
    ):
        return "budget_spent"
    if kept_ids and kept_ids[-1] in sampling.stop_token_ids and len(kept_ids) > sampling.min_tokens:
        return "ended_on_stop_token"
    return None


def resumed_limits(
    sampling: Sampling, kept: int, prompt_len: int, max_model_len: int | None = None
) -> tuple[int | None, int]:
    """``(max_tokens, min_tokens)`` of the request that resumes a turn after ``kept`` tokens of a ``prompt_len``
    prompt: what the turn had left, and never more than the context leaves after prompt + kept (at least 1: a turn
    :func:`refusal` let through has room, and the engine rejects ``max_tokens < 1``)."""
    max_tokens = None if sampling.max_tokens is None else sampling.max_tokens - kept
    if max_model_len is not None:
        room = max_model_len - prompt_len - kept
        max_tokens = room if max_tokens is None else min(max_tokens, room)
    if max_tokens is not None:
        max_tokens = max(1, max_tokens)
    min_tokens = max(0, sampling.min_tokens - kept)
    if max_tokens is not None:
        min_tokens = min(min_tokens, max_tokens)
    return max_tokens, min_tokens


_SEED_STRIDE = 0x9E3779B1  # an odd constant: segment k's seed differs from every other segment's


def resumed_seed(seed: int | None, segment: int) -> int | None:
    """The seed of segment ``segment`` (1 = the first resume) of a request seeded with ``seed``; None stays None."""
    if seed is None:
        return None
    return (seed + segment * _SEED_STRIDE) % (2**63)


def concat(parts: Sequence[Any]) -> Any:
    """The sequences of ``parts`` end to end, in the container type of the first (a list, or an engine's own
    sequence type with ``extend``, e.g. vLLM's ``FlatLogprobs``); None when any part is None (no log-probs)."""
    if any(p is None for p in parts):
        return None
    first = parts[0]
    if isinstance(first, list | tuple):
        return [x for p in parts for x in p]
    out = type(first)()
    for p in parts:
        out.extend(p)
    return out


def version_span(segments: Iterable[Segment]) -> tuple[int, int] | None:
    """(oldest, newest) weight version over ``segments`` that carry tokens and a known version, or None."""
    known = [s.version for s in segments if s.tokens and s.version is not None]
    return (min(known), max(known)) if known else None


def turn_key(prompt_ids: Sequence[int], token_ids: Sequence[int]) -> str:
    """A digest naming one model call by its prompt and generated ids (what Gym hands back for the call)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(len(prompt_ids).to_bytes(8, "little"))
    h.update(array("q", prompt_ids).tobytes())
    h.update(array("q", token_ids).tobytes())
    return h.hexdigest()


class Ledger:
    """The segments of the last ``capacity`` resumed turns, by :func:`turn_key` (oldest forgotten first)."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._turns: OrderedDict[str, tuple[Segment, ...]] = OrderedDict()

    def record(self, key: str, segments: Sequence[Segment]) -> None:
        self._turns[key] = tuple(segments)
        self._turns.move_to_end(key)
        while len(self._turns) > self.capacity:
            self._turns.popitem(last=False)

    def get(self, key: str) -> tuple[Segment, ...] | None:
        return self._turns.get(key)

    def __len__(self) -> int:
        return len(self._turns)
