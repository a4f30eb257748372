"""verl's v1 (TransferQueue) records on the manager's side: verl's input batch unpacked into one dict per prompt, and
each finished sample as the ``(key, fields, tags)`` verl's own ``AgentLoopWorkerTQ._agent_loop_postprocess`` writes.

What :class:`~recipe.nemo_gym.managers.v1.NemoGymAgentLoopManagerTQ` puts into TransferQueue; pure (no TransferQueue
call here): the tensors come from :func:`nemo_gym_adapter.rollouts.samples.sample_tensors`, from the same
``Trajectory`` the legacy path pads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

from nemo_gym_adapter.errors import AdapterError
from nemo_gym_adapter.rollouts.samples import sample_tensors
from nemo_gym_adapter.rollouts.trajectory import Trajectory
from nemo_gym_adapter.wire.payloads import reward_components


def split_prompts(batch: TensorDict) -> list[dict[str, Any]]:
    """One dict per prompt of verl's input batch, its columns unpacked as ``AgentLoopWorkerTQ.generate_sequences``
    does (tensors sliced, non-tensor stacks indexed, non-tensor data shared); ``validate`` is left out."""
    prompts: list[dict[str, Any]] = []
    for i in range(len(batch)):
        prompt: dict[str, Any] = {}
        for key, value in batch.items():
            if key == "validate":
                continue
            if isinstance(value, torch.Tensor):
                prompt[key] = value[i]
            elif isinstance(value, NonTensorStack):
                prompt[key] = value[i].data
            elif isinstance(value, NonTensorData):
                prompt[key] = value.data
            else:
                raise AdapterError(f"generate_sequences: batch column {key!r} has unsupported type {type(value)}")
        for key in ("uid", "gym_row", "gym_env"):
            if key not in prompt:
                raise AdapterError(
                    f"generate_sequences: prompt {i} has no {key!r} (columns: {sorted(prompt)}); set data.custom_cls."
                    "path=pkg://nemo_gym_adapter.data.dataset and data.custom_cls.name=GymJsonlDataset"
                )
        prompts.append(prompt)
    return prompts


def task_index(prompt: Mapping[str, Any], position: int) -> int:
    """The prompt's dataset row (``GymJsonlDataset``'s ``index``), else its position in the batch."""
    index = prompt.get("index")
    try:
        return int(index) if index is not None else position
    except (TypeError, ValueError):
        return position


def sample_record(
    prompt: Mapping[str, Any],
    session_id: int,
    trajectory: Trajectory,
    *,
    pad_token_id: int,
    versions: tuple[int, int],
    output_index: int = 0,
    reward_extra_info: Mapping[str, float] | None = None,
) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(key, fields, tags)`` of one sample, as verl's ``AgentLoopWorkerTQ._agent_loop_postprocess`` writes them:
    the sample's tensors, ``num_turns`` and ``extra_fields`` (weight versions, Gym's outcome), then the prompt's own
    columns and ``session_id``. ``versions`` = (min, max) weight version the sample was generated with;
    ``output_index``: the sample's place among its session's outputs (a split rollout's segment);
    ``reward_extra_info`` (training samples: ``gym_outcome`` and the reward components, ``recipe.nemo_gym.algorithms.outcomes``)
    goes where verl's replay-buffer group filter reads it."""
    s = sample_tensors(trajectory, pad_token_id=pad_token_id)
    low, high = versions
    fields: dict[str, Any] = {
        **s.tensors,
        "num_turns": trajectory.num_turns,
        "extra_fields": {
            "global_steps": prompt.get("global_steps"),
            "min_global_steps": low,
            "max_global_steps": high,
            "gym_env": trajectory.env_name,
            "gym_reward": trajectory.gym_reward,
            "gym_masked_reason": trajectory.masked_reason.value if trajectory.masked_reason else "",
            "gym_truncated": trajectory.truncated,
            # its own, masked or not (recipe.nemo_gym.algorithms.gdpo: what its environment returns)
            "gym_reward_components": reward_components(trajectory.numeric),
        },
    }
    if reward_extra_info is not None:
        fields["extra_fields"]["reward_extra_info"] = dict(reward_extra_info)
    fields.update(prompt)
    fields["session_id"] = session_id
    fields["multi_modal_inputs"] = {}
    tags = {
        "status": "success",
        "prompt_len": s.prompt_len,
        "response_len": s.response_len,
        "seq_len": s.seq_len,
        "global_steps": prompt.get("global_steps"),
        "min_global_steps": low,
        "max_global_steps": high,
    }
    return f"{prompt['uid']}_{session_id}_{output_index}", fields, tags
