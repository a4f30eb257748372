"""The tree shows the architecture: every module sits in a room (a package) or is one of the few named flat ones,
imports point one way, and no two modules import each other, directly or round a loop -- lazy imports inside
functions and ``TYPE_CHECKING`` imports included.

The library, from the bottom: the flat face (``config``, ``errors``, ``moved``) < ``runtime``, ``console``, ``wire``
< ``access``, ``tokens``, ``data``, ``demo_models`` < ``gym``, ``vllm``, ``sglang`` (the two engines never import each
other) < ``rollouts`` < ``collect`` < the recipe. Inside ``recipe/nemo_gym/``: ``config`` < ``algorithms``, ``servers``,
``reporting``, ``cpu`` < ``managers`` < ``trainer`` < ``main``; ``config`` never imports verl. A module imports its own
package or lower ranks only.

Read from the source with ``ast`` (nothing is imported), so a violation is named with the importing file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIB = "nemo_gym_adapter"
RECIPE = "recipe.nemo_gym"

# The library's flat modules (its face) besides collect, the one command at the top.
FLAT = {"config", "errors", "moved"}
MAX_FLAT = 8  # modules directly in nemo_gym_adapter/ (besides __init__.py)
MAX_LINES = 400
RANK = {
    "flat": 0,
    "runtime": 1,
    "console": 1,
    "wire": 1,
    "access": 2,
    "tokens": 2,
    "data": 2,
    "demo_models": 2,
    "gym": 3,
    "vllm": 3,
    "sglang": 3,
    "rollouts": 4,
    "collect": 5,
    "recipe": 6,
}
# The recipe's rooms; "face" is recipe/__init__.py and recipe/nemo_gym/__init__.py (they import no room).
RECIPE_RANK = {
    "face": -1,
    "config": 0,
    "algorithms": 1,
    "servers": 1,
    "reporting": 1,
    "cpu": 1,
    "managers": 2,
    "trainer": 3,
    "main": 4,
}


def _modules() -> dict[str, Path]:
    mods = {}
    for root in (REPO / LIB, REPO / "recipe"):
        for path in root.rglob("*.py"):
            rel = path.relative_to(REPO).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            mods[".".join(parts)] = path
    return mods


def _part(module: str) -> str:
    """The layering part a dotted module name belongs to (the recipe is one part here; :func:`_room` inside it)."""
    if module.split(".")[0] == "recipe":
        return "recipe"
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in FLAT:
        return "flat"  # the package's own __init__, or a flat module
    if parts[1] in RANK:
        return parts[1]
    raise AssertionError(f"{module}: not in a package of the library and not flat: give it a home (and a line here)")


def _room(module: str) -> str:
    """The room of the recipe a dotted module name belongs to."""
    parts = module.split(".")
    if len(parts) <= 2:
        return "face"
    if parts[2] in RECIPE_RANK:
        return parts[2]
    raise AssertionError(f"{module}: not in a room of recipe/nemo_gym/: give it one (and a line here)")


def _imports(path: Path, module: str, known: set[str]) -> list[tuple[str, int]]:
    """(imported project module, line) for every import in the file, wherever it sits."""
    found = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.append((name, node.lineno))
    return found


def _graph() -> tuple[dict[str, Path], dict[str, list[tuple[str, int]]]]:
    mods = _modules()
    known = set(mods)
    return mods, {m: _imports(p, m, known) for m, p in mods.items()}


def _upward(graph: dict[str, list[tuple[str, int]]], where, rank) -> list[tuple[str, int, str]]:
    """(module, line, target) of every import whose target's part (``where``) does not rank below the importer's and
    is not its own package; an ancestor package's ``__init__`` is always allowed."""
    wrong = []
    for module, imports in graph.items():
        here = where(module)
        for target, line in imports:
            if module.startswith(f"{target}."):
                continue  # an ancestor package's own __init__
            there = where(target)
            if there != here and rank(there) >= rank(here):
                wrong.append((module, line, target))
    return wrong


def _library_upward(graph):
    return _upward(graph, _part, RANK.__getitem__)


def _recipe_upward(graph):
    recipe = {m: [(t, line) for t, line in imports if _part(t) == "recipe"] for m, imports in graph.items()}
    return _upward({m: i for m, i in recipe.items() if _part(m) == "recipe"}, _room, RECIPE_RANK.__getitem__)


def _explain(mods: dict[str, Path], wrong: list[tuple[str, int, str]], where) -> str:
    return "\n".join(f"{mods[m].relative_to(REPO)}:{line}: {where(m)} imports {t} ({where(t)})" for m, line, t in wrong)


def test_every_library_module_lives_in_a_package_or_is_named_flat():
    for module in _modules():
        _part(module)  # raises naming the homeless module


def test_every_recipe_module_lives_in_a_room():
    for module in _modules():
        if _part(module) == "recipe":
            _room(module)  # raises naming the homeless module


def test_the_library_keeps_few_modules_flat():
    flat = sorted(p.name for p in (REPO / LIB).glob("*.py") if p.name != "__init__.py")
    assert len(flat) <= MAX_FLAT, f"{len(flat)} modules flat in {LIB}/ (at most {MAX_FLAT}): {flat}"


def test_no_module_is_over_the_size_a_reader_takes_in():
    mods = _modules()
    long = {str(p.relative_to(REPO)): n for p in mods.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split along a noun, STYLE.md 1): {long}"


def test_library_imports_point_one_way():
    mods, graph = _graph()
    wrong = _library_upward(graph)
    assert not wrong, "imports against the library's layering:\n" + _explain(mods, wrong, _part)


def test_recipe_rooms_import_one_way():
    mods, graph = _graph()
    wrong = _recipe_upward(graph)
    assert not wrong, "imports against the recipe's rooms:\n" + _explain(mods, wrong, _room)


def _verl_imports(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        lines += [node.lineno for name in names if name.split(".")[0] == "verl"]
    return lines


def test_the_recipe_config_never_imports_verl():
    """A config error answers in about a second, before any heavy import: the config room reads YAML, not verl."""
    found = {
        str(p.relative_to(REPO)): lines
        for p in (REPO / "recipe" / "nemo_gym" / "config").rglob("*.py")
        if (lines := _verl_imports(p))
    }
    assert not found, f"recipe/nemo_gym/config/ imports verl (file: lines): {found}"


def test_no_import_cycles():
    mods, graph = _graph()
    edges = {
        m: sorted({t for t, _ in imports if not t.startswith(f"{m}.") and not m.startswith(f"{t}.")})
        for m, imports in graph.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in edges.get(m, ()):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t) :] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checks_see_what_they_check():
    """Controls: the graph is read from the real files (a layering test that finds no imports passes vacuously), the
    verl scan finds verl where it is imported, and each check refuses an import that points up."""
    _, graph = _graph()
    assert any(t == f"{LIB}.tokens.splice" for t, _ in graph[f"{LIB}.vllm.hooks"])
    assert any(t == f"{RECIPE}.managers.base" for t, _ in graph[f"{RECIPE}.managers.v1"])
    assert any(t == f"{RECIPE}.config.load" for t, _ in graph[f"{RECIPE}.trainer.task_runner"])
    assert sum(len(v) for v in graph.values()) > 150
    assert _verl_imports(REPO / "recipe" / "nemo_gym" / "managers" / "legacy.py")
    up = {f"{LIB}.runtime.procs": [(f"{LIB}.gym.head", 1)], f"{LIB}.wire.payloads": [(f"{LIB}.console.progress", 2)]}
    assert [(m, t) for m, _, t in _library_upward(up)] == [
        (f"{LIB}.runtime.procs", f"{LIB}.gym.head"),
        (f"{LIB}.wire.payloads", f"{LIB}.console.progress"),  # same rank, another package
    ]
    assert _library_upward({f"{LIB}.errors": [(f"{RECIPE}.config.load", 3)]})  # the library never imports the recipe
    up = {f"{RECIPE}.config.load": [(f"{RECIPE}.managers.base", 4)], f"{RECIPE}.managers.v1": [(f"{RECIPE}.main", 5)]}
    assert [m for m, _, _ in _recipe_upward(up)] == [f"{RECIPE}.config.load", f"{RECIPE}.managers.v1"]
    assert not _recipe_upward({f"{RECIPE}.trainer.task_runner": [(f"{RECIPE}.managers.legacy", 6)]})
    with pytest.raises(AssertionError, match="give it a home"):
        _part(f"{LIB}.loose_module")
    with pytest.raises(AssertionError, match="give it one"):
        _room(f"{RECIPE}.loose_module")


def test_the_engine_packages_share_the_token_math_and_never_each_other():
    """vLLM's and SGLang's hooks run the same splice (tokens.anchor), and neither package imports the other (same
    rank: the one-way check above refuses it; this names the intent)."""
    _, graph = _graph()
    for engine in ("vllm", "sglang"):
        assert any(t == f"{LIB}.tokens.anchor" for t, _ in graph[f"{LIB}.{engine}.hooks"]), engine
    crossing = [
        (m, t) for m, imports in graph.items() for t, _ in imports if {_part(m), _part(t)} == {"vllm", "sglang"}
    ]
    assert not crossing, crossing
