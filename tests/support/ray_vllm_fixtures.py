"""pytest fixtures: a Ray cluster and vLLM served from a Ray actor the way verl does (loaded by tests/conftest.py).

``ray_cluster`` (session): ``ray.init(num_cpus=4)`` unless Ray is already up (then it is left alone), shut down at
the end. ``ray_vllm`` (module, parametrizable by family): one actor serving a tiny model with tool parsing and
``--max-model-len 2048``, unpatched (tests apply the patch themselves via ``apply_patch_to_actors``), yielded as
``RayVllm`` (handle, ``host:port``, start time); stopped and killed at the end of the module or family.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.ray_vllm import CPU_VLLM_ARGS, RayVllm, start_vllm_actor, stop_vllm_actor

RAY_NUM_CPUS = 4  # INTEGRATION_NOTES §1: fewer starves CPU placement on 2-core machines
TEST_MAX_MODEL_LEN = 2048
START_TIMEOUT_S = float(os.environ.get("NGV_VLLM_START_TIMEOUT", "900"))
TOOL_PARSER = {"qwen25": "hermes", "qwen3": "hermes", "llama3": "llama3_json"}


def served_model_name(family: str) -> str:
    return f"tiny-{family}"


def vllm_args_for(family: str, *extra: str) -> list[str]:
    """CPU vLLM args for a tiny model family: tool parsing on, small context, deterministic seed."""
    return [
        *CPU_VLLM_ARGS,
        "--served-model-name",
        served_model_name(family),
        "--max-model-len",
        str(TEST_MAX_MODEL_LEN),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        TOOL_PARSER[family],
        "--seed",
        "0",
        *extra,
    ]


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local Ray cluster for the session (reused if the caller already started one)."""
    import ray

    if ray.is_initialized():
        yield
        return
    # vLLM's CPU KV-cache size in GiB would override --kv-cache-memory-bytes in the actors (inherited env).
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    # address="local": always our own cluster; a bare init() would attach to another test run's cluster on this host.
    ray.init(address="local", num_cpus=RAY_NUM_CPUS, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_vllm(request: pytest.FixtureRequest, ray_cluster, tiny_model_dir) -> Iterator[RayVllm]:
    """A tiny model served from a Ray actor named like verl's (``vllm_server_0_0_<family>``), unpatched.

    The family is ``request.param`` (``@pytest.mark.parametrize("ray_vllm", [...], indirect=True, scope="module")``),
    default ``qwen25``. pytest finishes every test of one family before starting the next, so one actor lives at a time.
    """
    family = getattr(request, "param", "qwen25")
    server = start_vllm_actor(
        str(tiny_model_dir(family)),
        vllm_args=vllm_args_for(family),
        name=f"vllm_server_0_0_{family}",
        timeout=START_TIMEOUT_S,
    )
    try:
        yield server
    finally:
        stop_vllm_actor(server)
