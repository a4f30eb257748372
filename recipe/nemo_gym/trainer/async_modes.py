"""verl's async trainer modes (``trainer.v1.trainer_mode``: ``colocate_async``, ``separate_async``) as this recipe runs
them with Gym: what is checked and set before anything starts (the v1 TaskRunner in
:mod:`recipe.nemo_gym.trainer.task_runner_v1` calls each). ``separate_async`` needs a standalone rollout pool that serves Gym
alone and a checkpoint engine that imports here (:func:`check_separate_async`); verl's ``flush=True`` INFO log that
kills it is avoided (:func:`quiet_separate_async_info_log`); an async mode without the token-ID patch is warned about
(:func:`warn_unguarded_aborts`). ``docs/V1_NOTES.md`` has the why of each.
"""

from __future__ import annotations

import logging
from typing import Any

from omegaconf import OmegaConf

logger = logging.getLogger(__name__)


def warn_unguarded_aborts(config: Any) -> bool:
    """Warn (and return True) when an async mode runs without the token-ID patch: verl aborts in-flight generations at
    each weight sync, and only the patch's abort guard (``nemo_gym_adapter.vllm.abort``) turns vLLM's cut 200 answer
    into a 503 that Gym retries; without it an aborted turn reaches Gym as a finished one and is trained as a stop."""
    mode = OmegaConf.select(config, "trainer.v1.trainer_mode", default="sync")
    if mode == "sync" or OmegaConf.select(config, "nemo_gym.patch_vllm", default=True):
        return False
    logger.warning(
        "trainer.v1.trainer_mode=%s with nemo_gym.patch_vllm=false: generations verl aborts at a weight sync are not "
        "detected (the abort guard comes with the patch) and are trained as if the model had stopped; "
        "set nemo_gym.patch_vllm=true or trainer.v1.trainer_mode=sync",
        mode,
    )
    return True


def check_separate_async(config: Any) -> None:
    """Fail at start-up, naming the key, when ``trainer.v1.trainer_mode=separate_async`` lacks what it needs with Gym.

    verl 0.9.1's ``PPOTrainerSeparateAsync`` (``verl/trainer/ppo/v1/trainer_separate_async.py``) serves rollouts from
    a standalone pool (``actor_rollout_ref.rollout.nnodes`` x ``n_gpus_per_node``, asserted > 0 at ``:64-67``) that
    receives weights through a checkpoint engine other than ``naive`` (asserted at ``:68``, message without the key).
    The engine class is looked up only in ``_setup`` (``CheckpointEngineManager``, ``checkpoint_engine/base.py:418``),
    after the actor workers and every vLLM replica started: a backend whose module failed to import (``nccl``/``nixl``
    need cupy, ``hccl`` torch_npu, ``mooncake``/``kimi`` their packages) is checked here, in the same process, first.
    Gym-specific: with ``actor_rollout_ref.hybrid_engine=true`` (verl's default) the colocated replicas join the
    standalone balancer (``:175``), so the manager hands them to Gym, whose URL list is fixed; at the first step
    ``switch_to_trainer`` (``:413-420``) takes them out of verl's rotation, aborts them with ``reject_request=True``
    and sleeps them, and with ``hybrid_rollout.enable_switch=false`` (the default) they resume only for validation:
    Gym's calls routed there would wait in a paused, sleeping engine. So the standalone pool must serve Gym alone.
    On CPU, verl ships no usable engine: ``recipe.nemo_gym.cpu.checkpoint_engine`` (``cpu_zmq``) is ours."""
    if OmegaConf.select(config, "trainer.v1.trainer_mode", default="sync") != "separate_async":
        return
    from nemo_gym_adapter.errors import AdapterConfigError

    where = "trainer.v1.trainer_mode=separate_async"
    for key in ("actor_rollout_ref.rollout.nnodes", "actor_rollout_ref.rollout.n_gpus_per_node"):
        value = OmegaConf.select(config, key, default=0)
        if not isinstance(value, int) or value <= 0:
            raise AdapterConfigError(f"{where} needs a standalone rollout pool: {key}={value!r} must be > 0")
    if OmegaConf.select(config, "actor_rollout_ref.hybrid_engine", default=True):
        raise AdapterConfigError(
            f"{where} with NeMo Gym needs actor_rollout_ref.hybrid_engine=false: Gym keeps the replica list it was "
            "started with, and verl pauses and sleeps the hybrid (colocated) replicas while training "
            "(docs/V1_NOTES.md, separate_async)"
        )
    key = "actor_rollout_ref.rollout.checkpoint_engine.backend"
    backend = OmegaConf.select(config, key, default="naive")
    if backend == "naive":
        raise AdapterConfigError(
            f"{where} needs {key} other than 'naive' (verl syncs the standalone replicas through a checkpoint engine: "
            "nccl, nixl, mooncake, ... on GPU; on CPU ours: backend=cpu_zmq with "
            "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.nemo_gym.cpu.checkpoint_engine)"
        )
    from verl.checkpoint_engine import CheckpointEngineRegistry
    from verl.utils.import_utils import import_external_libs

    custom = OmegaConf.select(config, "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module")
    import_external_libs(custom or None)  # as verl's CheckpointEngineManager does
    try:
        CheckpointEngineRegistry.get(backend)
    except ValueError as e:
        raise AdapterConfigError(f"{where}: {key}={backend!r} is not usable in this process: {e}") from e


def quiet_separate_async_info_log(config: Any) -> bool:
    """Raise verl's ``trainer_separate_async`` logger to WARNING for ``separate_async`` with ``hybrid_engine=false``
    (True when done): verl 0.9.1 logs that case with ``logger.info(..., flush=True)`` (``trainer_separate_async.py:
    181-185``), which the standard logger rejects (``TypeError: Logger._log() got an unexpected keyword argument
    'flush'``) whenever INFO is enabled, verl's default (``VERL_LOGGING_LEVEL``); the run dies in ``_setup``.
    Only that module's INFO lines are lost (the hybrid-switch messages, moot without hybrid replicas)."""
    if OmegaConf.select(config, "trainer.v1.trainer_mode", default="sync") != "separate_async":
        return False
    if OmegaConf.select(config, "actor_rollout_ref.hybrid_engine", default=True):
        return False
    verl_logger = logging.getLogger("verl.trainer.ppo.v1.trainer_separate_async")
    if verl_logger.isEnabledFor(logging.INFO):
        verl_logger.setLevel(logging.WARNING)
    return True
