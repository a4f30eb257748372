"""verl's legacy TaskRunner and PPO trainer, with the three things NeMo Gym training needs on top.

``python -m recipe.nemo_gym.main`` runs :data:`NemoGymTaskRunner` through verl's own ``run_ppo`` (Ray init, one
TaskRunner actor). Compared with ``verl.trainer.main_ppo_v0.TaskRunner``:

1. ``masked_grpo`` is registered in this process (verl computes advantages in the TaskRunner, a Ray actor, so
   registering it in the driver is not enough): importing :mod:`recipe.nemo_gym.algorithms.masked_grpo` does it; ``run`` also
   installs :mod:`recipe.nemo_gym.algorithms.masked_estimators` (masked samples out of verl's own outcome estimators: ``grpo``,
   ``gdpo`` with ``algorithm.gdpo_reward_keys``, ``rloo``, ...).
2. On CPU (``trainer.device=cpu``) the actor role maps to ``cpu.platform.CpuActorRolloutRefWorker`` (plain gloo
   process group; see PLATFORM_NOTES.md). On GPU verl's own worker is used unchanged.
3. The trainer is :class:`NemoGymPPOTrainer`: verl's ``RayPPOTrainer`` plus the logprob gap between the rollout
   (vLLM, as returned by Gym) and the actor's recomputation, logged every step as ``onpolicy/*`` (see
   :mod:`recipe.nemo_gym.algorithms.onpolicy_gap`: overall, per environment, first vs later turns); and the rollout manager is shut down (Gym stopped) when training ends or fails.
4. The rollout metrics reach verl's logger under their plain names (``gym/<env>/reward_mean``, ...): the legacy
   trainer logs only ``meta_info["timing"]`` of a rollout manager (as ``timing_s/...``), but it merges the rest of
   that ``meta_info`` into the batch it hands to ``_update_actor``, whose returned ``metrics`` it logs; the trainer
   takes them from there (``managers.legacy.GYM_METRICS_KEY``). After verl's own validation, ``_validate`` adds the
   manager's per-environment validation metrics and Gym's ``/aggregate_metrics`` (``nemo_gym_adapter.rollouts.validation``).
5. With ``nemo_gym.env_weights``, the training sampler is ``env_sampling.EnvWeightedSampler``: each batch holds
   every environment's share of rows.
6. Gym's Ray head (``nemo_gym.ray_head: early``) starts first, before the datasets and workers, so it is up by the
   time the manager starts Gym (``nemo_gym_adapter.gym.early.early_gym_servers``).
7. Before that, the engine ``actor_rollout_ref.rollout.name`` selects must be able to start here
   (``servers.engines.check_engine_available``: an SGLang run on the CPU backend or without SGLang stops, naming the key).
8. A checkpoint or verl rollout dump that hits a full disk (:mod:`recipe.nemo_gym.trainer.storage`): the previous
   checkpoint stays loadable and the run ends naming the path; the dump stops, the run goes on.

verl itself already logs ``training/rollout_probs_diff_*`` (probability space) and, with the default
``algorithm.rollout_correction`` block, ``rollout_corr/kl`` and ``rollout_corr/k3_kl``; ``onpolicy/*`` adds the
token-level mean |Δ logprob| and a K3 estimate over exactly the trained tokens. When every sample of a step is masked
both are reported as NaN, not a crash (verl's own step raises there; :mod:`recipe.nemo_gym.algorithms.rollout_correction`).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import ray
from omegaconf import OmegaConf
from verl.trainer.main_ppo_v0 import BaseTaskRunner
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

import recipe.nemo_gym.algorithms.masked_grpo  # noqa: F401  (registers masked_grpo in this process)
from nemo_gym_adapter.data.env_sampling import EnvWeightedSampler
from nemo_gym_adapter.gym.early import early_gym_servers
from nemo_gym_adapter.rollouts.groups import batch_signal
from recipe.nemo_gym.algorithms import logprob_guard, masked_estimators, rollout_correction
from recipe.nemo_gym.algorithms.onpolicy_gap import logprob_gap_by_env
from recipe.nemo_gym.config.load import load_config
from recipe.nemo_gym.managers.legacy import GYM_METRICS_KEY
from recipe.nemo_gym.servers.engines import check_engine_available, load_engine_class
from recipe.nemo_gym.trainer import storage

logger = logging.getLogger(__name__)


class NemoGymPPOTrainer(RayPPOTrainer):
    """verl's legacy trainer plus ``onpolicy/*`` metrics (reported with the actor update's own metrics), verl's
    rollout-correction step guarded against a step in which every sample is masked (:mod:`.rollout_correction`), and
    ``nemo_gym.trusted_logprobs`` (:mod:`.logprob_guard`: each step's ``bypass_mode`` decided at the end of the one
    before; the first step of a launch recomputes)."""

    def fit(self) -> Any:
        rollout_correction.install()
        return super().fit()

    def _save_checkpoint(self) -> Any:
        """verl's checkpoint; a full disk leaves the previous one loadable and ends the run naming the path."""
        return storage.save_checkpoint(self, super()._save_checkpoint)

    @staticmethod
    def _write_generations(*args: Any) -> None:
        """verl's rollout dump (``trainer.rollout_data_dir``); a full disk stops it, not the run."""
        storage.write_generations(RayPPOTrainer._write_generations, *args)

    def _update_actor(self, batch: Any) -> Any:
        gym_metrics = batch.meta_info.pop(GYM_METRICS_KEY, None) or {}  # the step's rollout metrics (agent_loop)
        gap = {}
        if "rollout_log_probs" in batch.batch and "old_log_probs" in batch.batch:
            trusted = logprob_guard.guard_of(self)[0].trusted_now  # this step's old log-probs are the rollout's
            old = None if trusted else batch.batch["old_log_probs"]
            if old is not None:
                gap = logprob_gap_by_env(
                    old,
                    batch.batch["rollout_log_probs"],
                    batch.batch["response_mask"],
                    batch.non_tensor_batch.get("gym_env"),
                    batch.batch["token_turns"] if "token_turns" in batch.batch else None,
                )
            rollout, mask = batch.batch["rollout_log_probs"], batch.batch["response_mask"]
            gap.update(logprob_guard.finish_step(self, self.global_steps, old, rollout, mask))  # sync: all fresh
        if "uid" in batch.non_tensor_batch and "rm_scores" in batch.batch:  # the groups this step learns from
            gap.update(
                batch_signal(
                    list(batch.non_tensor_batch["uid"]),
                    batch.batch["rm_scores"].sum(dim=-1).tolist(),
                    (batch.batch["response_mask"].sum(dim=-1) > 0).tolist(),
                )
            )
        output = super()._update_actor(batch)
        logprob_guard.begin_step(self, self.global_steps + 1)  # verl reads bypass_mode again in the next step
        # The trainer reduces these lists (mean; max for keys containing "max") and logs them this step.
        output.meta_info["metrics"].update({k: [v] for k, v in {**gym_metrics, **gap}.items()})
        return output

    def _validate(self, merged: bool = False) -> Any:
        """verl's validation (``val-core/<env>/reward/mean@N``, ...) plus the manager's per-environment Gym metrics."""
        result = super()._validate(merged=merged)
        pop = getattr(self.async_rollout_manager, "pop_validation_metrics", None)
        if pop is not None and isinstance(result, dict) and not merged:
            result.update(pop())
        return result


class NemoGymTaskRunnerImpl(BaseTaskRunner):
    """verl's TaskRunner sequence (roles → datasets → trainer → workers → fit) with the changes in the module doc."""

    def add_actor_rollout_worker(self, config: Any) -> tuple[type, type]:
        actor_cls, group_cls = super().add_actor_rollout_worker(config)
        if config.trainer.device == "cpu":
            from recipe.nemo_gym.cpu.platform import CpuActorRolloutRefWorker

            for role in list(self.role_worker_mapping):
                if self.role_worker_mapping[role].__ray_actor_class__ is actor_cls:
                    self.role_worker_mapping[role] = ray.remote(CpuActorRolloutRefWorker)
            actor_cls = CpuActorRolloutRefWorker
        return actor_cls, group_cls

    def run(self, config: Any) -> None:
        print(f"NeMo Gym TaskRunner on {socket.gethostname()}, pid {os.getpid()}")
        check_engine_available(config)  # before verl builds workers and replicas: the point the engine is needed
        notice = masked_estimators.install()  # this process computes the advantages
        if notice:
            print(notice)
        OmegaConf.resolve(config)
        gym = load_config(config, check_files=False).gym  # the nemo_gym: section, validated by main
        load_engine_class(config)  # before the warm launcher takes this process's environment
        with early_gym_servers(gym):  # Gym's Ray head comes up while verl builds datasets, workers and vLLM
            self._run(config)

    def _run(self, config: Any) -> None:
        from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler, need_critic, need_reference_policy
        from verl.utils.config import omega_conf_to_dataclass, validate_config
        from verl.utils.dataset.rl_dataset import collate_fn
        from verl.workers.config import HFModelConfig

        actor_cls, group_cls = self.add_actor_rollout_worker(config)
        self.add_critic_worker(config)
        self.add_reward_model_resource_pool(config)
        self.add_teacher_model_resource_pool(config)
        self.add_ref_policy_worker(config, actor_cls)
        validate_config(
            config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
        )

        model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model, dataclass_type=HFModelConfig)
        tokenizer, processor = model_config.tokenizer, model_config.processor
        datasets = {
            split: create_rl_dataset(
                config.data[f"{split}_files"],
                config.data,
                tokenizer,
                processor,
                is_train=split == "train",
                max_samples=config.data.get(f"{split}_max_samples", -1),
            )
            for split in ("train", "val")
        }
        trainer = NemoGymPPOTrainer(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config),
            ray_worker_group_cls=group_cls,
            train_dataset=datasets["train"],
            val_dataset=datasets["val"],
            collate_fn=collate_fn,
            train_sampler=train_sampler(config, datasets["train"], create_rl_sampler),
        )
        try:
            trainer.init_workers()
            trainer.fit()
        finally:
            manager = getattr(trainer, "async_rollout_manager", None)
            if manager is not None and hasattr(manager, "shutdown"):
                manager.shutdown()


def train_sampler(config: Any, dataset: Any, default: Any) -> Any:
    """``EnvWeightedSampler`` when ``nemo_gym.env_weights`` is set (each batch holds every environment's share),
    else verl's own sampler (``default(config.data, dataset)``)."""
    sampler = env_weighted_sampler(config, dataset)
    return default(config.data, dataset) if sampler is None else sampler


def env_weighted_sampler(config: Any, dataset: Any) -> EnvWeightedSampler | None:
    """The training sampler of ``nemo_gym.env_weights`` over ``dataset`` (a ``GymJsonlDataset``), or None when it
    is not set; both trainers use it (legacy: :func:`train_sampler`, v1: ``NemoGymTrainerMixin._init_dataloader``)."""
    weights = load_config(config, check_files=False).gym.env_weights
    if weights is None:
        return None
    names, codes = dataset.rows.store.env_codes()
    sampler = EnvWeightedSampler(names, codes, weights, int(config.data.train_batch_size), config.data.get("seed"))
    logger.info("training batches by environment share: %s", sampler.shares)
    return sampler


NemoGymTaskRunner = ray.remote(NemoGymTaskRunnerImpl)
"""The Ray actor class ``run_ppo(config, task_runner_class=NemoGymTaskRunner)`` expects."""
