"""A Ray actor that serves vLLM's OpenAI app in-process, the way verl's ``vLLMHttpServer`` does (for tests).

verl 0.9.1 runs each rollout replica as a Ray actor (``vllm_server_{replica}_{node}``) that builds ``AsyncLLM`` from
CLI-style args, then vLLM's own ``build_app`` + ``init_app_state``, and serves it with uvicorn inside the actor's event
loop. The token-ID patch has to reach *that* process (``vllm_patch.apply_patch_to_actors``), so the integration tests
need an actor of the same shape. verl's own actor cannot be used on CPU without overriding its GPU defaults (``mp``
executor, cudagraph mode, memory utilisation, worker extension): this one keeps only the serving part.

CPU notes: ``VLLM_TARGET_DEVICE=cpu`` (the ``vllm`` alias dist-info hides the ``+cpu`` version vLLM's platform
detection looks for) and ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (engine core in the actor process, so killing the actor
leaves nothing behind) are set through the actor's runtime env by ``start_vllm_actor``.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym_adapter.errors import ServerError

# Environment of the actor process (set before it imports vLLM).
CPU_ACTOR_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# Fast, small vLLM start on CPU (see INTEGRATION_NOTES §3): ~15-20 s, ~1.6 GB.
CPU_VLLM_ARGS = (
    "--enforce-eager",
    "--distributed-executor-backend",
    "uni",
    "--kv-cache-memory-bytes",
    str(64 * 1024 * 1024),
    "--max-num-seqs",
    "8",
    "--dtype",
    "float32",
)


class VllmServerActor:
    """vLLM's OpenAI server inside a Ray actor. Wrap with ``ray.remote`` (``start_vllm_actor`` does)."""

    def __init__(self, model: str, vllm_args: Sequence[str] = (), host: str = "127.0.0.1") -> None:
        self.model = model
        self.vllm_args = list(vllm_args)
        self.host = host
        self.port: int | None = None
        self.engine: Any = None
        self._server: Any = None
        self._task: asyncio.Task | None = None

    async def start(self) -> str:
        """Build the engine and the app, start uvicorn on a port the OS picks; return ``"host:port"``."""
        import uvicorn
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        build_app, init_app_state = _app_factories()
        args = _parse_args(["--model", self.model, *self.vllm_args])
        usage = UsageContext.OPENAI_API_SERVER
        engine_args = AsyncEngineArgs.from_cli_args(args)
        vllm_config = engine_args.create_engine_config(usage_context=usage)
        self.engine = AsyncLLM.from_vllm_config(vllm_config=vllm_config, usage_context=usage)

        # Same signature probing as verl's run_server: the factories changed across vLLM versions.
        app_kwargs: dict[str, Any] = {}
        supported_tasks: tuple = ()
        params = inspect.signature(build_app).parameters
        if "supported_tasks" in params:
            supported_tasks = await self.engine.get_supported_tasks()
            app_kwargs["supported_tasks"] = supported_tasks
        if "model_config" in params:
            app_kwargs["model_config"] = self.engine.model_config
        app = build_app(args, **app_kwargs)
        state_params = inspect.signature(init_app_state).parameters
        if "vllm_config" in state_params:
            await init_app_state(self.engine, vllm_config, app.state, args)
        elif "supported_tasks" in state_params:
            await init_app_state(self.engine, app.state, args, supported_tasks)
        else:
            await init_app_state(self.engine, app.state, args)

        # Bind first (port 0: no race with other tests for a "free" port), then hand the socket to uvicorn.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        app.server_args = args
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                await self._task  # re-raise uvicorn's startup error
                raise ServerError(f"vLLM actor for {self.model}: uvicorn exited during startup")
            await asyncio.sleep(0.05)
        return self.address()

    def address(self) -> str:
        """``"host:port"``, the form verl's load balancer keys replicas by."""
        if self.port is None:
            raise ServerError(f"vLLM actor for {self.model} has not been started")
        return f"{self.host}:{self.port}"

    def pid(self) -> int:
        return os.getpid()

    async def stop(self) -> None:
        """Stop uvicorn and the engine (the caller then kills the actor)."""
        if self._server is not None:
            self._server.should_exit = True
            if self._task is not None:
                await asyncio.wait({self._task}, timeout=10)
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None


def _parse_args(argv: list[str]) -> Any:
    """vLLM's own OpenAI-server argument parser (moved between versions)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    except ImportError:  # vLLM < 0.25
        from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    return args


def _app_factories() -> tuple[Any, Any]:
    try:
        from vllm.entrypoints.launchers.api_server.app_state import init_app_state
        from vllm.entrypoints.launchers.app import build_app
    except ImportError:  # vLLM < 0.25: where verl imports them from
        from vllm.entrypoints.openai.api_server import build_app, init_app_state
    return build_app, init_app_state


@dataclass(frozen=True)
class RayVllm:
    """A started actor: its handle, ``"host:port"``, base URL, model path, seconds it took to start, Ray name."""

    handle: Any
    address: str
    model_path: str
    start_seconds: float
    name: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.address}"


def start_vllm_actor(
    model_path: str,
    *,
    vllm_args: Sequence[str] = CPU_VLLM_ARGS,
    name: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
) -> RayVllm:
    """Start a ``VllmServerActor`` (Ray must be initialised) and wait until it serves; kill it if start fails."""
    import ray

    actor_cls = ray.remote(VllmServerActor)
    options: dict[str, Any] = {"num_cpus": 1, "runtime_env": {"env_vars": {**CPU_ACTOR_ENV, **(env or {})}}}
    if name is not None:
        options["name"] = name
    handle = actor_cls.options(**options).remote(str(model_path), list(vllm_args))
    t0 = time.monotonic()
    try:
        address = ray.get(handle.start.remote(), timeout=timeout)
    except Exception as e:
        ray.kill(handle)
        raise ServerError(f"vLLM Ray actor {name or ''} for {model_path} did not start: {e}") from e
    return RayVllm(handle, address, str(model_path), time.monotonic() - t0, name)


def stop_vllm_actor(server: RayVllm, timeout: float = 30.0) -> None:
    """Stop the server gracefully (bounded: it also ends vLLM's engine-core child process), kill the actor, and
    wait until its name is free again (``ray.kill`` is asynchronous; a successor may want the same name)."""
    import ray

    try:
        ray.get(server.handle.stop.remote(), timeout=timeout)
    except Exception:  # the actor may already be dead; killing it below is what matters
        pass
    ray.kill(server.handle)
    deadline = time.monotonic() + timeout
    while server.name is not None and time.monotonic() < deadline:
        try:
            ray.get_actor(server.name)
        except ValueError:
            return
        time.sleep(0.2)
