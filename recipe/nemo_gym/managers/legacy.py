"""``NemoGymAgentLoopManager``: verl 0.9.1's legacy rollout manager, with NeMo Gym doing the rollouts.

Selected with ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=recipe.nemo_gym.managers.legacy.
NemoGymAgentLoopManager`` and created by the legacy trainer (``trainer.use_v1=False``) exactly like verl's own::

    RayPPOTrainer.init_workers
      -> LLMServerManager.create(config, worker_group=actor_rollout_wg)   # vLLM replicas: vllm_server_{r}_{node}
      -> NemoGymAgentLoopManager.create(config=, llm_client=, teacher_client=, reward_loop_worker_handles=)

Start-up and shutdown (replicas found and patched, Gym started or attached, the rollout core built) are
:class:`~recipe.nemo_gym.managers.base.GymManagerBase`'s. This class is the legacy contract only: each step,
``generate_sequences(DataProto) -> DataProto`` takes every row's ``gym_row``/``gym_env`` (from ``GymJsonlDataset``;
sampling from ``rollout`` or ``rollout.val_kwargs``, max output tokens = ``rollout.response_length``; rows are never
mutated), runs them through the core and pads the trajectories into verl's legacy batch (``padding.pad_trajectories``:
``rm_scores`` on the last valid token, so verl's reward manager is skipped; masked rows have an all-zero
``response_mask``), one output row per input row.

Metrics: the legacy trainer logs ``meta_info["timing"]`` of a rollout manager as ``timing_s/<key>`` and drops the
rest of its returned dicts, but it merges the output's ``meta_info`` into the training batch. So a training step's
metrics (``gym/<env>/reward_mean``, ``gym/all/masked_rate/<reason>``, ``gym/all/contiguity_rate``, ...) ride in
``meta_info[GYM_METRICS_KEY]`` to the recipe's trainer, which logs them under those plain names
(``recipe.nemo_gym.trainer.task_runner``); ``timing`` stays empty (verl times the call itself as ``timing_s/gen``).
Validation batches are collected into a :class:`~nemo_gym_adapter.rollouts.validation.ValidationPass`, whose metrics the
trainer takes with ``pop_validation_metrics`` (``base.GymManagerBase``) after verl's own validation.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from verl.experimental.agent_loop import AgentLoopManager
from verl.protocol import DataProto

from nemo_gym_adapter.errors import AdapterError
from nemo_gym_adapter.rollouts.core import BlockingRolloutCore, RowResult
from nemo_gym_adapter.rollouts.dump import SampleContext
from nemo_gym_adapter.rollouts.padding import pad_trajectories
from recipe.nemo_gym.algorithms.outcomes import batch_group_metrics, check_gdpo_keys, legacy_extras
from recipe.nemo_gym.config.checks import GDPO
from recipe.nemo_gym.managers.base import GymManagerBase
from recipe.nemo_gym.servers.replicas import weight_versions

GYM_METRICS_KEY = "nemo_gym_metrics"
"""``meta_info`` key of a training step's metrics (read and removed by ``task_runner.NemoGymPPOTrainer``)."""


class NemoGymAgentLoopManager(GymManagerBase, AgentLoopManager):
    """verl ``AgentLoopManager`` whose rollouts are NeMo Gym ``/run`` calls (see the module docstring)."""

    runner: BlockingRolloutCore
    _gdpo_checked_envs: set[str]

    def start(self) -> None:
        super().start()
        assert self.core is not None  # start() built it
        self.runner = BlockingRolloutCore(self.core)  # verl calls generate_sequences synchronously
        self._gdpo_checked_envs = set()  # environments whose results carried every algorithm.gdpo_reward_keys entry
        self.on_shutdown("rollout core", self.runner.close)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Run every row through Gym; return verl's legacy padded batch, one output row per input row."""
        self.check_open()
        t0 = time.perf_counter()
        rows, envs = gym_rows(prompts)
        validate = bool(prompts.meta_info.get("validate", False))
        desc = "Gym validation rollouts" if validate else "Gym rollouts"
        step = self.runner.run_step(rows, envs, self.sampling_overrides(validate), desc=desc)
        t1 = time.perf_counter()
        lengths = {"prompt_length": self.recipe.prompt_length, "response_length": self.recipe.response_length}
        padded = pad_trajectories(step.trajectories, **lengths, pad_token_id=self.pad_token_id)
        uids = group_ids(prompts)
        extras: dict[str, np.ndarray] = {}
        if not validate:  # gym_outcome and reward components per sample (recipe.nemo_gym.algorithms.outcomes)
            if self.recipe.adv_estimator == GDPO:  # each environment's first valid results carry every GDPO key
                check_gdpo_keys(step.trajectories, self.recipe.gdpo_reward_keys, self._gdpo_checked_envs)
            taken = {*prompts.non_tensor_batch, *padded.non_tensors}
            extras = legacy_extras(step.trajectories, uids, taken, self.recipe.gdpo_reward_keys)
        output = DataProto.from_dict(tensors=padded.tensors, non_tensors={**padded.non_tensors, **extras})
        self.dump_rows(step.rows, prompts, uids, "val" if validate else "train")
        if validate:
            self.add_validation_rows(step.rows, task_indices(prompts))
            metrics: dict[str, float] = {}
        else:
            metrics = {**step.metrics, **self.engine_probe_metrics(), **batch_group_metrics(step.trajectories, uids)}
            t2 = time.perf_counter()
            metrics.update({"gym/timing/postprocess_s": t2 - t1, "gym/timing/generate_sequences_s": t2 - t0})
        # "timing" is required by the trainer; reward_extra_keys: the per-sample columns verl's GDPO, dump and
        # gdpo/* metrics read (never on validation batches: verl asserts every one of them has the same keys).
        output.meta_info = {"timing": {}, "reward_extra_keys": sorted(extras), GYM_METRICS_KEY: metrics}
        return output

    def dump_rows(self, rows: Sequence[RowResult], prompts: DataProto, uids: Sequence[Any], partition: str) -> None:
        """Each row to the readable dump (``nemo_gym.rollout_dump``), when it is on."""
        if self.dump is None:
            return
        known = [int(v) for v in weight_versions(self.live_replica_handles()) if v is not None] or [0]
        step = int(prompts.meta_info.get("global_steps", 0) or 0)
        seen: dict[Any, int] = {}
        for row, uid, index in zip(rows, uids, task_indices(prompts), strict=True):
            session = seen[uid] = seen.get(uid, -1) + 1
            where = SampleContext(step, partition, str(uid), session, index, (min(known), max(known)))
            self.dump.add(row, where)


def gym_rows(prompts: DataProto) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The batch's Gym rows and environment names (from ``GymJsonlDataset``)."""
    nt = prompts.non_tensor_batch
    missing = [k for k in ("gym_row", "gym_env") if k not in nt]
    if missing:
        raise AdapterError(
            f"generate_sequences: the batch has no {missing} (keys: {sorted(nt)}); set data.custom_cls.path="
            "pkg://nemo_gym_adapter.data.dataset and data.custom_cls.name=GymJsonlDataset"
        )
    if len(nt["gym_row"]) == 0:
        raise AdapterError("generate_sequences: empty batch")
    return list(nt["gym_row"]), [str(e) for e in np.asarray(nt["gym_env"]).tolist()]


def group_ids(prompts: DataProto) -> list[Any]:
    """Each row's prompt group (verl's ``uid``; its repeats share it), or its position when there is none."""
    uid = prompts.non_tensor_batch.get("uid")
    return list(range(len(prompts))) if uid is None else list(np.asarray(uid).tolist())


def task_indices(prompts: DataProto) -> list[int]:
    """Each row's dataset index (``GymJsonlDataset``'s ``index``; verl's repeats share it), or its position."""
    index = prompts.non_tensor_batch.get("index")
    if index is None:
        return list(range(len(prompts)))
    return [int(i) for i in np.asarray(index).tolist()]
