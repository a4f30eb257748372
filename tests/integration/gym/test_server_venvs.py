"""scripts/prepare_gym_venvs.py with real pip and real venvs, offline: a Gym-shaped venv (Gym's own interpreter) and
local wheels. A server whose requirement would change an installed package gets its own overlay venv and sees its
pin first; one that only adds packages shares the overlay of additions; an installed requirement that provides no
module (Gym 0.7's code_fim) is named and fails the run; the Gym venv itself is never modified; a second run decides
and builds nothing."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from nemo_gym_adapter.errors import SetupError
from nemo_gym_adapter.gym import server_venvs as sv
from nemo_gym_adapter.gym import venv_prep
from nemo_gym_adapter.runtime import paths

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[3]


def _wheel(out: Path, dist: str, version: str, module: str | None) -> None:
    """A pure-Python wheel written by hand: ``module/__init__.py`` (``__version__``) unless ``module`` is None."""
    stem = f"{dist.replace('-', '_')}-{version}"
    files = {
        f"{stem}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
        f"{stem}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    if module:
        files[f"{module}/__init__.py"] = f"__version__ = {version!r}\n"
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{stem}.dist-info/RECORD"] = "\n".join([*record, f"{stem}.dist-info/RECORD,,"]) + "\n"
    with zipfile.ZipFile(out / f"{stem}-py3-none-any.whl", "w") as z:
        for name, text in files.items():
            z.writestr(name, text)


def _server(root: Path, name: str, reqs: list[str], imports: list[str]) -> None:
    d = root / "resources_servers" / name
    d.mkdir(parents=True)
    (d / "requirements.txt").write_text("-e nemo-gym[dev] @ ../../\n" + "".join(f"{r}\n" for r in reqs))
    (d / "app.py").write_text("".join(f"import {m}\n" for m in imports))


@pytest.fixture
def gym_like(tmp_path, monkeypatch):
    """(Gym-shaped venv with ngvtest-common 1.0 installed, its package root); pip reads only the local wheels."""
    gym_python = next(paths.gym_venv().glob("bin/python"), None)
    if gym_python is None:
        pytest.skip("needs the Gym venv's interpreter (scripts/setup.sh)")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for dist, version, module in [
        ("ngvtest-common", "1.0", "ngvtest_common"),
        ("ngvtest-common", "2.0", "ngvtest_common"),
        ("ngvtest-new", "1.0", "ngvtest_new"),
        ("ngvtest-empty", "1.0", None),  # like human-eval-infilling 2.15.0 on PyPI
    ]:
        _wheel(wheels, dist, version, module)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    base = tmp_path / "gym-venv"
    subprocess.run([os.path.realpath(gym_python), "-m", "venv", str(base)], check=True)
    subprocess.run([str(base / "bin/python"), "-m", "pip", "install", "-q", "ngvtest-common==1.0"], check=True)
    root = sv.site_packages(base)
    (root / "nemo_gym").mkdir()
    _server(root, "pins_old", ["ngvtest-common==2.0"], ["ngvtest_common"])
    _server(root, "adds_new", ["ngvtest-new"], ["ngvtest_new", "ngvtest_common"])
    _server(root, "empty_dep", ["ngvtest-empty"], ["ngvtest_empty"])
    _server(root, "plain", [], ["json"])
    return base, root


def _prepare(base: Path, venvs: Path, report: Path) -> tuple[int, str]:
    servers = [f"--server=resources_servers/{s}" for s in ("pins_old", "adds_new", "empty_dep", "plain")]
    cmd = [sys.executable, str(REPO / "scripts/prepare_gym_venvs.py"), "--no-defaults", *servers]
    cmd += ["--gym-venv", str(base), "--venvs-dir", str(venvs), "--report", str(report)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def _version(venv: Path, module: str) -> str:
    code = f"import {module}; print({module}.__version__)"
    return subprocess.run([str(venv / "bin/python"), "-c", code], capture_output=True, text=True, check=True).stdout


def test_servers_share_only_what_changes_nothing_and_an_empty_requirement_is_named(gym_like, tmp_path):
    base, _ = gym_like
    venvs, report = tmp_path / "venvs", tmp_path / "report.json"
    before = sorted(p.name for p in sv.site_packages(base).glob("*.dist-info"))
    status, out = _prepare(base, venvs, report)
    assert status == 1, out  # never a silent success: empty_dep's module is missing
    got = json.loads(report.read_text())
    assert {s.split("/")[1]: v["venv"] for s, v in got.items()} == {
        "pins_old": "own",
        "adds_new": "shared",
        "empty_dep": "shared",
        "plain": "base",
    }, out
    assert "ngvtest-common 1.0 -> 2.0" in got["resources_servers/pins_old"]["why"]
    assert got["resources_servers/empty_dep"]["problems"] == [
        "requirement ngvtest-empty is installed (1.0) but provides no module 'ngvtest_empty'"
    ]
    own = venvs / "resources_servers/pins_old/.venv"
    assert not own.is_symlink() and (own / "bin/activate").exists()  # a real venv at Gym's path
    assert _version(own, "ngvtest_common").strip() == "2.0"  # its pin first
    shared = venvs / "resources_servers/adds_new/.venv"
    assert shared.resolve() == (venvs / "_shared/.venv").resolve()
    assert _version(shared, "ngvtest_common").strip() == "1.0" and _version(shared, "ngvtest_new").strip() == "1.0"
    assert (venvs / "resources_servers/plain/.venv").resolve() == base.resolve()
    assert sorted(p.name for p in sv.site_packages(base).glob("*.dist-info")) == before  # Gym's venv untouched
    # Second run: the three good servers are cached (no pip at all); the bad one is decided and checked again.
    status, again = _prepare(base, venvs, report)
    assert status == 1 and again.count("[cached]") == 3 and "overlay in" not in again, again


def test_a_launch_prepares_its_servers_on_first_use_and_names_what_it_cannot(gym_like, tmp_path):
    """``venv_prep.ensure`` (what ``GymServers.start`` calls before Gym starts): the servers a config names are
    prepared once, then found ready with no pip at all; a requirement no index offers (offline, nothing cached) stops
    the launch naming the server, the requirement and the command that prepares it -- never Gym's own ``uv`` path."""
    base, root = gym_like
    venvs = tmp_path / "venvs"
    cfg = tmp_path / "env.yaml"
    cfg.write_text(
        "adds:\n  resources_servers:\n    adds_new:\n      entrypoint: app.py\n"
        "plain:\n  resources_servers:\n    plain:\n      entrypoint: app.py\n"
    )
    first = venv_prep.ensure([cfg], base, venvs)
    assert first == ["resources_servers/adds_new", "resources_servers/plain"]  # legacy_agent: not in this Gym
    assert _version(venvs / "resources_servers/adds_new/.venv", "ngvtest_new").strip() == "1.0"
    assert venv_prep.ensure([cfg], base, venvs) == []  # ready: nothing decided, nothing built
    _server(root, "needs_absent", ["ngvtest-absent>=1"], ["ngvtest_absent"])
    cfg.write_text("absent:\n  resources_servers:\n    needs_absent:\n      entrypoint: app.py\n")
    with pytest.raises(SetupError) as e:
        venv_prep.ensure([cfg], base, venvs)
    msg = str(e.value)
    assert "resources_servers/needs_absent: needs ngvtest-absent>=1 beyond the Gym venv" in msg, msg
    assert "scripts/prepare_gym_venvs.py --no-defaults --server resources_servers/needs_absent" in msg, msg
    assert f"--venvs-dir {venvs}" in msg, msg
    assert venv_prep.unprepared({"resources_servers/needs_absent": {"app.py"}}, base, venvs, ()) != []  # not cached
