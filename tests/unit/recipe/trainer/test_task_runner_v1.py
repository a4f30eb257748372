"""Unit tests of the recipe's v1 trainer mixin (``recipe.nemo_gym.trainer.task_runner_v1``) over a fake of verl's v1
``PPOTrainer`` (the real one runs in tests/e2e/test_recipe_v1_cpu.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import ray
from omegaconf import OmegaConf

from recipe.nemo_gym.trainer.task_runner_v1 import NemoGymTrainerMixin, forbid_ray_auto_init, nemo_gym_trainer_cls


class FakeV1Trainer:
    """What the mixin overrides of verl's ``PPOTrainer``, recording calls."""

    def __init__(self, device: str) -> None:
        self.config = OmegaConf.create({"trainer": {"device": device, "v1": {"sampler": {"sampler_kwargs": {}}}}})
        self.calls: list[str] = []

    def _init_resource_pool_mgr(self) -> None:
        from verl.workers.engine_workers import ActorRolloutRefWorker

        self.role_worker_mapping = {"actor_rollout": ray.remote(ActorRolloutRefWorker), "critic": object()}

    def _build_replay_buffer(self) -> Any:
        return SimpleNamespace(poll_interval=2.0)  # verl's ReplayBuffer default

    def _compute_metrics(self, batch: Any, metrics: dict, timing_raw: dict, global_steps: int, epoch: int) -> None:
        self.calls.append("verl metrics")
        metrics["training/global_step"] = global_steps


class FakeManager:
    def __init__(self) -> None:
        self.drained = 0

    def drain_metrics(self) -> dict[str, float]:
        self.drained += 1
        return {"gym/all/reward_mean": 0.5, "gym/all/masked_rate/timeout": 0.25}


def test_trainer_class_is_cached_and_keeps_verls_base():
    cls = nemo_gym_trainer_cls(FakeV1Trainer)
    assert cls is nemo_gym_trainer_cls(FakeV1Trainer) and cls.__name__ == "NemoGymFakeV1Trainer"
    assert cls.__mro__[1:3] == (NemoGymTrainerMixin, FakeV1Trainer)


class FakeSeparateAsyncTrainer(FakeV1Trainer):
    """verl's ``PPOTrainerSeparateAsync._init_resource_pool_mgr``: the actor role becomes ``DetachActorWorker``."""

    def _init_resource_pool_mgr(self) -> None:
        from verl.experimental.separation.engine_workers import DetachActorWorker

        super()._init_resource_pool_mgr()
        self.role_worker_mapping["actor_rollout"] = ray.remote(DetachActorWorker)


@pytest.mark.parametrize(
    "trainer, verl_worker, cpu_worker",
    [
        (FakeV1Trainer, "verl.workers.engine_workers.ActorRolloutRefWorker", "CpuActorRolloutRefWorker"),
        (  # separate_async put DetachActorWorker in place of verl's actor worker
            FakeSeparateAsyncTrainer,
            "verl.experimental.separation.engine_workers.DetachActorWorker",
            "CpuDetachActorWorker",
        ),
    ],
)
def test_cpu_maps_the_actor_role_to_its_gloo_variant_and_gpu_keeps_verls(trainer, verl_worker, cpu_worker):
    import importlib

    from recipe.nemo_gym.cpu import platform

    module, _, name = verl_worker.rpartition(".")
    verl_cls, cpu_cls = getattr(importlib.import_module(module), name), getattr(platform, cpu_worker)
    cls = nemo_gym_trainer_cls(trainer)
    cpu, gpu = cls("cpu"), cls("cuda")
    cpu._init_resource_pool_mgr()
    gpu._init_resource_pool_mgr()
    assert cpu.role_worker_mapping["actor_rollout"].__ray_actor_class__ is cpu_cls
    assert issubclass(cpu_cls, verl_cls) and cpu_cls.__name__ == cpu_worker
    assert gpu.role_worker_mapping["actor_rollout"].__ray_actor_class__ is verl_cls


def test_rollout_metrics_join_the_step_metrics_under_their_own_names():
    trainer = nemo_gym_trainer_cls(FakeV1Trainer)("cpu")
    trainer.agent_loop_manager = FakeManager()
    metrics: dict[str, Any] = {"timing_s/step": 1.0}
    trainer._compute_metrics(None, metrics, {}, global_steps=3, epoch=0)
    assert trainer.calls == ["verl metrics"] and trainer.agent_loop_manager.drained == 1
    assert metrics["gym/all/reward_mean"] == 0.5 and metrics["gym/all/masked_rate/timeout"] == 0.25
    assert not any(k.startswith("timing_s/gym") for k in metrics)
    bare = nemo_gym_trainer_cls(FakeV1Trainer)("cpu")  # verl's own manager: nothing to drain, nothing added
    bare.agent_loop_manager = object()
    metrics = {}
    bare._compute_metrics(None, metrics, {}, global_steps=1, epoch=0)
    assert metrics == {"training/global_step": 1}


def test_replay_buffer_polls_often_unless_configured():
    from nemo_gym_adapter.errors import AdapterConfigError
    from recipe.nemo_gym.trainer.task_runner_v1 import DEFAULT_POLL_INTERVAL_S

    trainer = nemo_gym_trainer_cls(FakeV1Trainer)("cpu")
    assert trainer._build_replay_buffer().poll_interval == DEFAULT_POLL_INTERVAL_S < 2.0
    trainer.config.trainer.v1.sampler.sampler_kwargs = {"poll_interval_s": 0.5}
    assert trainer._build_replay_buffer().poll_interval == 0.5
    trainer.config.trainer.v1.sampler.sampler_kwargs = {"poll_interval_s": 0}
    with pytest.raises(AdapterConfigError, match="sampler_kwargs.poll_interval_s=0"):
        trainer._build_replay_buffer()


class FakeValidatingManager:
    """A manager with a finished validation pass (``GymManagerBase.pop_validation_metrics``)."""

    def __init__(self) -> None:
        self.popped = 0

    def pop_validation_metrics(self) -> dict[str, float]:
        self.popped += 1
        return {"val-core/env_a/gym/reward_mean": 0.75, "val-core/env_a/gym_aggregate/mean/reward": 0.75}


class FakeValidatingV1Trainer(FakeV1Trainer):
    def _validate(self) -> dict[str, float]:
        self.calls.append("verl validate")
        return {"val-core/env_a/reward/mean@1": 0.75}


def test_validation_adds_the_managers_per_environment_gym_metrics_after_verls():
    trainer = nemo_gym_trainer_cls(FakeValidatingV1Trainer)("cpu")
    trainer.agent_loop_manager = FakeValidatingManager()
    result = trainer._validate()
    assert trainer.calls == ["verl validate"] and trainer.agent_loop_manager.popped == 1
    assert result == {
        "val-core/env_a/reward/mean@1": 0.75,
        "val-core/env_a/gym/reward_mean": 0.75,
        "val-core/env_a/gym_aggregate/mean/reward": 0.75,
    }
    bare = nemo_gym_trainer_cls(FakeValidatingV1Trainer)("cpu")  # verl's own manager: verl's metrics only
    bare.agent_loop_manager = object()
    assert bare._validate() == {"val-core/env_a/reward/mean@1": 0.75}


class FakeDataloaderV1Trainer(FakeV1Trainer):
    """verl's ``_init_dataloader`` as far as the mixin sees it: a train dataset and a dataloader over it."""

    def __init__(self, device: str, cfg: Any, dataset: Any) -> None:
        super().__init__(device)
        self.config, self.dataset = cfg, dataset

    def _init_dataloader(self) -> None:
        from torch.utils.data import SequentialSampler
        from torchdata.stateful_dataloader import StatefulDataLoader
        from verl.utils.dataset.rl_dataset import collate_fn

        self.train_dataset = self.dataset
        self.train_dataloader = StatefulDataLoader(
            self.dataset,
            batch_size=self.config.data.train_batch_size,  # verl's, in sync mode
            drop_last=True,
            collate_fn=collate_fn,
            sampler=SequentialSampler(self.dataset),
        )


def test_env_weights_make_the_v1_training_dataloader_sample_each_environments_share():
    from collections import Counter

    from omegaconf import OmegaConf
    from torch.utils.data import SequentialSampler

    from nemo_gym_adapter.data.dataset import GymJsonlDataset
    from nemo_gym_adapter.data.env_sampling import EnvWeightedSampler
    from tests.unit.recipe.config.test_configs_compose import _compose

    cfg = _compose("nemo_gym_cpu_multi_env")
    OmegaConf.resolve(cfg)
    dataset = GymJsonlDataset(list(cfg.data.train_files), config=cfg.data)
    trainer = nemo_gym_trainer_cls(FakeDataloaderV1Trainer)("cpu", cfg, dataset)
    trainer._init_dataloader()
    loader = trainer.train_dataloader
    b = cfg.data.train_batch_size
    assert isinstance(loader.sampler, EnvWeightedSampler) and loader.batch_size == b and loader.drop_last
    for batch in list(loader)[:3]:
        assert Counter(batch["gym_env"].tolist()) == {
            "toy_choice_simple_agent": b // 2,
            "toy_lookup_simple_agent": b // 2,
        }
    plain = _compose("nemo_gym_cpu_multi_env", ("nemo_gym.env_weights=null",))
    OmegaConf.resolve(plain)
    unweighted = nemo_gym_trainer_cls(FakeDataloaderV1Trainer)("cpu", plain, dataset)
    unweighted._init_dataloader()
    assert isinstance(unweighted.train_dataloader.sampler, SequentialSampler)  # verl's own, untouched


def test_a_ray_call_without_ray_is_refused_and_names_its_thread_instead_of_starting_a_cluster(monkeypatch, capfd):
    """The async run's orphans: a late Ray call in the TaskRunner process auto-started a fresh local cluster."""
    if ray.is_initialized():  # the whole suite in one process: the integration tier's session cluster is up here
        import subprocess
        import sys

        node = f"{__file__}::test_a_ray_call_without_ray_is_refused_and_names_its_thread_instead_of_starting_a_cluster"
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", node],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
        return
    from ray._private import auto_init_hook, client_mode_hook

    for module, name in ((auto_init_hook, "enable_auto_connect"), (auto_init_hook, "auto_init_ray")):
        monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(client_mode_hook, "auto_init_ray", client_mode_hook.auto_init_ray)
    monkeypatch.setenv("RAY_ENABLE_AUTO_CONNECT", "1")
    assert not ray.is_initialized()
    forbid_ray_auto_init()
    try:
        with pytest.raises(Exception, match="(?i)ray"):
            ray.put(1)
        assert not ray.is_initialized(), "a Ray cluster was started"
    finally:
        if ray.is_initialized():  # the guard failed: do not leave the cluster it started
            ray.shutdown()
    import os

    assert os.environ["RAY_ENABLE_AUTO_CONNECT"] == "0"
    err = capfd.readouterr().err
    assert "Ray call after Ray shut down, refused" in err and "MainThread" in err, err


def test_a_manager_that_lost_every_replica_ends_the_run_with_its_own_message():
    """verl's sync replay buffer raises "no materializable trajectories" once every group of a batch is a failure;
    when the manager knows why (its batch ended with ServerDownError), that message is the run's error instead."""
    from nemo_gym_adapter.errors import ServerDownError

    class FakeBuffer:
        poll_interval = 2.0

        def sample(self, global_steps: int, partition_id: str, batch_size: int) -> Any:
            raise RuntimeError("Sync replay buffer selected terminal groups with no materializable trajectories.")

    class Base(FakeV1Trainer):
        def _build_replay_buffer(self) -> Any:
            return FakeBuffer()

    trainer = nemo_gym_trainer_cls(Base)("cpu")
    trainer.agent_loop_manager = SimpleNamespace(fatal=None)
    buffer = trainer._build_replay_buffer()
    with pytest.raises(RuntimeError, match="materializable"):  # no known cause: verl's own error
        buffer.sample(1, "train", 4)
    trainer.agent_loop_manager.fatal = ServerDownError("every vLLM replica of model server(s) ['policy'] is lost")
    with pytest.raises(ServerDownError, match="every vLLM replica"):
        buffer.sample(1, "train", 4)


class FakeStartupV1Trainer(FakeV1Trainer):
    def on_init_end(self) -> None:
        self.calls.append("verl's first weight sync")

    def _load_checkpoint(self) -> None:
        self.global_steps = 2  # verl found global_step_2


def test_the_start_up_marks_and_the_first_step_line_come_from_verls_hooks_once(monkeypatch, capsys, tmp_path):
    import logging
    import time

    import recipe.nemo_gym.trainer.task_runner_v1 as task_runner_v1
    from nemo_gym_adapter.console.startup import StartupTimeline
    from recipe.nemo_gym.trainer import storage

    timeline = StartupTimeline()
    timeline.mark("launch", time.time() - 100)
    monkeypatch.setattr(task_runner_v1, "TIMELINE", timeline)
    trainer = nemo_gym_trainer_cls(FakeStartupV1Trainer)("cpu")
    trainer.on_init_end()
    assert trainer.calls == ["verl's first weight sync"] and timeline.get("weights") is not None
    trainer._compute_metrics(None, {}, {"step": 18.1, "gen": 4.84}, global_steps=1, epoch=0)
    trainer._compute_metrics(None, {}, {"step": 3.0, "gen": 1.0}, global_steps=2, epoch=0)
    said = [line for line in capsys.readouterr().out.splitlines() if "first step" in line]
    assert len(said) == 1 and said[0].startswith("[nemo-gym-verl] first step 18.1 s (generation 4.8 s), ")
    assert said[0].endswith(" s after the launch")
    verl_logger = logging.getLogger(storage.VERL_V1_TRAINER_LOGGER)
    original = verl_logger.level
    trainer.config = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path), "resume_mode": "auto"}})
    try:
        verl_logger.setLevel(logging.WARNING)  # the recipe's VERL_LOGGING_LEVEL=WARN: verl's own line is not shown
        trainer._load_checkpoint()
        assert capsys.readouterr().out == f"Resuming from {tmp_path / 'global_step_2'}, setting global step to 2\n"
    finally:
        verl_logger.setLevel(original)
