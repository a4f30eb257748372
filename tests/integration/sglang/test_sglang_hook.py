"""The SGLang token-ID patch executed against SGLang 0.5.12's real serving code (verl 0.9.1's pin), on CPU.

SGLang cannot live in the trainer venv (its wheel pins torch 2.11 and transformers 5.6, its kernels are CUDA builds),
so its cases (``tests/sglang/hook_cases.py``, ``abort_cases.py``, ``ray_cases.py``; shared fixtures in
``tests/sglang/cases.py``) run in ``.cache/sglang-venv``, built by ``scripts/setup_sglang.sh`` (layered on the trainer
venv; ``scripts/setup_tests.sh`` calls it). This test runs them there in one pytest process and fails when any fails,
or when fewer ran than are written (a collection that silently shrinks). ``NGV_SKIP_SGLANG=1`` skips it where that
venv was deliberately not built.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.sglang.cases import FAMILIES  # importable here: it imports SGLang only inside its fixtures
from tests.support.hostile_ids import HOSTILE_IDS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
CASES = [REPO / "tests" / "sglang" / f"{name}_cases.py" for name in ("hook", "abort", "ray")]


def _venv_python() -> Path:
    from nemo_gym_adapter.runtime.paths import cache_dir

    return cache_dir() / "sglang-venv" / "bin" / "python"


def _expected_count() -> int:
    """Test cases written in the case files: test functions times their parametrize lengths (literal lists, or a
    list named here)."""
    lengths = {"FAMILIES": len(FAMILIES), "HOSTILE_IDS": len(HOSTILE_IDS)}
    total = 0
    for path in CASES:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                n = 1
                for deco in node.decorator_list:
                    if isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize":
                        values = deco.args[1]
                        n *= lengths[values.id] if isinstance(values, ast.Name) else len(values.elts)
                total += n
    return total


def test_sglang_cases_pass_against_real_sglang_0_5_12(tiny_model_dir, record_property):
    if os.environ.get("NGV_SKIP_SGLANG") == "1":
        pytest.skip("NGV_SKIP_SGLANG=1: the SGLang test venv is not built here")
    python = _venv_python()
    if not python.exists():
        pytest.fail(f"{python} missing: run scripts/setup_tests.sh (it builds the SGLang test venv)", pytrace=False)
    models = {tiny_model_dir(f).parent for f in FAMILIES}
    assert len(models) == 1, models
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "NGV_TINY_MODELS": str(models.pop()),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [str(python), "-m", "pytest", *map(str, CASES), "-p", "tests.sglang.cases", "-q", "--noconftest"]
    cmd += ["-p", "no:cacheprovider", "-rfE", "-W", "ignore::DeprecationWarning", "-W", "ignore::UserWarning"]
    t0 = time.monotonic()
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    record_property("sglang_cases_s", round(time.monotonic() - t0, 1))
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"SGLang cases failed ({' '.join(cmd)}):\n{output[-12000:]}"
    passed = re.search(r"(\d+) passed", result.stdout)
    expected = _expected_count()
    assert passed and int(passed.group(1)) == expected, f"expected {expected} passed:\n{output[-4000:]}"
    assert not re.search(r"\d+ (skipped|xfailed|deselected)", result.stdout), output[-4000:]
