"""Count the test suite's assertions statically, per tier: the check that no assertion was lost when tests move
between tiers or are merged (issue 28: "no test deleted without its assertion moving to a test that still runs").

An assertion is an ``assert`` statement or a ``pytest.raises`` / ``pytest.warns`` (call or ``with``); nothing is
imported or run, so the count is the same on any machine. Tiers, as pytest selects them:

- ``unit`` / ``integration`` / ``e2e``: by marker (``pytestmark`` or a decorator), else by folder (``tests/unit``,
  ``tests/integration``, ``tests/e2e``);
- ``slow``: a test (or its module) marked ``slow``: it leaves the default run (``bash scripts/test.sh``) for
  ``bash scripts/test.sh --slow``; a parametrized test with only some cases marked slow counts in its own tier;
- ``helpers``: modules that are not test modules (``tests/support/``, conftests, the cases the vLLM 0.24 and SGLang
  venvs run): their assertions run inside the tests that call them.

    python scripts/count_assertions.py                 # this checkout
    python scripts/count_assertions.py --rev main      # a commit of this repository (read with git, no checkout)
    python scripts/count_assertions.py --files         # per file too
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIERS = ("unit", "integration", "e2e", "slow", "helpers")


def _marks(decorators: list[ast.expr]) -> set[str]:
    """``pytest.mark.<name>`` names in decorators (and in a ``pytestmark`` value), including list items."""
    names = set()
    for node in decorators:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark":
                names.add(sub.attr)
    return names


def _is_assertion(node: ast.AST) -> bool:
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, ast.Call):
        f = node.func
        return isinstance(f, ast.Attribute) and f.attr in ("raises", "warns") and getattr(f.value, "id", "") == "pytest"
    return False


def _count(node: ast.AST) -> int:
    return sum(1 for sub in ast.walk(node) if _is_assertion(sub))


def _folder_tier(path: str) -> str | None:
    for tier in ("unit", "integration", "e2e"):
        if path.startswith(f"tests/{tier}/"):
            return tier
    return None


def count_file(path: str, source: str) -> tuple[Counter[str], Counter[str]]:
    """(assertions per tier, test functions per tier) of one file."""
    asserts: Counter[str] = Counter()
    tests: Counter[str] = Counter()
    tree = ast.parse(source)
    name = path.rsplit("/", 1)[-1]
    is_test_module = name.startswith("test_") and _folder_tier(path) is not None
    if not is_test_module:
        asserts["helpers"] += _count(tree)
        return asserts, tests
    module_marks: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets):
            module_marks |= _marks([node.value])
    base = next((t for t in ("e2e", "integration") if t in module_marks), None) or _folder_tier(path) or "unit"

    def tier_of(decorators: list[ast.expr], inherited: set[str]) -> str:
        marks = inherited | _marks(decorators)
        if "slow" in marks and not _only_some_params_slow(decorators):
            return "slow"
        return next((t for t in ("e2e", "integration") if t in marks), base)

    def visit(body: list[ast.stmt], inherited: set[str]) -> int:
        """Counts test functions' assertions; returns the assertions outside any test (module-level helpers)."""
        rest = 0
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test"):
                tier = tier_of(node.decorator_list, inherited)
                asserts[tier] += _count(node)
                tests[tier] += 1
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                rest += visit(node.body, inherited | _marks(node.decorator_list))
            else:
                rest += _count(node)
        return rest

    outside_tests = visit(tree.body, module_marks)  # first: it fills asserts too
    asserts["slow" if "slow" in module_marks else base] += outside_tests
    return asserts, tests


def _only_some_params_slow(decorators: list[ast.expr]) -> bool:
    """``@pytest.mark.parametrize(..., [pytest.param(..., marks=[pytest.mark.slow]), ...])``: the other cases run."""
    for node in decorators:
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "parametrize":
            return any(isinstance(sub, ast.Call) and getattr(sub.func, "attr", "") == "param" for sub in ast.walk(node))
    return False


def _sources(rev: str | None) -> dict[str, str]:
    if rev is None:
        return {str(p.relative_to(REPO)): p.read_text(encoding="utf-8") for p in sorted(REPO.glob("tests/**/*.py"))}
    names = subprocess.run(
        ["git", "-C", str(REPO), "ls-tree", "-r", "--name-only", rev, "tests/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return {
        n: subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:{n}"], check=True, capture_output=True, text=True
        ).stdout
        for n in names
        if n.endswith(".py")
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", help="a git revision to count instead of the working tree")
    parser.add_argument("--files", action="store_true", help="per file too")
    args = parser.parse_args(argv)
    total_a: Counter[str] = Counter()
    total_t: Counter[str] = Counter()
    for path, source in _sources(args.rev).items():
        a, t = count_file(path, source)
        total_a.update(a)
        total_t.update(t)
        if args.files and sum(a.values()):
            print(f"  {path}: " + ", ".join(f"{k} {v}" for k, v in sorted(a.items())))
    print(f"{'tier':<12} {'test functions':>15} {'assertions':>11}")
    for tier in TIERS:
        print(f"{tier:<12} {total_t[tier]:>15} {total_a[tier]:>11}")
    print(f"{'total':<12} {sum(total_t.values()):>15} {sum(total_a.values()):>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
