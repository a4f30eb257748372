#!/usr/bin/env python
"""Make NeMo Gym's servers start offline, each seeing the packages it asked for: share a venv where that changes
nothing another server uses, give a server its own overlay venv where it would; check every server can import what
its code imports. Never silently: a server that cannot be prepared is named, with why, and the exit status is 1.

Gym runs every server implementation (``resources_servers/<impl>``, ``responses_api_agents/<impl>``, ...) from
``<uv_venv_dir>/<type>/<impl>/.venv`` and, with ``skip_venv_if_present: true``, uses a venv it finds there as it is.
For each server this script (``nemo_gym_adapter.gym.server_venvs`` has the mechanisms and the why):

1. reads its requirements (``requirements.txt`` or ``pyproject.toml``, without the ``nemo-gym`` self-reference);
2. decides: requirements the Gym venv already meets -> ``.venv`` links to the Gym venv; otherwise ``pip install
   --dry-run --report`` says whether installing them changes an installed package: no -> the server shares the one
   overlay of added packages (``<uv_venv_dir>/_shared/.venv``, the Gym venv itself is never modified); yes (or its
   requirements cannot be resolved together with the other sharing servers') -> its own overlay venv at its path;
3. builds what is missing (``overrides.txt`` lines are passed as pip constraints, the closest pip has to uv's
   ``--override``) and checks each server's third-party imports in the venv it will run from;
4. remembers what it built (``<uv_venv_dir>/.ngv-venvs.json``, keyed by the requirements and the Gym venv's installed
   distributions), so a second run decides and builds nothing.

Run it with any Python >= 3.11 (set-up uses the trainer venv's); it never imports ``nemo_gym``. Needs PyPI (or the pip
cache) only when something is to be decided or built.

    .venv/bin/python scripts/prepare_gym_venvs.py                    # the servers our shipped configs use
    .venv/bin/python scripts/prepare_gym_venvs.py --config my.yaml   # plus every server a Gym config names
    .venv/bin/python scripts/prepare_gym_venvs.py --no-defaults --config ... --venvs-dir DIR --report out.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # so the script also runs from a checkout that is not pip-installed

from nemo_gym_adapter.gym import server_venvs as sv  # noqa: E402  (stdlib-only module)
from nemo_gym_adapter.runtime import paths  # noqa: E402  (stdlib-only module)

# Every server implementation our shipped configs and tests spin up (`environment_servers/legacy_agent` is the relay
# Gym 0.7 puts in front of any agent without an environment server, so it is always needed).
DEFAULT_SERVERS = (
    "resources_servers/example_single_tool_call",
    "resources_servers/example_multi_step",
    "resources_servers/string_match",
    "resources_servers/example_tool_call_multireward",
    "resources_servers/math_with_judge",
    "resources_servers/example_multi_turn_gymnasium",
    "responses_api_agents/simple_agent",
    "responses_api_agents/gymnasium_agent",
    "responses_api_models/vllm_model",
    "environment_servers/legacy_agent",
    "resources_servers/toy_latency",  # ours, under OUR_SERVERS
)
# Gym servers this project ships (gym_servers/README.md): looked up here before Gym's install root, as Gym itself does
# with NEMO_GYM_EXTRA_ROOTS.
OUR_SERVERS = REPO_ROOT / "gym_servers"


def find_server(server: str, gym_root: Path) -> Path:
    """A server's directory: ours (:data:`OUR_SERVERS`) first, then Gym's install root."""
    ours = OUR_SERVERS / server
    return ours if ours.is_dir() else gym_root / server


SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
STATE_FILE = ".ngv-venvs.json"
SHARED = "_shared"

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


def gym_package_root(gym_venv: Path) -> Path:
    """The directory holding Gym's ``resources_servers/`` etc. (the Gym venv's site-packages)."""
    root = sv.site_packages(gym_venv)
    if not (root / "nemo_gym").is_dir():
        sys.exit(f"error: nemo_gym is not installed in {gym_venv} (looked in {root}); run the Gym venv set-up first")
    return root


def servers_in_config(config_path: Path, gym_root: Path, seen: set[Path] | None = None) -> dict[str, set[str]]:
    """``{<type>/<impl>: entrypoints}`` of every server a Gym config (and the configs it includes) starts."""
    import yaml  # the trainer venv has it

    seen = set() if seen is None else seen
    if config_path in seen:
        return {}
    seen.add(config_path)
    data = yaml.safe_load(config_path.read_text()) or {}
    found: dict[str, set[str]] = {}
    for value in data.values():
        for server_type, impls in value.items() if isinstance(value, dict) else ():
            for impl, cfg in impls.items() if server_type in SERVER_TYPES and isinstance(impls, dict) else ():
                if isinstance(cfg, dict):
                    found.setdefault(f"{server_type}/{impl}", set()).add(str(cfg.get("entrypoint") or "app.py"))
    for child in data.get("config_paths") or []:
        child_path = Path(child)
        for base in (Path.cwd(), gym_root):  # Gym's own order: cwd first, then its install root
            if not child_path.is_absolute() and (base / child_path).exists():
                child_path = base / child_path
                break
        for server, entries in servers_in_config(child_path, gym_root, seen).items():
            found.setdefault(server, set()).update(entries)
    return found


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
        if not (link / "lib").exists() or not list(link.glob(f"lib/python3*/site-packages/{sv.OVERLAY_PTH}")):
            return "kept (a venv someone else built is there; remove it to use ours)"
        if not dry_run:
            import shutil

            shutil.rmtree(link)
    if not dry_run:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
    return "linked"


def unmet(python: Path, reqs: list[str]) -> list[str]:
    """The requirement lines ``python``'s environment does not meet."""
    proc = subprocess.run(
        [str(python), "-c", _CHECK_SNIPPET], input=json.dumps(reqs), capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout)


def server_key(reqs: list[str], overrides: list[str]) -> str:
    return hashlib.sha256(json.dumps([reqs, overrides]).encode()).hexdigest()[:16]


def decide(
    todo: dict[str, dict[str, Any]], gym_python: Path, shared_reqs: list[str], pins: list[str], have: dict[str, str]
) -> list[str]:
    """Set ``venv`` (``shared``/``own``) and ``why`` on each of ``todo``; return the shared overlay's requirements.
    One dry-run of everything together first; only if that changes or cannot resolve, one per server in turn."""
    planned, added = list(shared_reqs), set(have)

    def try_share(reqs: list[str], overrides: list[str]) -> sv.DryRun:
        return sv.dry_run(gym_python, gym_python, list(dict.fromkeys(planned + reqs)), pins + overrides)

    every = [r for s in todo.values() for r in s["reqs"]]
    together = try_share(every, [o for s in todo.values() for o in s["overrides"]])
    if not together.error and not together.changes(have):
        added = sorted(set(together.install) - set(have))
        for s in todo.values():
            s.update(venv="shared", why=f"adds only new packages ({', '.join(added) or 'none'}) for all")
        return list(dict.fromkeys(planned + every))
    for name, s in todo.items():
        result = try_share(s["reqs"], s["overrides"])
        changes = result.changes(have)
        if result.error or changes:
            why = f"installing its requirements would change {', '.join(changes)}" if changes else (
                f"its requirements do not resolve with the shared ones: {result.error}"
            )  # fmt: skip
            s.update(venv="own", why=why)
        else:
            planned = list(dict.fromkeys(planned + s["reqs"]))
            s.update(venv="shared", why="adds only new packages: " + ", ".join(sorted(set(result.install) - added)))
            added |= set(result.install)
        print(f"  {name}: {s['venv']} ({s['why'][:160]})", flush=True)
    return planned


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gym-venv", type=Path, default=paths.gym_venv(), help="default: %(default)s")
    parser.add_argument("--venvs-dir", type=Path, default=paths.gym_server_venvs_dir(), help="Gym's uv_venv_dir")
    parser.add_argument("--server", action="append", default=[], help="extra <type>/<impl>, repeatable")
    parser.add_argument("--config", action="append", default=[], type=Path, help="Gym config; add its servers")
    parser.add_argument("--no-defaults", action="store_true", help="only --server/--config servers")
    parser.add_argument("--dry-run", action="store_true", help="decide and print, build nothing")
    parser.add_argument("--report", type=Path, help="write {server: {venv, why, problems}} as JSON")
    args = parser.parse_args(argv)

    t0 = time.monotonic()
    gym_venv = args.gym_venv.resolve()
    gym_python = sv.venv_python(gym_venv)
    if not gym_python.exists() or not (gym_venv / "bin" / "activate").exists():
        sys.exit(f"error: {gym_venv} is not a venv (needs bin/python and bin/activate)")
    gym_root = gym_package_root(gym_venv)
    servers: dict[str, set[str]] = {s: {"app.py"} for s in ([] if args.no_defaults else DEFAULT_SERVERS)}
    for extra in args.server:
        servers.setdefault(extra, {"app.py"})
    for cfg in args.config:
        for server, entries in servers_in_config(cfg.resolve(), gym_root).items():
            servers.setdefault(server, set()).update(entries)

    venvs_dir = args.venvs_dir.resolve()
    shared_venv = venvs_dir / SHARED / ".venv"
    fingerprint = sv.base_fingerprint(gym_venv)
    state_path = venvs_dir / STATE_FILE
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    if state.get("base") != fingerprint:
        state = {"base": fingerprint, "servers": {}, "shared": []}  # the Gym venv changed: decide everything again
    print(f"Gym venv: {gym_venv}\nserver venvs dir (uv_venv_dir): {venvs_dir}")

    info: dict[str, dict[str, Any]] = {}
    for server, entries in servers.items():
        server_dir = find_server(server, gym_root)
        if not server_dir.is_dir():
            sys.exit(f"error: no Gym server at {server_dir}")
        reqs = sv.read_requirements(server_dir)
        overrides_txt = server_dir / "overrides.txt"
        overrides = [x for x in (overrides_txt.read_text().splitlines() if overrides_txt.exists() else []) if x]
        info[server] = {"reqs": reqs, "overrides": overrides, "key": server_key(reqs, overrides), "entries": entries}
        before = state["servers"].get(server, {})
        if before.get("key") == info[server]["key"] and (venvs_dir / server / ".venv" / "bin" / "python").exists():
            info[server].update(venv=before["venv"], why=before["why"], cached=True)

    todo = {s: i for s, i in info.items() if not i.get("cached")}
    have: dict[str, str] = {}
    if todo:
        have = sv.installed(gym_python)
        pins = sv.constraint_lines(have)
        missing = unmet(gym_python, [r for i in todo.values() for r in i["reqs"]])
        for server, i in list(todo.items()):
            if not set(i["reqs"]) & set(missing):
                i.update(venv="base", why="the Gym venv meets its requirements" if i["reqs"] else "no requirements")
                del todo[server]
        shared_before = list(state["shared"])
        shared_reqs = decide(todo, gym_python, shared_before, pins, have) if todo else shared_before
        if not args.dry_run:
            build(info, todo, gym_venv, shared_venv, shared_reqs, shared_before, pins, venvs_dir, fingerprint)
        state["shared"] = shared_reqs

    for server, i in info.items():
        target = {"base": gym_venv, "shared": shared_venv}.get(i["venv"])
        i["done"] = "own overlay" if target is None else link_venv(venvs_dir / server / ".venv", target, args.dry_run)
        i.setdefault("problems", [])
    if not args.dry_run:
        check_imports(info, gym_root, venvs_dir)
    problems = 0
    for server, i in info.items():
        done = i["done"]
        status = "PROBLEM: " + "; ".join(i["problems"]) if i["problems"] else "ok"
        print(f"  {server}: {i['venv']} ({done}; {i['why'][:120]}){' [cached]' if i.get('cached') else ''}: {status}")
        problems += bool(i["problems"])
        if not i["problems"] and not args.dry_run:
            state["servers"][server] = {k: i[k] for k in ("key", "venv", "why")}
        else:
            state["servers"].pop(server, None)  # decided again next time
    if not args.dry_run:
        venvs_dir.mkdir(parents=True, exist_ok=True)
        state_path.write_text(json.dumps(state, indent=1))
    if args.report:
        keep = ("venv", "why", "problems", "reqs")
        args.report.write_text(json.dumps({s: {k: i.get(k) for k in keep} for s, i in info.items()}, indent=1))
    print(f"{len(info)} servers prepared in {time.monotonic() - t0:.0f} s: {problems} with problems")
    return 1 if problems else 0


def check_imports(info: dict[str, dict[str, Any]], gym_root: Path, venvs_dir: Path) -> None:
    """Set each prepared server's ``problems`` to the modules its code imports that its venv lacks (one interpreter
    start per distinct venv)."""
    groups: dict[Path, list[str]] = {}
    for server, i in info.items():
        if not i["problems"] and not i.get("cached"):  # a cached server passed this check on the same venvs
            i["modules"] = sv.imported_modules(find_server(server, gym_root), sorted(i["entries"]))
            groups.setdefault((venvs_dir / server / ".venv").resolve(), []).append(server)
    for venv, members in groups.items():
        modules = set().union(*(info[s]["modules"] for s in members))
        names = set().union(*(sv.requirement_names(info[s]["reqs"]) for s in members))
        missing, versions = sv.find_modules(sv.venv_python(venv), modules, names) if modules else (set(), {})
        for s in members:
            mine = missing & info[s]["modules"]
            info[s]["problems"] = sv.module_problems(
                mine, versions, info[s]["reqs"], sv.git_sources(find_server(s, gym_root))
            )


def build(
    info: dict[str, dict[str, Any]],
    todo: dict[str, dict[str, Any]],
    gym_venv: Path,
    shared_venv: Path,
    shared_reqs: list[str],
    shared_before: list[str],
    pins: list[str],
    venvs_dir: Path,
    fingerprint: str,
) -> None:
    """Install the shared overlay's new requirements and each own overlay; a failure is recorded as the server's
    problem (named with pip's last lines), never raised past the other servers."""
    gym_python = sv.venv_python(gym_venv)
    sharing = [s for s, i in todo.items() if i["venv"] == "shared"]
    if sharing and (shared_reqs != shared_before or not sv.venv_python(shared_venv).exists()):
        t = time.monotonic()
        try:
            if not sv.venv_python(shared_venv).exists() or not shared_before:
                sv.make_overlay(shared_venv, gym_venv)
            overrides = [o for s in sharing for o in info[s]["overrides"]]
            sv.pip_install(gym_python, sv.venv_python(shared_venv), shared_reqs, pins + overrides)
            print(f"  shared overlay: {len(shared_reqs)} requirements in {time.monotonic() - t:.0f} s", flush=True)
        except subprocess.CalledProcessError as e:
            for s in sharing:
                info[s]["problems"] = [f"installing the shared requirements failed (pip exit {e.returncode})"]
    for server, i in todo.items():
        if i["venv"] != "own":
            continue
        venv = venvs_dir / server / ".venv"
        t = time.monotonic()
        try:
            sv.make_overlay(venv, gym_venv)
            sv.pip_install(gym_python, sv.venv_python(venv), i["reqs"], pins + i["overrides"])
            (venv / ".ngv-overlay.json").write_text(json.dumps({"key": i["key"], "base": fingerprint}))
            print(f"  {server}: own overlay in {time.monotonic() - t:.0f} s", flush=True)
        except subprocess.CalledProcessError as e:
            i["problems"] = [f"building its own venv failed (pip exit {e.returncode}; {i['why']})"]


if __name__ == "__main__":
    raise SystemExit(main())
