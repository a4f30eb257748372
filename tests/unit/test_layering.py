"""The tree shows the architecture: every module of the library sits in its component's package, imports point one
way (recipe -> rollouts -> gym / vllm / sglang -> access / data / tokens -> plumbing; the two engines' packages never import
each other) and no two modules import each other, directly or round a loop -- lazy imports inside functions and
``TYPE_CHECKING`` imports included.

Read from the source with ``ast`` (nothing is imported), so a violation is named with the importing file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LIB = "nemo_gym_adapter"

# Rank of each part: a module may import parts of a lower rank or its own package; plumbing imports no package.
PLUMBING = {
    "disk",
    "config",
    "recipe_config",
    "recipe_checks",
    "recipe_sampling",
    "console",
    "errors",
    "paths",
    "procs",
    "reaper",
    "loop_thread",
    "progress",
    "policy",
    "server_actors",
    "wire",
    "row_echo",
    "tool_calls",
}
RANK = {
    "plumbing": 0,
    "access": 1,
    "tokens": 1,
    "data": 1,
    "demo_models": 1,
    "gym": 2,
    "vllm": 2,
    "sglang": 2,
    "rollouts": 3,
    "collect": 4,
}
RECIPE_RANK = 5


def _modules() -> dict[str, Path]:
    mods = {}
    for root in (REPO / LIB, REPO / "recipe"):
        for path in root.rglob("*.py"):
            rel = path.relative_to(REPO).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            mods[".".join(parts)] = path
    return mods


def _part(module: str) -> str:
    """The layering part a dotted module name belongs to."""
    if module.startswith("recipe"):
        return "recipe"
    parts = module.split(".")
    if len(parts) == 1:
        return "plumbing"  # the package's own __init__
    if parts[1] in RANK:
        return parts[1]
    if parts[1] in PLUMBING:
        return "plumbing"
    raise AssertionError(f"{module}: not in a component package and not plumbing: give it a home (and a line here)")


def _rank(part: str) -> int:
    return RECIPE_RANK if part == "recipe" else RANK[part]


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


def test_every_library_module_lives_in_a_component_package_or_is_named_plumbing():
    for module in _modules():
        _part(module)  # raises naming the homeless module


def test_imports_point_one_way():
    mods, graph = _graph()
    wrong = []
    for module, imports in graph.items():
        here = _part(module)
        for target, line in imports:
            there = _part(target)
            if module.startswith(f"{target}.") or target.rpartition(".")[0] == module.rpartition(".")[0] == target:
                continue  # a package's own __init__
            if there == here and here != "plumbing":
                continue  # within one package
            if _rank(there) >= _rank(here) and not (here == "plumbing" and there == "plumbing"):
                wrong.append(f"{mods[module].relative_to(REPO)}:{line}: {here} imports {target} ({there})")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


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
    """A control: the graph is read from the real files (a layering test that finds no imports passes vacuously)."""
    _, graph = _graph()
    assert any(t == "nemo_gym_adapter.tokens.splice" for t, _ in graph["nemo_gym_adapter.vllm.hooks"])
    assert sum(len(v) for v in graph.values()) > 150


def test_the_engine_packages_share_the_token_math_and_never_each_other():
    """vLLM's and SGLang's hooks run the same splice (tokens.anchor), and neither package imports the other (same
    rank: the one-way check above refuses it; this names the intent)."""
    _, graph = _graph()
    for engine in ("vllm", "sglang"):
        assert any(t == "nemo_gym_adapter.tokens.anchor" for t, _ in graph[f"{LIB}.{engine}.hooks"]), engine
    crossing = [
        (m, t) for m, imports in graph.items() for t, _ in imports if {_part(m), _part(t)} == {"vllm", "sglang"}
    ]
    assert not crossing, crossing
