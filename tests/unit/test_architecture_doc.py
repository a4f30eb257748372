"""docs/ARCHITECTURE.md stays true: every path it names exists, and every module of the library and of the recipe is
named in it (a new room gets its line in the map)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "ARCHITECTURE.md"
PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)*/(?:[\w.-]+\.(?:py|md|yaml))?)`")


def named_paths() -> list[str]:
    return PATH.findall(DOC.read_text(encoding="utf-8"))


def _verl_root() -> Path:
    spec = importlib.util.find_spec("verl")  # no import: only where it is installed
    assert spec is not None and spec.submodule_search_locations
    return Path(spec.submodule_search_locations[0]).parent


def test_every_named_path_exists():
    paths = named_paths()
    assert len(paths) > 30, paths  # the regex still finds the map
    missing = []
    for path in paths:
        root = _verl_root() if path.startswith("verl/") else REPO  # verl's own files: in the installed verl
        if not (root / path).exists():
            missing.append(path)
    assert not missing, f"docs/ARCHITECTURE.md names paths that do not exist: {missing}"


def test_every_module_has_its_place_in_the_map():
    named = set(named_paths())
    modules = [*REPO.glob("nemo_gym_adapter/**/*.py"), *REPO.glob("recipe/nemo_gym/**/*.py")]
    unnamed = [str(m.relative_to(REPO)) for m in modules if m.name != "__init__.py"]
    unnamed = [m for m in unnamed if m not in named]
    assert not unnamed, f"modules missing from docs/ARCHITECTURE.md: {unnamed}"
