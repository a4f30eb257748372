"""Preparing NeMo Gym's server venvs: which servers a Gym config starts, what each gets (decided and built with
:mod:`~nemo_gym_adapter.gym.server_venvs`' mechanisms), remembered, and done on first use.

Gym runs every server implementation (``resources_servers/<impl>``, ``responses_api_agents/<impl>``, ...) from
``<uv_venv_dir>/<type>/<impl>/.venv`` and, with ``skip_venv_if_present: true`` (what we launch it with), uses a venv
it finds there as it is; without one it builds it with ``uv`` and the network. For each server :func:`prepare`:

1. reads its requirements (``requirements.txt`` or ``pyproject.toml``, without the ``nemo-gym`` self-reference);
2. decides: requirements the Gym venv already meets -> ``.venv`` links to the Gym venv; otherwise ``pip install
   --dry-run --report`` says whether installing them changes an installed package: no -> the server shares the one
   overlay of added packages (``<uv_venv_dir>/_shared/.venv``, the Gym venv itself is never modified); yes (or its
   requirements cannot be resolved together with the other sharing servers') -> its own overlay venv at its path;
3. builds what is missing (``overrides.txt`` lines are passed as pip constraints, the closest pip has to uv's
   ``--override``) and checks each server's third-party imports in the venv it will run from;
4. remembers what it built (``<uv_venv_dir>/.ngv-venvs.json``, keyed by the requirements and the Gym venv's installed
   distributions), so a second run decides and builds nothing.

Set-up prepares :data:`DEFAULT_SERVERS` (``scripts/prepare_gym_venvs.py``, the command line). Any other server is
prepared on first use: :meth:`GymServers.start <nemo_gym_adapter.gym.servers.GymServers.start>` calls :func:`ensure`
with the configs it launches (``collect --env X``, a training run whose ``nemo_gym.config_paths`` name X), so Gym never
reaches its own ``uv`` path; what cannot be prepared (no network and nothing cached, a requirement that provides no
module) stops the launch naming the server, its requirements the Gym venv lacks and the command that prepares it.
One preparation at a time per venvs dir (a lock file there). Stdlib only (``yaml`` read lazily, for configs); never
imports ``nemo_gym``; runs with any Python >= 3.11.
"""

from __future__ import annotations

import fcntl
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nemo_gym_adapter.errors import SetupError
from nemo_gym_adapter.gym import server_venvs as sv
from nemo_gym_adapter.runtime import paths

logger = logging.getLogger(__name__)

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
ALWAYS = ("environment_servers/legacy_agent",)
# Gym servers this project ships (gym_servers/README.md): looked up before Gym's install root, as Gym itself does with
# NEMO_GYM_EXTRA_ROOTS.
OUR_SERVERS = paths.REPO_ROOT / "gym_servers"
SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
STATE_FILE = ".ngv-venvs.json"
LOCK_FILE = ".ngv-venvs.lock"
SHARED = "_shared"
COMMAND = ".venv/bin/python scripts/prepare_gym_venvs.py"  # from the checkout


def find_server(server: str, gym_root: Path, roots: tuple[Path, ...] = ()) -> Path:
    """A server's directory: ours (:data:`OUR_SERVERS`) and ``roots`` first, then Gym's install root."""
    for root in (OUR_SERVERS, *roots):
        if (root / server).is_dir():
            return root / server
    return gym_root / server


def gym_package_root(gym_venv: Path) -> Path:
    """The directory holding Gym's ``resources_servers/`` etc. (the Gym venv's site-packages)."""
    root = sv.site_packages(gym_venv)
    if not (root / "nemo_gym").is_dir():
        raise SetupError(f"nemo_gym is not installed in {gym_venv} (looked in {root}); run scripts/setup.sh")
    return root


def servers_in_config(config_path: Path, gym_root: Path, seen: set[Path] | None = None) -> dict[str, set[str]]:
    """``{<type>/<impl>: entrypoints}`` of every server a Gym config (and the configs it includes) starts."""
    import yaml  # the trainer venv has it

    seen = set() if seen is None else seen
    if config_path in seen:
        return {}
    seen.add(config_path)
    try:
        data = yaml.safe_load(config_path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}  # a config Gym cannot read either: Gym's own parser reports it, with its log (nothing to prepare)
    if not isinstance(data, dict):
        return {}
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
        new = sorted(set(together.install) - set(have))
        for s in todo.values():
            s.update(venv="shared", why=f"adds only new packages ({', '.join(new) or 'none'}) for all")
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


def check_imports(info: dict[str, dict[str, Any]], venvs_dir: Path) -> None:
    """Set each prepared server's ``problems`` to the modules its code imports that its venv lacks (one interpreter
    start per distinct venv)."""
    groups: dict[Path, list[str]] = {}
    for server, i in info.items():
        if not i["problems"] and not i.get("cached"):  # a cached server passed this check on the same venvs
            i["modules"] = sv.imported_modules(i["dir"], sorted(i["entries"]))
            groups.setdefault((venvs_dir / server / ".venv").resolve(), []).append(server)
    for venv, members in groups.items():
        modules = set().union(*(info[s]["modules"] for s in members))
        names = set().union(*(sv.requirement_names(info[s]["reqs"]) for s in members))
        missing, versions = sv.find_modules(sv.venv_python(venv), modules, names) if modules else (set(), {})
        for s in members:
            mine = missing & info[s]["modules"]
            info[s]["problems"] = sv.module_problems(mine, versions, info[s]["reqs"], sv.git_sources(info[s]["dir"]))


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


def prepare(
    servers: Mapping[str, set[str]],
    gym_venv: Path,
    venvs_dir: Path,
    roots: tuple[Path, ...] = (),
    dry_run: bool = False,
    out: Any = sys.stdout,
) -> dict[str, dict[str, Any]]:
    """Decide, build and check the venv of each of ``servers`` (``{<type>/<impl>: entrypoints}``), one line each on
    ``out``; return ``{server: info}`` (``venv``, ``why``, ``reqs``, ``problems``: empty when it is ready). Servers
    prepared before with the same requirements on the same Gym venv are taken as they are (``cached``)."""
    t0 = time.monotonic()
    gym_venv = gym_venv.resolve()
    gym_python = sv.venv_python(gym_venv)
    if not gym_python.exists() or not (gym_venv / "bin" / "activate").exists():
        raise SetupError(f"{gym_venv} is not a venv (needs bin/python and bin/activate); run scripts/setup.sh")
    gym_root = gym_package_root(gym_venv)
    venvs_dir = venvs_dir.resolve()
    shared_venv = venvs_dir / SHARED / ".venv"
    fingerprint = sv.base_fingerprint(gym_venv)
    state = read_state(venvs_dir, fingerprint)
    print(f"Gym venv: {gym_venv}\nserver venvs dir (uv_venv_dir): {venvs_dir}", file=out, flush=True)

    info: dict[str, dict[str, Any]] = {}
    for server, entries in servers.items():
        server_dir = find_server(server, gym_root, roots)
        if not server_dir.is_dir():
            raise SetupError(f"no Gym server at {server_dir} (a config names {server})")
        reqs, overrides = server_requirements(server_dir)
        info[server] = {"reqs": reqs, "overrides": overrides, "key": sv.server_key(reqs, overrides), "entries": entries}
        info[server]["dir"] = server_dir
        before = state["servers"].get(server, {})
        if before.get("key") == info[server]["key"] and sv.venv_python(venvs_dir / server / ".venv").exists():
            info[server].update(venv=before["venv"], why=before["why"], cached=True)

    todo = {s: i for s, i in info.items() if not i.get("cached")}
    if todo:
        have = sv.installed(gym_python)
        pins = sv.constraint_lines(have)
        missing = sv.unmet(gym_python, [r for i in todo.values() for r in i["reqs"]])
        for server, i in list(todo.items()):
            i["unmet"] = [r for r in i["reqs"] if r in missing]
            if not i["unmet"]:
                i.update(venv="base", why="the Gym venv meets its requirements" if i["reqs"] else "no requirements")
                del todo[server]
        shared_before = list(state["shared"])
        shared_reqs = decide(todo, gym_python, shared_before, pins, have) if todo else shared_before
        if not dry_run:
            build(info, todo, gym_venv, shared_venv, shared_reqs, shared_before, pins, venvs_dir, fingerprint)
        state["shared"] = shared_reqs

    for server, i in info.items():
        target = {"base": gym_venv, "shared": shared_venv}.get(i["venv"])
        i["done"] = "own overlay" if target is None else sv.link_venv(venvs_dir / server / ".venv", target, dry_run)
        i.setdefault("problems", [])
    if not dry_run:
        check_imports(info, venvs_dir)
    for server, i in info.items():
        status = "PROBLEM: " + "; ".join(i["problems"]) if i["problems"] else "ok"
        line = f"  {server}: {i['venv']} ({i['done']}; {i['why'][:120]}){' [cached]' if i.get('cached') else ''}"
        print(f"{line}: {status}", file=out, flush=True)
        if not i["problems"] and not dry_run:
            state["servers"][server] = {k: i[k] for k in ("key", "venv", "why")}
        else:
            state["servers"].pop(server, None)  # decided again next time
    if not dry_run:
        venvs_dir.mkdir(parents=True, exist_ok=True)
        (venvs_dir / STATE_FILE).write_text(json.dumps(state, indent=1))
    problems = sum(bool(i["problems"]) for i in info.values())
    print(f"{len(info)} servers prepared in {time.monotonic() - t0:.0f} s: {problems} with problems", file=out)
    return info


def server_requirements(server_dir: Path) -> tuple[list[str], list[str]]:
    """A server's requirement lines and its ``overrides.txt`` lines."""
    overrides_txt = server_dir / "overrides.txt"
    overrides = [x for x in (overrides_txt.read_text().splitlines() if overrides_txt.exists() else []) if x]
    return sv.read_requirements(server_dir), overrides


def read_state(venvs_dir: Path, fingerprint: str) -> dict[str, Any]:
    """What was prepared in ``venvs_dir`` for the Gym venv whose fingerprint is ``fingerprint`` (else nothing)."""
    path = venvs_dir / STATE_FILE
    state = json.loads(path.read_text()) if path.exists() else {}
    if state.get("base") != fingerprint:
        state = {"base": fingerprint, "servers": {}, "shared": []}  # the Gym venv changed: decide everything again
    return state


@contextmanager
def locked(venvs_dir: Path) -> Iterator[None]:
    """One preparation at a time in ``venvs_dir`` (two launches preparing the shared overlay at once would race)."""
    venvs_dir.mkdir(parents=True, exist_ok=True)
    with open(venvs_dir / LOCK_FILE, "w") as fd:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def unprepared(servers: Mapping[str, set[str]], gym_venv: Path, venvs_dir: Path, roots: tuple[Path, ...]) -> list[str]:
    """Which of ``servers`` have no venv prepared for their requirements on this Gym venv (file reads only). A
    server whose code is nowhere (Gym's root, ours, ``roots``) is left out: Gym names it when it fails to start it."""
    gym_root = gym_package_root(gym_venv)
    state = read_state(venvs_dir, sv.base_fingerprint(gym_venv))
    out = []
    for server in servers:
        server_dir = find_server(server, gym_root, roots)
        if not server_dir.is_dir():
            continue
        key = sv.server_key(*server_requirements(server_dir))
        ready = sv.venv_python(venvs_dir / server / ".venv").exists()
        if not ready or state["servers"].get(server, {}).get("key") != key:
            out.append(server)
    return out


def servers_of(files: list[Path], gym_venv: Path, overrides: Mapping[str, Any] | None = None) -> dict[str, set[str]]:
    """``{<type>/<impl>: entrypoints}`` of every server these Gym configs (and ``overrides``, a config as a dict)
    start, with the ones Gym always starts (:data:`ALWAYS`)."""
    gym_root = gym_package_root(gym_venv)
    found: dict[str, set[str]] = {s: {"app.py"} for s in ALWAYS}
    for path in files:
        for server, entries in servers_in_config(path, gym_root).items():
            found.setdefault(server, set()).update(entries)
    for value in (overrides or {}).values():
        for server_type, impls in value.items() if isinstance(value, dict) else ():
            for impl, cfg in impls.items() if server_type in SERVER_TYPES and isinstance(impls, dict) else ():
                if isinstance(cfg, dict) and cfg.get("entrypoint"):
                    found.setdefault(f"{server_type}/{impl}", set()).add(str(cfg["entrypoint"]))
    return found


def ensure(
    files: list[Path],
    gym_venv: Path,
    venvs_dir: Path,
    roots: tuple[Path, ...] = (),
    overrides: Mapping[str, Any] | None = None,
) -> list[str]:
    """Prepare, before Gym starts, the venv of every server these configs start that has none yet (first use);
    return the servers prepared now (``[]``: all were ready, after a few file reads). Raises ``SetupError`` naming
    each server that cannot be prepared, the requirements the Gym venv lacks for it and the command that prepares
    it, so Gym never falls back to building a venv with ``uv`` (not installed, and no network when it would be)."""
    servers = servers_of(files, gym_venv, overrides)
    if not unprepared(servers, gym_venv, venvs_dir, roots):
        return []
    with locked(venvs_dir):
        todo = unprepared(servers, gym_venv, venvs_dir, roots)  # another launch may have prepared them meanwhile
        if not todo:
            return []
        logger.warning("NeMo Gym: preparing the venvs of %s (first use; kept in %s)", ", ".join(todo), venvs_dir)
        info = prepare({s: servers[s] for s in todo}, gym_venv, venvs_dir, roots, out=sys.stderr)
    bad = {s: i for s, i in info.items() if i["problems"]}
    if bad:
        extra = "".join(f" --server {s}" for s in bad)
        lines = [
            f"{s}: needs {', '.join(i.get('unmet') or i['reqs']) or 'nothing'} beyond the Gym venv; "
            + "; ".join(i["problems"])
            for s, i in bad.items()
        ]
        raise SetupError(
            f"NeMo Gym server venvs could not be prepared in {venvs_dir} (pip's output above):\n  "
            + "\n  ".join(lines)
            + f"\nWith PyPI reachable, run from the checkout: {COMMAND} --no-defaults{extra}"
            + (f" --venvs-dir {venvs_dir}" if venvs_dir.resolve() != paths.gym_server_venvs_dir().resolve() else "")
        )
    return todo
