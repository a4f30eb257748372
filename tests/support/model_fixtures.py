"""pytest fixtures for the deterministic tiny test models (loaded by tests/conftest.py as a plugin).

Models are built once per machine under ``paths.tiny_models_dir()`` (``NGV_TINY_MODELS``) and reused; a
build takes a few seconds, so fixtures are session-scoped and build lazily, only for the families a test
asks for. Heavy imports (torch, transformers) happen inside the fixtures, never at plugin import time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def _build(family: str) -> Path:
    from nemo_gym_adapter.demo_models import build_tiny_model

    return build_tiny_model(family)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Callable[[str], Path]:
    """Factory: ``tiny_model_dir("qwen25" | "qwen3" | "llama3") -> Path`` (built on first use, then cached)."""
    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = _build(family)
        return built[family]

    return get


@pytest.fixture(scope="session")
def tiny_model_qwen25(tiny_model_dir) -> Path:
    """Qwen2.5-like tiny model: ChatML + hermes tools; stops at ``<|im_end|>`` or ``<|endoftext|>``."""
    return tiny_model_dir("qwen25")


@pytest.fixture(scope="session")
def tiny_model_qwen3(tiny_model_dir) -> Path:
    """Qwen3-like tiny model: qwen25 + ``<think>`` reasoning stripped before the last user query."""
    return tiny_model_dir("qwen3")


@pytest.fixture(scope="session")
def tiny_model_llama3(tiny_model_dir) -> Path:
    """Llama-3-like tiny model: turns end with ``<|eot_id|>`` while the tokenizer EOS is ``<|end_of_text|>``."""
    return tiny_model_dir("llama3")
