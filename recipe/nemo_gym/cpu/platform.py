"""A "cpu" platform for verl 0.9.1, so its FSDP2 training engine (actor/ref/critic) runs without CUDA.

verl routes every device call through ``verl.plugin.platform.get_platform()`` (``PlatformBase``
subclasses in ``PlatformRegistry``: nvidia, huawei, amd). There is no CPU platform, and the fallback
("nvidia") calls ``torch.cuda`` everywhere. This module registers one through verl's own extension
point (``@PlatformRegistry.register``); nothing in verl is patched.

Turn it on in every process that imports verl (driver, TaskRunner, workers) with the environment in
:data:`CPU_ENV` (``VERL_USE_EXTERNAL_MODULES`` makes ``import verl`` import this module, ``VERL_PLATFORM=cpu``
selects it). The platform is resolved once per process and cached, so these must be set before the
first ``get_platform()`` call, i.e. before importing most of verl; Ray workers started after
``ray.init`` inherit the driver's environment, or pass :data:`CPU_ENV` in the runtime env.

Choices, and why:

* ``device_name="cpu"``, ``communication_backend_name="gloo"``: verl builds the process group as
  ``"cpu:gloo,<device>:<backend>"`` and the device mesh on ``device_name``.
* ``current_device()`` returns ``"cpu"``, not an index: verl moves tensors with ``.to(get_device_id())``
  and ``.to(0)`` would mean ``cuda:0``.
* ``device_module`` is a small shim over ``torch.cpu`` that adds the ``torch.cuda``-style calls verl makes
  on it (``empty_cache``, memory statistics, RNG state, ``mem_get_info``) with CPU meanings.
* ``ray_resource_name="GPU"``: the legacy trainer's ``ResourcePoolManager`` hard-codes ``use_gpu=True``
  and checks Ray's "GPU"/"NPU" totals, so on CPU start Ray with *logical* GPU slots
  (``ray.init(num_cpus=..., num_gpus=n_slots)``); each slot is one training process.
* ``is_ipc_supported=False``: no CUDA IPC; verl's weight senders fall back to shared memory.
* ``is_platform_available`` is always False, so auto-detection never picks CPU on a GPU machine:
  only ``VERL_PLATFORM=cpu`` does.
* verl registers its FSDP engine for devices "cuda"/"npu" only; ``VERL_ENGINE_DEVICE=cuda`` (verl's own
  override for engine lookup) selects that engine class, which is device-agnostic once the platform is.

The hydra keys the CPU actor needs are in :data:`CPU_ACTOR_OVERRIDES` (see PLATFORM_NOTES.md for the why).
"""

from __future__ import annotations

import os
import resource
import types
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

PLATFORM_NAME = "cpu"

CPU_ENV: dict[str, str] = {
    "VERL_USE_EXTERNAL_MODULES": __name__,
    "VERL_PLATFORM": PLATFORM_NAME,
    "VERL_ENGINE_DEVICE": "cuda",
}
"""Environment for every verl process of a CPU run. Append other modules to VERL_USE_EXTERNAL_MODULES
after this one (comma separated) so the platform exists before anything resolves it."""

CPU_ACTOR_OVERRIDES: tuple[str, ...] = (
    "trainer.device=cpu",
    "actor_rollout_ref.actor.strategy=fsdp2",
    "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
    "actor_rollout_ref.model.use_remove_padding=false",
    "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
    "actor_rollout_ref.actor.use_torch_compile=false",
    "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=fp32",
    "+actor_rollout_ref.actor.fsdp_config.mixed_precision.buffer_dtype=fp32",
    "actor_rollout_ref.actor.fsdp_config.param_offload=false",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=false",
    "actor_rollout_ref.actor.fsdp_config.offload_policy=false",
    "actor_rollout_ref.actor.use_kl_loss=false",
    "algorithm.use_kl_in_reward=false",
)
"""Hydra overrides (against verl's ``ppo_trainer`` config) for the FSDP2 actor on CPU. No KL: a ref model
is built forward-only and verl then pins its memory, which fails without an accelerator."""


class _CpuDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the ``torch.cuda``-style functions verl calls on its device module.

    Memory figures are the process's resident memory (peak for the ``max_*`` ones), which is what
    verl's memory logs mean on a CPU; cache and IPC calls are no-ops because there is no device cache.
    """

    def __init__(self) -> None:
        super().__init__("verl_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    def empty_cache(self) -> None:
        return None

    def ipc_collect(self) -> None:
        return None

    def set_per_process_memory_fraction(self, fraction: float, device: Any = None) -> None:
        return None

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        return None

    def memory_allocated(self, device: Any = None) -> int:
        return _rss_bytes()

    def memory_reserved(self, device: Any = None) -> int:
        return _rss_bytes()

    def max_memory_allocated(self, device: Any = None) -> int:
        return _peak_rss_bytes()

    def max_memory_reserved(self, device: Any = None) -> int:
        return _peak_rss_bytes()

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    def get_device_name(self, device: Any = None) -> str:
        return "CPU"  # the key verl's flops table (utils/flops_counter.py) uses for torch.cpu

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)


def _rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


_DEVICE_MODULE = _CpuDeviceModule()


class PlatformCPU(PlatformBase):
    """verl platform for CPU-only hosts (tests, CI, laptops). Selected only by ``VERL_PLATFORM=cpu``."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # never auto-detected: a GPU host whose actor cannot see CUDA must not fall back to CPU

    def current_device(self) -> str:  # verl uses it as a torch device spec
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None  # CPU kernels are synchronous

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None  # "expandable_segments" etc. are CUDA caching-allocator settings

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"  # what Ray sets for the logical GPU slots; nothing reads it on CPU

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


def init_gloo_process_group() -> None:
    """Initialise ``torch.distributed`` with plain gloo from verl's worker env (RANK, WORLD_SIZE, MASTER_*).

    verl's ``initialize_global_process_group_ray`` asks for ``"cpu:gloo,<device>:<backend>"``, which on
    this platform is ``"cpu:gloo,cpu:gloo"`` and torch rejects ("Duplicate device type cpu"). It skips its
    own initialisation when a process group exists, so we create one first. No-op when one exists.

    A single rank rendezvous with itself through an in-memory store: torch's ``env://`` rendezvous starts a TCPStore
    server on MASTER_PORT, and torch 2.13 binds it on every interface whatever MASTER_ADDR says (measured with
    ``ss -ltnp``, libuv and classic backends alike): the one socket of a one-host run that would otherwise listen
    beyond loopback (docs/CLUSTER.md). Several ranks still rendezvous over TCP.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.HashStore() if world_size == 1 else None
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size, store=store)


# verl's worker classes that get a CPU variant: (our class name) -> (verl's module, verl's class name).
# ``separate_async`` puts ``DetachActorWorker`` in place of the actor worker (``_init_resource_pool_mgr``).
_GLOO_VARIANTS = {
    "CpuActorRolloutRefWorker": ("verl.workers.engine_workers", "ActorRolloutRefWorker"),
    "CpuDetachActorWorker": ("verl.experimental.separation.engine_workers", "DetachActorWorker"),
}
_built: dict[str, type] = {}


def _gloo_variant(name: str) -> type:
    """Build (once) ``name`` (:data:`_GLOO_VARIANTS`): verl's worker class with a gloo process group.

    Built lazily because this module is imported by every ``import verl`` (VERL_USE_EXTERNAL_MODULES) and
    importing verl's workers there would be slow and circular. Exposed as a module attribute (PEP 562), so
    Ray pickles it by reference and every worker process rebuilds the same class.
    """
    if name not in _built:
        import importlib

        module, base_name = _GLOO_VARIANTS[name]
        base = getattr(importlib.import_module(module), base_name)

        class GlooVariant(base):  # type: ignore[misc,valid-type]
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                init_gloo_process_group()

        GlooVariant.__doc__ = f"``{base_name}`` whose process group is created as plain gloo before verl's own."
        GlooVariant.__module__ = __name__
        GlooVariant.__name__ = GlooVariant.__qualname__ = name
        _built[name] = GlooVariant
    return _built[name]


def __getattr__(name: str) -> Any:
    if name in _GLOO_VARIANTS:
        return _gloo_variant(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register() -> None:
    """Register :class:`PlatformCPU` as verl platform "cpu" (idempotent; verl's decorator overwrites)."""
    if PlatformRegistry.get(PLATFORM_NAME) is not PlatformCPU:
        PlatformRegistry.register(platform=PLATFORM_NAME)(PlatformCPU)


def apply_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Put :data:`CPU_ENV` into ``environ`` (default ``os.environ``), keeping other external modules.

    Returns the resulting values, ready for a Ray ``runtime_env={"env_vars": ...}``.
    """
    env = os.environ if environ is None else environ
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m != __name__]
    values = dict(CPU_ENV, VERL_USE_EXTERNAL_MODULES=",".join([__name__, *modules]))
    env.update(values)
    return values


register()
