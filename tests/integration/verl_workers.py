"""Test helper: verl's FSDP2 actor worker group on CPU, built the way ``RayPPOTrainer.init_workers`` builds it.

Shared by the integration tests that need verl's real actor (CPU platform worker, one logical GPU slot), with a
reader of its live parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ActorWorkers:
    """The spawned actor group plus what a test needs to tear it down."""

    actor_wg: Any  # the ActorRollout worker group (init_model already called)
    group: Any  # the colocated RayWorkerGroup (its ``workers`` are the Ray actors)
    pools: Any  # the ResourcePoolManager (placement groups to remove)
    role: Any

    def kill(self) -> None:
        """Kill the workers and free their placement groups (the Ray cluster stays up)."""
        import ray

        for worker in self.group.workers:
            ray.kill(worker)
        for pg in self.pools.get_resource_pool(self.role).pgs or []:
            ray.util.remove_placement_group(pg)


def spawn_cpu_actor_workers(
    config: Any,
    pool_name: str = "global_pool",
    worker_env: dict[str, str] | None = None,
    process_on_nodes: list[int] | None = None,
    init_model: bool = True,
) -> ActorWorkers:
    """Spawn ``CpuActorRolloutRefWorker`` ranks (one by default; ``process_on_nodes`` = ranks per node, verl's
    resource-pool spec) through verl's resource pool / colocated-worker machinery and run ``init_model`` (unless
    ``init_model=False``: the rollout replicas only need the ranks' placement). ``config`` is the whole trainer
    config; ``worker_env`` is verl's per-worker environment."""
    import ray
    from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, ResourcePoolManager
    from verl.single_controller.ray.base import create_colocated_worker_cls
    from verl.trainer.ppo.utils import Role

    from recipe.nemo_gym.cpu import platform as cpu_platform

    role = Role.ActorRollout
    pools = ResourcePoolManager(resource_pool_spec={pool_name: process_on_nodes or [1]}, mapping={role: pool_name})
    pools.create_resource_pool()
    worker_cls = RayClassWithInitArgs(
        cls=ray.remote(cpu_platform.CpuActorRolloutRefWorker),
        config=config.actor_rollout_ref,
        distillation_config=config.get("distillation"),
        role=str(role),
    )
    kwargs = {"worker_env": worker_env} if worker_env is not None else {}
    group = RayWorkerGroup(
        resource_pool=pools.get_resource_pool(role),
        ray_cls_with_init=create_colocated_worker_cls({str(role): worker_cls}),
        device_name=config.trainer.device,
        **kwargs,
    )
    actor_wg = group.spawn(prefix_set={str(role)})[str(role)]
    if init_model:
        actor_wg.init_model()
    return ActorWorkers(actor_wg=actor_wg, group=group, pools=pools, role=role)


def actor_weights(worker_group: Any) -> dict[str, Any]:
    """Full parameters of the live FSDP2 actor (test-only introspection through Ray's __ray_call__)."""
    import ray

    def read(worker_dict):
        module = worker_dict.worker_dict["actor_rollout"].actor.engine.module
        return {
            name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in module.named_parameters()
        }

    return ray.get(worker_group.workers[0].__ray_call__.remote(read))
