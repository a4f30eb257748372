"""``rollout.name=vllm`` resolves to the CPU replica (:class:`recipe.nemo_gym.cpu.rollout.CPUvLLMReplica`), and vLLM is
imported only by the process that builds the replicas.

Loaded in every process of a CPU run through ``VERL_USE_EXTERNAL_MODULES`` (``configs/nemo_gym_cpu.yaml``: after
``recipe.nemo_gym.cpu.platform``). verl's ``RolloutReplicaRegistry`` takes a loader, not a class: the one registered
here imports :mod:`recipe.nemo_gym.cpu.rollout` (verl's ``vllm_async_server``, i.e. vLLM: seconds of CPU) when verl
asks for the class -- in the TaskRunner, when it builds the replicas. Loading ``recipe.nemo_gym.cpu.rollout`` itself
through ``VERL_USE_EXTERNAL_MODULES`` (as the configs did) made every process that imports verl import vLLM: the
driver before ``ray.init`` (on its critical path), the TaskRunner before anything started, and verl workers that never
use it (a demo's console showed vLLM's import notices from five processes).
"""

from __future__ import annotations

from typing import Any


def load_cpu_vllm_replica() -> Any:
    """verl's loader for ``rollout.name=vllm``: the CPU replica class (imports vLLM on first call)."""
    from recipe.nemo_gym.cpu.rollout import CPUvLLMReplica

    return CPUvLLMReplica


def register() -> None:
    """Point ``RolloutReplicaRegistry["vllm"]`` at :func:`load_cpu_vllm_replica` in this process (idempotent)."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register("vllm", load_cpu_vllm_replica)


register()
