"""Token trajectories → verl's padded legacy batch (pure: no I/O, inputs never modified).

Layout (:func:`pad_trajectories`) follows verl 0.9.1 ``AgentLoopWorker._agent_loop_postprocess``/``_postprocess``:
``prompts`` left-padded to ``prompt_length``; ``responses``/``response_mask``/``rollout_log_probs``
right-padded to ``response_length``; ``input_ids``/``attention_mask`` their concatenation; ``position_ids`` =
``compute_position_id_with_mask(attention_mask)``; ``rm_scores`` = reward on the last valid response token.
Non-tensors: ``__num_turns__`` plus ``gym_*`` per-row info and ``multi_modal_inputs`` (the legacy trainer iterates
that key unconditionally). One slice copy per row and per sampled span; no Python work per token.

What a masked row looks like in the batch (chosen so it gives exactly zero gradient and is identifiable from the
tensors a verl advantage estimator receives): its prompt is kept when known and fitting (else one pad token); its
response is ONE pad token with attention 1, ``response_mask`` 0, logprob 0, ``rm_scores`` 0. So
``response_mask.sum(-1) == 0`` ⇔ masked (every unmasked row has ≥ 1 sampled token) and no row has an empty
response (verl places ``rm_scores`` at ``response_length - 1``, which would wrap to -1 on an empty row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nemo_gym_adapter.rollouts.forced import sampled_positions
from nemo_gym_adapter.rollouts.trajectory import Trajectory


@dataclass(frozen=True)
class PaddedBatch:
    """verl's legacy output batch: ``tensors`` for ``TensorDict``/``DataProto.batch``, ``non_tensors`` for
    ``DataProto.non_tensor_batch`` (numpy arrays of length ``B``)."""

    tensors: dict[str, Any]
    non_tensors: dict[str, np.ndarray]


def pad_trajectories(
    trajectories: Sequence[Trajectory], *, prompt_length: int, response_length: int, pad_token_id: int
) -> PaddedBatch:
    """Pad trajectories into verl's legacy batch (shapes in the module docstring; ``B = len(trajectories)``).

    Tensors: ``prompts`` (B, P) long, left-padded; ``responses``, ``response_mask`` (long),
    ``rollout_log_probs`` (float32), ``rm_scores`` (float32) (B, R), right-padded; ``input_ids``,
    ``attention_mask``, ``position_ids`` (B, P + R) long. Token-less rows get one ``pad_token_id`` token.

    Raises:
        ValueError: empty batch, or a trajectory longer than ``prompt_length``/``response_length`` (build
            trajectories with the same lengths); the message names the row.
    """
    import torch

    B, P, R = len(trajectories), prompt_length, response_length
    if B == 0:
        raise ValueError("pad_trajectories: empty batch")
    L = P + R
    # Written once each: ids and attention over the whole sequence (prompts and responses are copied out of the
    # ids below); zero-filled arrays come from calloc, so untouched padding costs nothing.
    input_ids = np.zeros((B, L), dtype=np.int64) if pad_token_id == 0 else np.full((B, L), pad_token_id, np.int64)
    attention_mask = np.zeros((B, L), dtype=np.int64)
    mask = np.zeros((B, R), dtype=np.int64)
    log_probs = np.zeros((B, R), dtype=np.float32)
    turns = np.zeros((B, R), dtype=np.int64)
    p_lens = np.empty(B, dtype=np.int64)
    r_lens = np.empty(B, dtype=np.int64)
    # One slice copy per row and per sampled span (memcpy speed); no Python work per token.
    for i, t in enumerate(trajectories):
        prompt, response = row_tokens(t, pad_token_id)
        lp, lr = len(prompt), len(response)
        if lp > P or lr > R:
            name, n, limit = ("prompt", lp, P) if lp > P else ("response", lr, R)
            raise ValueError(f"pad_trajectories: row {i} has a {name} of {n} tokens > {name}_length {limit}")
        p_lens[i], r_lens[i] = lp, lr
        input_ids[i, P - lp : P] = prompt
        input_ids[i, P : P + lr] = response
        attention_mask[i, P - lp : P + lr] = 1  # left-padded prompt and right-padded response meet at P
        fill_sampled(t, mask[i], log_probs[i], where=f"pad_trajectories: row {i}")
        turns[i, :lr] = token_turns(t, lr)

    rm_scores = np.zeros((B, R), dtype=np.float32)
    rm_scores[np.arange(B), r_lens - 1] = [t.reward for t in trajectories]
    # = verl.utils.model.compute_position_id_with_mask (clip(cumsum(attention) - 1, min=0); importing verl costs
    # ~20 s; equality is unit-tested): the attended tokens of a row are one run starting at column P - p_len, so
    # position j is j - (P - p_len), clipped to [0, p_len + r_len - 1].
    position_ids = np.arange(L, dtype=np.int64)[None, :] - (P - p_lens)[:, None]
    np.clip(position_ids, 0, (p_lens + r_lens - 1)[:, None], out=position_ids)

    non_tensors = {
        "__num_turns__": np.fromiter((t.num_turns for t in trajectories), dtype=np.int32, count=B),
        "gym_env": _objects([t.env_name for t in trajectories]),
        "gym_masked_reason": _objects([t.masked_reason.value if t.masked_reason else "" for t in trajectories]),
        "gym_truncated": np.fromiter((t.truncated for t in trajectories), dtype=bool, count=B),
        "gym_contiguity_failure": np.fromiter((t.contiguity_failure for t in trajectories), dtype=bool, count=B),
        "multi_modal_inputs": _objects([{} for _ in trajectories]),
    }
    tensors = {
        "prompts": torch.from_numpy(np.ascontiguousarray(input_ids[:, :P])),
        "responses": torch.from_numpy(np.ascontiguousarray(input_ids[:, P:])),
        "response_mask": torch.from_numpy(mask),
        "rollout_log_probs": torch.from_numpy(log_probs),
        "input_ids": torch.from_numpy(input_ids),
        "attention_mask": torch.from_numpy(attention_mask),
        "position_ids": torch.from_numpy(position_ids),
        "rm_scores": torch.from_numpy(rm_scores),
        "token_turns": torch.from_numpy(turns),
    }
    return PaddedBatch(tensors=tensors, non_tensors=non_tensors)


def row_tokens(t: Trajectory, pad_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """A row's ``(prompt ids, response ids)`` as both layouts put them: a token-less side (a masked row) becomes one
    ``pad_token_id`` token, so no row is empty (``rm_scores`` sits on the last response token)."""
    pad = np.array([pad_token_id], dtype=np.int64)
    return (t.prompt_ids if len(t.prompt_ids) else pad), (t.response_ids if len(t.response_ids) else pad)


def fill_sampled(t: Trajectory, mask: np.ndarray, log_probs: np.ndarray, *, where: str) -> None:
    """Write ``t``'s sampled spans into a response row: ``mask`` 1 (0 on its forced tokens, ``rollouts.forced``) and
    the generation logprobs there (the rest of both rows is left as it is, i.e. 0). One slice copy per span. Raises ``ValueError`` (naming ``where``) when the
    logprobs do not cover the spans exactly (a ``Trajectory`` invariant; guards hand-built ones)."""
    offset = 0
    for start, end in t.sampled_spans:
        mask[start:end] = 1
        log_probs[start:end] = t.sampled_logprobs[offset : offset + end - start]
        offset += end - start
    if offset != len(t.sampled_logprobs):
        raise ValueError(f"{where} has {len(t.sampled_logprobs)} logprobs for {offset} tokens")
    if t.forced is not None:  # sampled, but forced by constrained decoding: not trained (rollouts.forced)
        mask[sampled_positions(t.sampled_spans)[t.forced]] = 0


def token_turns(t: Trajectory, length: int) -> np.ndarray:
    """``t.token_turns()`` over a response row of ``length`` tokens (a masked row's one pad token: 0)."""
    return t.token_turns() if len(t.response_ids) == length else np.zeros(length, dtype=np.int64)


def _objects(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr
