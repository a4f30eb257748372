"""One token trajectory → verl's unpadded per-sample tensors (v1 trainer, TransferQueue). Pure: no I/O.

The v1 counterpart of :mod:`nemo_gym_adapter.rollouts.padding` and built from the same :class:`~nemo_gym_adapter.rollouts.trajectory.
Trajectory` objects with the same row helpers (``padding.row_tokens``, ``padding.fill_sampled``), so both layouts
carry identical tokens, masks, logprobs and rewards. Layout (verl 0.9.1 ``AgentLoopOutput.as_dict`` +
``AgentLoopWorkerTQ._agent_loop_postprocess``, text only), every tensor 1-D:

* ``prompts`` (P,) and ``responses`` (R,) int64: the trajectory's ids, no padding;
* ``response_mask`` = ``loss_mask`` (R,) int64: 1 where the model sampled;
* ``rollout_log_probs`` (R,) float32: generation logprobs there, 0 elsewhere;
* ``rm_scores`` (R,) float32: the reward on the last response token;
* ``token_turns`` (R,) int64: which model call each sampled token is (``Trajectory.token_turns``: k + 1, negative on
  a token the model never generated, 0 elsewhere): the per-turn log-prob gap (``onpolicy/first_turn/*``);
* ``input_ids`` (P + R,) = prompts ‖ responses; ``position_ids`` (P + R,) = ``0 … P+R-1`` (what verl's
  ``compute_position_id_with_mask`` gives an all-ones attention mask).

A masked trajectory becomes what :mod:`nemo_gym_adapter.rollouts.padding` makes of it: its prompt (or one pad token) and ONE pad
response token with mask 0, logprob 0, reward 0: zero gradient, left out of ``masked_grpo``'s group baseline, and
identifiable from ``response_mask.sum() == 0`` alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from nemo_gym_adapter.rollouts.padding import fill_sampled, row_tokens, token_turns
from nemo_gym_adapter.rollouts.trajectory import Trajectory


@dataclass(frozen=True)
class SampleTensors:
    """One sample's unpadded tensors (``tensors``, torch) and the lengths verl tags it with."""

    tensors: dict[str, Any]
    prompt_len: int
    response_len: int

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len


def sample_tensors(t: Trajectory, *, pad_token_id: int) -> SampleTensors:
    """The unpadded tensors of one trajectory (layout in the module docstring)."""
    import torch

    prompt, response = row_tokens(t, pad_token_id)
    mask = np.zeros(len(response), dtype=np.int64)
    log_probs = np.zeros(len(response), dtype=np.float32)
    fill_sampled(t, mask, log_probs, where=f"sample_tensors: row {t.row_index}")
    rm_scores = np.zeros(len(response), dtype=np.float32)
    rm_scores[-1] = t.reward
    input_ids = np.concatenate([prompt, response]).astype(np.int64, copy=False)
    response_mask = torch.from_numpy(mask)
    tensors = {
        "prompts": torch.from_numpy(np.array(prompt, dtype=np.int64)),
        "responses": torch.from_numpy(np.array(response, dtype=np.int64)),
        "response_mask": response_mask,
        "loss_mask": response_mask.clone(),
        "rollout_log_probs": torch.from_numpy(log_probs),
        "rm_scores": torch.from_numpy(rm_scores),
        "token_turns": torch.from_numpy(token_turns(t, len(response))),
        "input_ids": torch.from_numpy(input_ids),
        "position_ids": torch.arange(len(input_ids), dtype=torch.int64),
    }
    return SampleTensors(tensors=tensors, prompt_len=len(prompt), response_len=len(response))
