"""The repo's row generators (``scripts/make_*``) as their tests load them, and the check every committed row file
gets: the generator, run again, writes it byte for byte (so it is never hand-edited)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from nemo_gym_adapter.runtime import paths

DATA = paths.REPO_ROOT / "configs" / "data"


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as a module (scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, paths.REPO_ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_regenerated(script: ModuleType, out: Path, names: tuple[str, ...], committed: Path = DATA) -> None:
    """``script.main(["--out", out])`` writes each of ``names`` exactly as it is committed under ``committed``."""
    script.main(["--out", str(out)])
    for name in names:
        assert (out / name).read_bytes() == (committed / name).read_bytes(), name
