"""verl's v1 (TransferQueue) TaskRunner and PPO trainer, with what NeMo Gym training needs on top.

``python -m recipe.nemo_gym.main`` with ``trainer.use_v1=True`` (the shipped default) runs
:data:`NemoGymTaskRunnerV1` through verl's own ``run_ppo``. It is verl 0.9.1's ``TaskRunnerV1``
(``verl/trainer/main_ppo.py``: ``tq.init`` → trainer of ``trainer.v1.trainer_mode`` → ``init`` → rollout manager
from ``rollout.agent.agent_loop_manager_class`` created with ``create(config=, llm_client=, teacher_client=,
reward_loop_worker_handles=)`` → ``fit`` → ``tq.close``), with these differences:

1. ``masked_grpo`` is registered in this process (importing :mod:`recipe.nemo_gym.algorithms.masked_grpo`), and ``run`` installs
   :mod:`recipe.nemo_gym.algorithms.masked_estimators` (masked samples out of verl's own outcome estimators).
2. The trainer is verl's registered class for the mode (``get_trainer_cls``: ``sync``, ``colocate_async``,
   ``separate_async``) with :class:`NemoGymTrainerMixin` in front (:func:`nemo_gym_trainer_cls`):
   - on CPU (``trainer.device=cpu``) the actor role runs ``cpu.platform.CpuActorRolloutRefWorker`` (gloo);
   - ``onpolicy/*`` (rollout-vs-actor logprob gap, :mod:`recipe.nemo_gym.algorithms.onpolicy_gap`, first and later turns apart) after
     verl computed ``old_log_probs``, or the rollout's as those where :mod:`recipe.nemo_gym.algorithms.logprob_guard` trusts them;
   - the rollout manager's metrics (``drain_metrics``: ``gym/...``) go into each step's metric dict under their own
     names: verl's v1 trainer has no channel for rollout-manager metrics (verl PR #7255, open);
   - verl's rollout-correction step is guarded against a step in which every sample is masked
     (:mod:`recipe.nemo_gym.algorithms.rollout_correction`);
   - the replay buffer polls TransferQueue every 0.1 s, not verl's hard-wired 2 s (:func:`replay_poll_interval`);
   - after verl's ``_validate``, the manager's per-environment validation metrics and Gym's ``/aggregate_metrics``
     (``pop_validation_metrics``: the legacy trainer's ``nemo_gym_adapter.rollouts.validation.ValidationPass``);
   - with ``nemo_gym.env_weights`` the training dataloader samples with the legacy trainer's
     ``env_sampling.EnvWeightedSampler`` (``_init_dataloader``);
   - a checkpoint or verl rollout dump that hits a full disk (:mod:`recipe.nemo_gym.trainer.storage`);
   - ``masked_grpo`` sees the batch's ``{uid}_{session}_{i}`` keys (``masked_grpo.SESSION_KEYS``), so a rollout split
     into several samples (``nemo_gym.trajectory.contiguity: split``) counts once in its group (``_compute_advantage``);
   - with ``algorithm.adv_estimator=gdpo``, verl's GDPO gets each sample's reward components, which verl's own
     ``_compute_advantage`` does not fetch (:mod:`recipe.nemo_gym.algorithms.gdpo`, installed in ``run``).
3. The rollout manager is shut down (Gym stopped) when training ends or fails; verl's runner never does it.
4. Gym's Ray head (``nemo_gym.ray_head: early``) starts before ``tq.init`` and verl's workers, so it is up by the
   time the manager starts Gym (``nemo_gym_adapter.gym.early.early_gym_servers``).
5. Ray may not auto-start a cluster in this process (:func:`forbid_ray_auto_init`): once the run's Ray is gone, a late
   Ray call from a thread still running here would otherwise start a fresh local cluster whose agents outlive the run.
6. ``separate_async`` is checked before anything starts (:func:`recipe.nemo_gym.trainer.async_modes.check_separate_async`): a standalone rollout pool, a
   checkpoint engine other than ``naive`` that imports here, ``actor_rollout_ref.hybrid_engine=false``; verl's
   ``flush=True`` INFO log that kills that configuration is avoided (``async_modes.quiet_separate_async_info_log``); on CPU
   verl's ``DetachActorWorker`` gets the gloo process group too (``cpu.platform.CpuDetachActorWorker``).
7. The engine ``actor_rollout_ref.rollout.name`` selects must be able to start here, checked before verl builds
   anything for it (``servers.engines.check_engine_available``: an SGLang run on the CPU backend or without SGLang stops
   with one message naming the key).
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import traceback
from typing import Any

import ray
from omegaconf import OmegaConf

from nemo_gym_adapter.console.startup import TIMELINE
from nemo_gym_adapter.gym.early import early_gym_servers
from nemo_gym_adapter.rollouts.groups import batch_signal
from recipe.nemo_gym.algorithms import (  # masked_grpo registers verl's masked_grpo estimator
    gdpo,
    logprob_guard,
    masked_estimators,
    masked_grpo,
    rollout_correction,
)
from recipe.nemo_gym.algorithms.onpolicy_gap import logprob_gap_by_env
from recipe.nemo_gym.config.load import load_config
from recipe.nemo_gym.servers.engines import check_engine_available, load_engine_class
from recipe.nemo_gym.trainer import storage
from recipe.nemo_gym.trainer.async_modes import (
    check_separate_async,
    quiet_separate_async_info_log,
    warn_unguarded_aborts,
)
from recipe.nemo_gym.trainer.console import quiet_validation_dumps
from recipe.nemo_gym.trainer.task_runner import env_weighted_sampler

logger = logging.getLogger(__name__)


class NemoGymTrainerMixin:
    """Put before one of verl's v1 ``PPOTrainer`` classes (:func:`nemo_gym_trainer_cls`); see the module docstring."""

    config: Any
    role_worker_mapping: dict[Any, Any]
    agent_loop_manager: Any
    train_dataset: Any
    train_dataloader: Any
    global_steps: int

    def _init_resource_pool_mgr(self) -> None:
        super()._init_resource_pool_mgr()  # type: ignore[misc]
        if self.config.trainer.device == "cpu":
            from verl.experimental.separation.engine_workers import DetachActorWorker
            from verl.workers.engine_workers import ActorRolloutRefWorker

            from recipe.nemo_gym.cpu.platform import CpuActorRolloutRefWorker, CpuDetachActorWorker

            cpu = {ActorRolloutRefWorker: CpuActorRolloutRefWorker, DetachActorWorker: CpuDetachActorWorker}
            for role, cls in list(self.role_worker_mapping.items()):
                cpu_cls = cpu.get(getattr(cls, "__ray_actor_class__", None))
                if cpu_cls is not None:  # separate_async put DetachActorWorker in place of verl's worker
                    self.role_worker_mapping[role] = ray.remote(cpu_cls)

    def _build_replay_buffer(self) -> Any:
        """verl's replay buffer, polling TransferQueue every :func:`replay_poll_interval` seconds instead of its
        hard-wired 2 s: a sync step otherwise waits up to 2 s after its last rollout (measured: ``timing_s/gen``
        2.0 s for rollouts done in 0.5 s on the CPU toy run)."""
        buffer = super()._build_replay_buffer()  # type: ignore[misc]
        if hasattr(buffer, "poll_interval"):
            buffer.poll_interval = replay_poll_interval(self.config)
        if hasattr(buffer, "sample"):
            buffer.sample = self._fatal_first(buffer.sample)
        return buffer

    def _fatal_first(self, sample: Any) -> Any:
        """verl's ``sample``, but a rollout manager's fatal error (``ServerDownError``: every replica or the attached
        Gym lost, its batch's groups published ``failure``) ends the run with its own message, not verl's "no
        materializable trajectories"."""

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return sample(*args, **kwargs)
            except Exception:
                fatal = getattr(getattr(self, "agent_loop_manager", None), "fatal", None)
                if isinstance(fatal, BaseException):
                    raise fatal from None
                raise

        return guarded

    def _init_dataloader(self) -> None:
        """verl's dataloaders; with ``nemo_gym.env_weights`` the training one draws from the same
        ``env_sampling.EnvWeightedSampler`` the legacy trainer uses (:func:`env_weighted_sampler`), verl's
        ``create_rl_sampler`` otherwise. Rebuilt with verl's own arguments (batch size, workers, collate_fn)."""
        super()._init_dataloader()  # type: ignore[misc]
        sampler = env_weighted_sampler(self.config, self.train_dataset)
        if sampler is not None:
            from torchdata.stateful_dataloader import StatefulDataLoader  # type: ignore[import-untyped]

            built = self.train_dataloader
            self.train_dataloader = StatefulDataLoader(
                dataset=self.train_dataset,
                batch_size=built.batch_size,
                num_workers=built.num_workers,
                drop_last=built.drop_last,
                collate_fn=built.collate_fn,
                sampler=sampler,
            )

    def _validate(self, *args: Any, **kwargs: Any) -> Any:
        """verl's validation (``val-core/<data_source>/reward/mean@N``, ...) plus the manager's per-environment
        ``ValidationPass`` metrics and Gym's ``/aggregate_metrics`` (the legacy trainer's ``_validate`` does the same)."""
        result = super()._validate(*args, **kwargs)  # type: ignore[misc]
        pop = getattr(getattr(self, "agent_loop_manager", None), "pop_validation_metrics", None)
        if pop is not None and isinstance(result, dict):
            result.update(pop())
        return result

    def _compute_advantage(self, batch: Any, metrics: dict[str, Any]) -> Any:
        token = masked_grpo.SESSION_KEYS.set(list(batch.keys))
        try:
            with gdpo.components_for(self, batch, metrics):  # GDPO: the reward components verl's fetch leaves out
                return super()._compute_advantage(batch, metrics)  # type: ignore[misc]
        finally:
            masked_grpo.SESSION_KEYS.reset(token)

    def _save_checkpoint(self) -> Any:
        """verl's checkpoint; a full disk leaves the previous one loadable and ends the run naming the path."""
        _say(storage.saving_line(self))  # verl's own line is INFO (recipe.nemo_gym.trainer.console)
        return storage.save_checkpoint(self, super()._save_checkpoint)  # type: ignore[misc]

    def _load_checkpoint(self) -> Any:
        out = super()._load_checkpoint()  # type: ignore[misc]
        _say(storage.resuming_line(self))
        return out

    @staticmethod
    def _write_generations(*args: Any) -> None:
        """verl's rollout dump (``trainer.rollout_data_dir``); a full disk stops it, not the run."""
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer

        storage.write_generations(PPOTrainer._write_generations, *args)

    def on_init_end(self) -> Any:
        TIMELINE.mark("weights")  # verl's set-up done; the sync trainer's first weight sync next
        return super().on_init_end()  # type: ignore[misc]

    def fit(self, agent_loop_manager: Any) -> Any:
        rollout_correction.install()
        return super().fit(agent_loop_manager)  # type: ignore[misc]

    def _compute_old_log_prob(self, batch: Any, metrics: dict[str, Any]) -> Any:
        fresh = logprob_guard.fresh_rows(batch.tags, self.global_steps)  # samples of the actor's current weights
        trusted = logprob_guard.begin_step(self, self.global_steps, logprob_guard.all_fresh(batch.tags, fresh))
        batch = super()._compute_old_log_prob(batch, metrics)  # type: ignore[misc]
        import transfer_queue as tq

        fields = ["old_log_probs", "rollout_log_probs", "response_mask", "rm_scores"]
        try:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
        except Exception as e:  # no rollout logprobs: nothing to compare
            logger.debug("no onpolicy/* metrics this step: %r", e)
            return batch
        padded = data.to_padded_tensor()
        old = None if trusted else padded["old_log_probs"]  # a trusted step's are the rollout's own
        rollout, mask = padded["rollout_log_probs"], padded["response_mask"]
        if old is not None:
            metrics.update(logprob_gap_by_env(old, rollout, mask, token_turns=_token_turns(tq, batch)))
        metrics.update(logprob_guard.finish_step(self, self.global_steps, old, rollout, mask, fresh))
        # The groups this step learns from: with verl's group filter on, none without signal (rollouts.groups).
        uids = [key.split("_")[0] for key in batch.keys]
        valid = (padded["response_mask"].sum(dim=-1) > 0).tolist()
        metrics.update(batch_signal(uids, padded["rm_scores"].sum(dim=-1).tolist(), valid))
        return batch

    def _compute_metrics(self, batch: Any, metrics: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        out = super()._compute_metrics(batch, metrics, *args, **kwargs)  # type: ignore[misc]
        timing = args[0] if args and isinstance(args[0], dict) else kwargs.get("timing_raw") or {}
        first = TIMELINE.first_step(timing)
        if first is not None:
            print(f"[nemo-gym-verl] {first}", flush=True)
        drain = getattr(getattr(self, "agent_loop_manager", None), "drain_metrics", None)
        if drain is not None:
            metrics.update(drain())
        return out


def _say(line: str | None) -> None:
    if line:
        print(line, flush=True)


def _token_turns(tq: Any, batch: Any) -> Any:
    """Each sample's ``token_turns`` (which model call each trained token is: ``rollouts.samples``), padded like
    the batch's other fields; None for samples put without them (the gap is then not split by turn)."""
    try:
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["token_turns"])
        return data.to_padded_tensor()["token_turns"]
    except Exception as e:
        logger.debug("no token_turns this step: %r", e)
        return None


DEFAULT_POLL_INTERVAL_S = 0.1


def replay_poll_interval(config: Any) -> float:
    """``trainer.v1.sampler.sampler_kwargs.poll_interval_s`` (set it with ``+``), else
    :data:`DEFAULT_POLL_INTERVAL_S`; each poll is one ``kv_list`` call to TransferQueue's controller."""
    kwargs = config.trainer.v1.sampler.get("sampler_kwargs", None) or {}
    value = kwargs.get("poll_interval_s", DEFAULT_POLL_INTERVAL_S)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        from nemo_gym_adapter.errors import AdapterConfigError

        raise AdapterConfigError(f"trainer.v1.sampler.sampler_kwargs.poll_interval_s={value!r}: must be a number > 0")
    return float(value)


def forbid_ray_auto_init() -> None:
    """No implicit ``ray.init()`` in this process (Ray's ``RAY_ENABLE_AUTO_CONNECT=0``, which Ray reads only when it
    is imported, hence the module flag), and a late call says who made it.

    A Ray API call made after the run's Ray went down (the driver's ``ray.shutdown`` ends this actor's worker while
    threads may still run) otherwise starts a NEW local Ray cluster, dashboard and all, from this process; its
    ``DashboardAgent`` and ``RuntimeEnvAgent`` outlive the run. With the flag off the call raises instead, and the
    calling thread's stack goes to stderr so the late caller is named."""
    from ray._private import auto_init_hook, client_mode_hook

    os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"  # children that import Ray
    auto_init_hook.enable_auto_connect = False
    original = auto_init_hook.auto_init_ray

    def refuse_auto_init() -> None:
        if not ray.is_initialized():
            stack = "".join(traceback.format_stack(limit=25))
            print(
                f"NeMo Gym TaskRunner (pid {os.getpid()}): Ray call after Ray shut down, refused (no new cluster) "
                f"from thread {threading.current_thread().name}:\n{stack}",
                file=sys.stderr,
                flush=True,
            )
        original()

    auto_init_hook.auto_init_ray = refuse_auto_init
    client_mode_hook.auto_init_ray = refuse_auto_init


_TRAINER_CLASSES: dict[type, type] = {}


def nemo_gym_trainer_cls(base: type) -> type:
    """``NemoGym<base>``: :class:`NemoGymTrainerMixin` in front of verl's trainer class ``base`` (cached)."""
    if base not in _TRAINER_CLASSES:
        _TRAINER_CLASSES[base] = type(f"NemoGym{base.__name__}", (NemoGymTrainerMixin, base), {})
    return _TRAINER_CLASSES[base]


class NemoGymTaskRunnerV1Impl:
    """verl's ``TaskRunnerV1`` sequence with the changes in the module docstring."""

    def __init__(self) -> None:
        self.config: Any = None
        self.trainer: Any = None
        self.agent_loop_manager: Any = None

    def init_agent_loop_manager(self) -> None:
        """As verl's ``TaskRunnerV1.init_agent_loop_manager``: the configured class (verl's default otherwise)."""
        from verl.trainer.ppo.v1 import AgentLoopManagerTQ
        from verl.utils.import_utils import load_class_from_fqn

        fqn = self.config.actor_rollout_ref.rollout.get("agent", {}).get("agent_loop_manager_class")
        manager_cls = load_class_from_fqn(fqn, "AgentLoopManager") if fqn else AgentLoopManagerTQ
        self.agent_loop_manager = manager_cls.create(
            config=self.config,
            llm_client=self.trainer.get_llm_client(),
            teacher_client=self.trainer.get_teacher_client(),
            reward_loop_worker_handles=self.trainer.get_reward_handles(),
        )

    def run(self, config: Any) -> None:
        from verl.trainer.ppo.v1 import get_trainer_cls
        from verl.utils.logging_utils import configure_verl_logging

        TIMELINE.mark_process_start()
        TIMELINE.mark("run")
        configure_verl_logging()
        forbid_ray_auto_init()
        print(
            f"NeMo Gym TaskRunner (v1, {config.trainer.v1.trainer_mode}) on {socket.gethostname()}, pid {os.getpid()}"
        )
        check_separate_async(config)
        check_engine_available(config)  # before verl builds workers and replicas: the point the engine is needed
        notice = masked_estimators.install()  # this process computes the advantages
        if notice:
            print(notice)
        gdpo.install()  # verl's gdpo gets the reward components on this trainer (recipe.nemo_gym.algorithms.gdpo)
        trainer_cls = nemo_gym_trainer_cls(get_trainer_cls(config.trainer.v1.trainer_mode))
        quiet_separate_async_info_log(config)  # after get_trainer_cls imported verl's module and set its level
        quiet_validation_dumps()  # the same metrics are in step 0's and the last step's metrics line
        warn_unguarded_aborts(config)
        config.transfer_queue.enable = True
        OmegaConf.resolve(config)
        self.config = config
        gym = load_config(config, check_files=False).gym  # the nemo_gym: section, validated by main
        load_engine_class(config)  # before the warm launcher takes this process's environment
        with early_gym_servers(gym):  # Gym's Ray head comes up while verl starts its workers and vLLM
            self._run(trainer_cls, config)

    def _run(self, trainer_cls: type, config: Any) -> None:
        import transfer_queue as tq

        tq.init(config.transfer_queue)
        succeeded = False
        try:
            self.trainer = trainer_cls(config=config)
            TIMELINE.mark("init")  # TransferQueue up, datasets read: verl's workers and replicas next
            self.trainer.init()
            TIMELINE.mark("ready")
            self.init_agent_loop_manager()
            TIMELINE.mark("gym")
            print(f"[nemo-gym-verl] {TIMELINE.summary()}", flush=True)
            self.trainer.fit(self.agent_loop_manager)
            succeeded = True
        finally:
            try:
                if self.agent_loop_manager is not None and hasattr(self.agent_loop_manager, "shutdown"):
                    self.agent_loop_manager.shutdown()
                tracking = getattr(self.trainer, "logger", None)
                if tracking is not None:
                    tracking.finish(exit_code=0 if succeeded else 1)
            finally:
                tq.close()


NemoGymTaskRunnerV1 = ray.remote(NemoGymTaskRunnerV1Impl)
"""The Ray actor class ``run_ppo(config, task_runner_class=NemoGymTaskRunnerV1)`` expects."""
