"""Per-server venvs for NeMo Gym's servers, the way Gym intends as far as a machine without ``uv`` allows.

Gym 0.7 runs every server implementation (``<type>/<impl>``) from its own venv, ``<uv_venv_dir>/<type>/<impl>/.venv``
(``nemo_gym/cli/setup_command.py`` ``get_venv_path``), built with ``uv`` and holding Gym itself plus the server's
requirements; with ``skip_venv_if_present: true`` a directory there with ``bin/python`` and ``bin/activate`` is used
as it is. Building Gym's way needs ``uv`` and a Python >= 3.13.14 it can install Gym into (``scripts/setup.sh`` has a
documented fallback for older ones), and a full venv per server costs ~1.5 GB and minutes. So, per server:

* **share** when installing its requirements changes nothing another server uses: :func:`dry_run` (``pip install
  --dry-run --report``, with Gym's head pins ``ray``/``openai`` as constraints like Gym's ``head_server_deps``) lists
  what a real install would put in; a package already installed at another version is a *change*. Requirements
  already met by the Gym venv: its ``.venv`` links to the Gym venv. New packages only: they go, for every sharing
  server at once (one resolution, so two sharing servers cannot pin a new package differently), into one *shared
  overlay* (``<uv_venv_dir>/_shared/.venv``), never into the Gym venv itself;
* **own** otherwise: an *overlay venv* at Gym's own path, a real venv (Gym's interpreter, ``bin/activate``) whose
  site-packages holds only the server's delta and a ``.pth`` naming the Gym venv's site-packages after it, so the
  server sees its own pins first and Gym's packages below (MBs and seconds, not a 1.5 GB copy);
* **check**: every third-party module the server's code imports (its entrypoints and the local modules they import,
  read with ``ast``; guarded ``try: import`` left out) must be found in the venv it will run from
  (:func:`missing_modules`, no import executed): a requirement can install and still provide no module (Gym 0.7's
  ``code_fim``: ``human-eval-infilling`` on PyPI is an empty package).

:func:`base_fingerprint` (the Gym venv's installed distributions) keys what was built, so nothing is decided or built
twice. Never imports ``nemo_gym``; runs pip through the Gym venv's own interpreter.
:mod:`~nemo_gym_adapter.gym.venv_prep` prepares the servers with these (``scripts/prepare_gym_venvs.py`` at set-up,
and any other server on first use, before a launch).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HEAD_PINS = ("ray", "openai")  # Gym pins these to the parent's versions in every server venv (head_server_deps)
GYM_PACKAGES = {"nemo_gym", "resources_servers", "responses_api_agents", "responses_api_models", "environment_servers"}
OVERLAY_PTH = "_ngv_base.pth"


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"{venv} has no lib/python3*/site-packages")
    return found[0]


def read_requirements(server_dir: Path) -> list[str]:
    """A server's third-party requirements (``requirements.txt``, else ``pyproject.toml``'s dependencies), without
    the ``nemo-gym`` self-reference and pip options. A comment starts a line or follows a blank, so ``#egg=`` and
    ``#subdirectory=`` inside a URL requirement stay."""
    req_txt, pyproject = server_dir / "requirements.txt", server_dir / "pyproject.toml"
    if req_txt.exists():
        lines = [re.split(r"(?:^|\s)#", raw, maxsplit=1)[0].strip() for raw in req_txt.read_text().splitlines()]
    elif pyproject.exists():
        import tomllib

        lines = list(tomllib.loads(pyproject.read_text()).get("project", {}).get("dependencies", []))
    else:
        raise FileNotFoundError(f"{server_dir} has neither requirements.txt nor pyproject.toml (not a Gym server)")
    return [
        line
        for line in lines
        if line and not line.startswith("-") and "../.." not in line and not canonical(line).startswith("nemo-gym")
    ]


def git_sources(server_dir: Path) -> dict[str, str]:
    """``[tool.uv.sources]`` entries of a ``pyproject.toml`` server: packages Gym's uv would take from elsewhere."""
    pyproject = server_dir / "pyproject.toml"
    if not pyproject.exists():
        return {}
    import tomllib

    sources = tomllib.loads(pyproject.read_text()).get("tool", {}).get("uv", {}).get("sources", {})
    return {canonical(k): str(v.get("git") or v.get("url") or v) for k, v in sources.items() if isinstance(v, dict)}


def installed(python: Path) -> dict[str, str]:
    """``{canonical name: version}`` of every distribution ``python`` sees (an overlay: its own, then Gym's)."""
    code = (
        "import json, re, importlib.metadata as m\nout = {}\n"
        "for d in m.distributions():\n    out.setdefault(re.sub(r'[-_.]+', '-', d.metadata['Name']).lower(), d.version)\n"
        "print(json.dumps(out))"
    )
    return json.loads(subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout)


def base_fingerprint(venv: Path) -> str:
    """What the Gym venv has installed, as the names of its ``*.dist-info`` directories (they carry the versions):
    a cheap, exact key for decisions and overlays built on top of it."""
    names = sorted(p.name for p in site_packages(venv).glob("*.dist-info"))
    return hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class DryRun:
    """What ``pip install --dry-run`` would install (``{canonical name: version}``), or why it cannot resolve."""

    install: dict[str, str]
    error: str = ""

    def changes(self, have: dict[str, str]) -> list[str]:
        """``name old -> new`` for every package it would install at another version than ``have``."""
        return [f"{n} {have[n]} -> {v}" for n, v in sorted(self.install.items()) if n in have and have[n] != v]


def constraint_lines(have: dict[str, str]) -> list[str]:
    """Gym's head pins: ``ray`` and ``openai`` at the versions the Gym venv has."""
    return [f"{n}=={have[n]}" for n in HEAD_PINS if n in have]


def dry_run(pip_python: Path, target: Path, reqs: list[str], constraints: list[str]) -> DryRun:
    """pip's resolution of ``reqs`` for the interpreter ``target`` (``constraints``: pins and overrides files'
    lines), installing nothing. ``pip_python``: an interpreter with pip (the Gym venv's; an overlay has none)."""
    with tempfile.TemporaryDirectory(prefix="ngv-pip-") as tmp:
        req, cons, report = Path(tmp) / "req.txt", Path(tmp) / "cons.txt", Path(tmp) / "report.json"
        req.write_text("\n".join(reqs) + "\n")
        cons.write_text("\n".join(constraints) + "\n")
        cmd = [*_pip(pip_python, target), "install", "--dry-run", "--quiet", "--report", str(report)]
        proc = subprocess.run([*cmd, "-r", str(req), "-c", str(cons)], capture_output=True, text=True)
        if proc.returncode != 0:
            lines = [x for x in (proc.stderr or proc.stdout).strip().splitlines() if x.strip()]
            return DryRun({}, " | ".join(lines[-4:]) or f"pip exited {proc.returncode}")
        items = json.loads(report.read_text()).get("install", [])
    return DryRun({canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in items})


def pip_install(pip_python: Path, target: Path, reqs: list[str], constraints: list[str]) -> None:
    """Install ``reqs`` for ``target`` (raises ``subprocess.CalledProcessError``, pip's output on stderr)."""
    with tempfile.TemporaryDirectory(prefix="ngv-pip-") as tmp:
        req, cons = Path(tmp) / "req.txt", Path(tmp) / "cons.txt"
        req.write_text("\n".join(reqs) + "\n")
        cons.write_text("\n".join(constraints) + "\n")
        subprocess.run([*_pip(pip_python, target), "install", "--quiet", "-r", str(req), "-c", str(cons)], check=True)


def _pip(pip_python: Path, target: Path) -> list[str]:
    base = [str(pip_python), "-m", "pip", "--disable-pip-version-check"]
    return (
        base if Path(os.path.abspath(target)) == Path(os.path.abspath(pip_python)) else [*base, "--python", str(target)]
    )


def make_overlay(venv: Path, base: Path) -> None:
    """A venv at ``venv`` (Gym's layout: ``bin/python``, ``bin/activate``) with ``base``'s interpreter, whose
    imports fall through to ``base``'s site-packages after its own (``site`` appends ``.pth`` lines after the
    directory itself). Replaces whatever is there."""
    if venv.is_symlink() or venv.is_file():
        venv.unlink()
    elif venv.exists():
        shutil.rmtree(venv)
    interpreter = os.path.realpath(venv_python(base))
    subprocess.run([interpreter, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    (site_packages(venv) / OVERLAY_PTH).write_text(f"{site_packages(base)}\n")


# Run inside a venv: which requirement strings are not met there (json in, json out).
_CHECK_SNIPPET = r"""
import json, sys
from importlib.metadata import PackageNotFoundError, version
try:
    from packaging.requirements import Requirement
except ImportError:  # a venv without packaging still has pip's copy
    from pip._vendor.packaging.requirements import Requirement
missing = []
for line in json.load(sys.stdin):
    try:
        req = Requirement(line)
        have = version(req.name)
    except Exception:
        missing.append(line)
        continue
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        missing.append(line)
print(json.dumps(missing))
"""


def unmet(python: Path, reqs: list[str]) -> list[str]:
    """The requirement lines ``python``'s environment does not meet."""
    proc = subprocess.run(
        [str(python), "-c", _CHECK_SNIPPET], input=json.dumps(reqs), capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout)


def server_key(reqs: list[str], overrides: list[str]) -> str:
    return hashlib.sha256(json.dumps([reqs, overrides]).encode()).hexdigest()[:16]


def link_venv(link: Path, target: Path, dry_run: bool) -> str:
    """Point ``link`` at ``target`` (replacing an overlay we built there); return what was done."""
    if link.is_symlink():
        if Path(os.readlink(link)) == target:
            return "ok"
        if not dry_run:
            link.unlink()
            link.symlink_to(target, target_is_directory=True)
        return "relinked"
    if link.exists():
        if not (link / "lib").exists() or not list(link.glob(f"lib/python3*/site-packages/{OVERLAY_PTH}")):
            return "kept (a venv someone else built is there; remove it to use ours)"
        if not dry_run:
            shutil.rmtree(link)
    if not dry_run:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
    return "linked"


# ------------------------------------------------------------------------------------------------ import check


def imported_modules(server_dir: Path, entrypoints: list[str]) -> set[str]:
    """Top-level third-party modules the server's code imports: its entrypoints and, transitively, the local modules
    they import (never tests or scripts beside them). Left out: the standard library, the server's own modules,
    Gym's packages, and imports inside a ``try`` that handles ``ImportError`` (optional by design).

    A server's own modules include those it ships in a folder of its own and puts on ``sys.path`` itself (Gym 0.7's
    ``iheval`` imports its vendored ``ifeval/instructions_registry.py`` as ``instructions_registry`` after a
    ``sys.path`` shim): when the server's code touches ``sys.path``, a bare import that names a module shipped
    anywhere in its folder is that module, and its own imports are checked in turn."""
    local = {p.stem for p in server_dir.glob("*.py")} | {p.name for p in server_dir.iterdir() if p.is_dir()}
    vendored = _vendored_modules(server_dir)
    pkg = f"{server_dir.parent.name}.{server_dir.name}"
    todo = [server_dir / e for e in entrypoints if (server_dir / e).is_file()]
    seen: set[Path] = set()
    found: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except SyntaxError:
            continue
        for node, optional in _imports(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level:
                names = [f"{node.module}.{a.name}" if node.module else a.name for a in node.names]
                todo += _local_files(server_dir, names)
                continue
            for name in names:
                top = name.split(".")[0]
                if name.startswith(pkg):
                    rest = name[len(pkg) :].lstrip(".")
                    todo += _local_files(server_dir, [rest] + [f"{rest}.{a.name}" for a in getattr(node, "names", [])])
                elif top in local:
                    todo += _local_files(server_dir, [name])
                elif top in vendored:
                    todo.append(vendored[top])
                elif top and not optional and top not in sys.stdlib_module_names and top not in GYM_PACKAGES:
                    found.add(top)
    found.discard("__future__")
    return found


def _vendored_modules(server_dir: Path) -> dict[str, Path]:
    """Module name -> file of every module shipped in a sub-folder of the server (packages by their
    ``__init__.py``; tests left out), when the server's code puts folders on ``sys.path`` itself; else ``{}``."""
    sources = [p for p in server_dir.rglob("*.py") if "tests" not in p.relative_to(server_dir).parts]
    if not any("sys.path" in p.read_text(errors="replace") for p in sources):
        return {}
    found: dict[str, Path] = {}
    for path in sorted(sources, key=lambda p: len(p.parts)):  # the shallowest wins a name shipped twice
        if path.parent == server_dir:
            continue  # the server's own top-level modules: `local` already
        name = path.parent.name if path.name == "__init__.py" else path.stem
        found.setdefault(name, path)
    return found


def _imports(node: ast.AST, optional: bool = False) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement in ``node`` with whether it sits in a ``try`` that handles ``ImportError``."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [(node, optional)]
    if isinstance(node, ast.Try):
        guarded = optional or any(_handles_import_error(h) for h in node.handlers)
        rest: list[ast.AST] = [*node.handlers, *node.orelse, *node.finalbody]
        return [x for c in node.body for x in _imports(c, guarded)] + [x for c in rest for x in _imports(c, optional)]
    return [x for child in ast.iter_child_nodes(node) for x in _imports(child, optional)]


def _handles_import_error(handler: ast.ExceptHandler) -> bool:
    names = {n.id for n in ast.walk(handler.type) if isinstance(n, ast.Name)} if handler.type else {"Exception"}
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def _local_files(server_dir: Path, dotted: list[str]) -> list[Path]:
    out = []
    for name in filter(None, dotted):
        rel = Path(*name.split("."))
        for candidate in (server_dir / rel.with_suffix(".py"), server_dir / rel / "__init__.py"):
            if candidate.is_file() and "tests" not in candidate.relative_to(server_dir).parts:
                out.append(candidate)
    return out


_FIND = """
import importlib.metadata as m, importlib.util, json, sys
mods, names = json.loads(sys.argv[1]), json.loads(sys.argv[2])
versions = {}
for n in names:
    try:
        versions[n] = m.version(n)
    except m.PackageNotFoundError:
        versions[n] = None
print(json.dumps({"missing": [x for x in mods if importlib.util.find_spec(x) is None], "versions": versions}))
"""


def find_modules(python: Path, modules: set[str], names: set[str]) -> tuple[set[str], dict[str, str | None]]:
    """Which of ``modules`` ``python`` cannot find (nothing is imported), and the installed version of each
    distribution in ``names`` (None: not installed). One interpreter start for any number of servers."""
    proc = subprocess.run(
        [str(python), "-c", _FIND, json.dumps(sorted(modules)), json.dumps(sorted(names))],
        capture_output=True,
        text=True,
        check=True,
    )
    answer = json.loads(proc.stdout)
    return set(answer["missing"]), answer["versions"]


def requirement_names(reqs: list[str]) -> set[str]:
    """The canonical distribution names of requirement lines."""
    return {canonical(re.split(r"[\s<>=!~;\[@]", r, maxsplit=1)[0]) for r in reqs}


def module_problems(
    missing: set[str], versions: dict[str, str | None], reqs: list[str], sources: dict[str, str]
) -> list[str]:
    """One line per missing module, naming the requirement that should have provided it: installed but empty, not
    installed, or taken by Gym's ``uv`` from a source PyPI's package is not (``sources``: :func:`git_sources`)."""
    names = requirement_names(reqs)
    problems = []
    for module in sorted(missing):
        req = canonical(module) if canonical(module) in names else None
        if req is None:
            problems.append(f"module {module!r} is imported but not installed, and no requirement names it")
            continue
        version = versions.get(req)
        what = f"requirement {req} is installed ({version}) but provides no module {module!r}" if version else (
            f"requirement {req} is not installed"
        )  # fmt: skip
        if req in sources:
            what += f"; Gym's uv would take it from {sources[req]} (tool.uv.sources), which PyPI's {req} is not"
        problems.append(what)
    return problems
