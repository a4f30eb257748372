"""Where the project's environments, caches and logs live.

Defaults are relative to the checkout (what ``scripts/setup.sh`` builds); each can be moved with an
environment variable, so an installed (non-editable) package or a cluster can point elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]  # nemo_gym_adapter/runtime/paths.py


def _env_path(var: str, default: Path) -> Path:
    value = os.environ.get(var)
    return Path(value).expanduser().resolve() if value else default


def cache_dir() -> Path:
    """Git-ignored cache: tiny models, Gym server venv links, downloads (``NGV_CACHE_DIR``)."""
    return _env_path("NGV_CACHE_DIR", REPO_ROOT / ".cache")


def gym_venv() -> Path:
    """The NeMo Gym venv (Python >=3.13 where available) built by setup (``NGV_GYM_VENV``)."""
    return _env_path("NGV_GYM_VENV", REPO_ROOT / ".gym-venv")


def gym_server_venvs_dir() -> Path:
    """Gym's ``uv_venv_dir``: ``<dir>/<server type>/<impl>/.venv`` links to ready venvs (``NGV_GYM_SERVER_VENVS``)."""
    return _env_path("NGV_GYM_SERVER_VENVS", cache_dir() / "gym-server-venvs")


def tiny_models_dir() -> Path:
    """Where deterministic tiny test models are built on demand (``NGV_TINY_MODELS``)."""
    return _env_path("NGV_TINY_MODELS", cache_dir() / "tiny-models")


def converted_models_dir() -> Path:
    """Where real pretrained demo models are converted on first use (``NGV_CONVERTED_MODELS``; SmolLM2, ~540 MB)."""
    return _env_path("NGV_CONVERTED_MODELS", cache_dir() / "converted-models")


def logs_dir() -> Path:
    """Per-server log files (``NGV_LOG_DIR``)."""
    return _env_path("NGV_LOG_DIR", REPO_ROOT / "logs")


def node_state_dir() -> Path:
    """Node-local state of running trainers (``NGV_STATE_DIR``; default ``$XDG_RUNTIME_DIR/ngv``, else
    ``/tmp/ngv-<uid>``): what the next launch on this node sweeps if a trainer died outright (``reaper``)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    default = Path(runtime) / "ngv" if runtime else Path("/tmp") / f"ngv-{os.getuid()}"
    return _env_path("NGV_STATE_DIR", default)
