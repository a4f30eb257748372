"""scripts/setup.sh stops early with a message that says what to do (never a half-built environment)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _setup(**env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(REPO / "scripts" / "setup.sh")],
        env={**os.environ, **env},
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
    assert result.returncode != 0
    assert f"NGV_GYM_PYTHON={tmp_path / 'no-python'} does not run" in result.stderr
    assert "FAILED during: Gym venv" in result.stderr
