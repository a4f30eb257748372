"""scripts/setup.sh stops early with a message that says what to do (never a half-built environment)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _setup(**env: str) -> subprocess.CompletedProcess[str]:
    # Never install: the venv may be shared (git worktrees link it), and a checkout with other pins would re-point it.
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh")],
        env={**os.environ, "NGV_SETUP_NO_INSTALL": "1", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_missing_trainer_python_names_it_and_the_fix():
    result = _setup(NGV_TRAINER_PYTHON="python3.99-not-here")
    assert result.returncode != 0
    assert "no python3.99-not-here found" in result.stderr
    assert "set NGV_TRAINER_PYTHON" in result.stderr
    assert "FAILED during: trainer venv" in result.stderr


def test_unusable_gym_python_names_it_and_the_fix(tmp_path):
    # The trainer venv must already be set up for the script to reach the Gym step (it is, wherever tests run).
    result = _setup(NGV_GYM_PYTHON=str(tmp_path / "no-python"))
    if "NGV_SETUP_NO_INSTALL is set" in result.stderr:
        pytest.skip("the trainer venv is set up for other pins than this checkout's (run scripts/setup.sh)")
    assert result.returncode != 0
    assert f"NGV_GYM_PYTHON={tmp_path / 'no-python'} does not run" in result.stderr
    assert "FAILED during: Gym venv" in result.stderr


def test_sglang_test_venv_check_says_what_to_run(tmp_path):
    """scripts/setup_sglang.sh (called by setup_tests.sh) with nothing built and installs forbidden: it names the fix."""
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "setup_sglang.sh")],
        env={**os.environ, "NGV_SETUP_NO_INSTALL": "1", "NGV_CACHE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "the trainer venv" in result.stderr and "is not set up" in result.stderr:
        pytest.skip("no trainer venv here")
    assert result.returncode != 0
    assert f"the SGLang 0.5.12 test venv ({tmp_path}/sglang-venv) is not set up" in result.stderr
    assert "run scripts/setup_tests.sh" in result.stderr
