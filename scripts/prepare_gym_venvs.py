#!/usr/bin/env python
"""Make NeMo Gym servers start offline: install their extra requirements into the Gym venv and link their venvs.

Gym gives every server implementation (``resources_servers/<impl>``, ``responses_api_agents/<impl>``, ...) its own
uv venv and pip-installs it at start-up. That needs ``uv`` and the network, and costs minutes. With
``skip_venv_if_present: true`` Gym instead reuses ``<uv_venv_dir>/<type>/<impl>/.venv`` when that holds
``bin/python`` and ``bin/activate`` -- a symlink to the one Gym venv is enough. This script

1. reads each server's ``requirements.txt`` (or ``pyproject.toml``), drops the ``nemo-gym`` self-reference (its
   ``[dev]`` extra is test tooling, never imported by a running server), and pip-installs whatever is not yet
   satisfied into the Gym venv, in one call;
2. creates the ``.venv`` symlinks under ``uv_venv_dir`` (``nemo_gym_adapter.paths.gym_server_venvs_dir()``).

Run it with any Python >=3.10 (the set-up script uses the trainer venv's); it never imports ``nemo_gym`` and runs
pip through the Gym venv's own interpreter. Idempotent: a second run checks, prints "ok" lines and installs nothing.

    .venv/bin/python scripts/prepare_gym_venvs.py                 # the servers our configs use
    .venv/bin/python scripts/prepare_gym_venvs.py --config my.yaml  # plus every server a Gym config names
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # so the script also runs from a checkout that is not pip-installed

from nemo_gym_adapter import paths  # noqa: E402  (stdlib-only module)

# Every server implementation our shipped configs and tests spin up (`environment_servers/legacy_agent` is the relay
# Gym 0.7 puts in front of any agent without an environment server, so it is always needed).
DEFAULT_SERVERS = (
    "resources_servers/example_single_tool_call",
    "resources_servers/example_multi_step",
    "resources_servers/string_match",
    "resources_servers/math_with_judge",
    "responses_api_agents/simple_agent",
    "responses_api_models/vllm_model",
    "environment_servers/legacy_agent",
)
SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")

# Run inside the Gym venv: which of the given requirement strings are not satisfied there (json in, json out).
_CHECK_SNIPPET = r"""
import json, sys
from importlib.metadata import PackageNotFoundError, version
from packaging.requirements import Requirement
missing = []
for line in json.load(sys.stdin):
    req = Requirement(line)
    try:
        have = version(req.name)
    except PackageNotFoundError:
        missing.append(line)
        continue
    if req.specifier and not req.specifier.contains(have, prereleases=True):
        missing.append(line)
print(json.dumps(missing))
"""


def gym_package_root(gym_python: Path) -> Path:
    """The directory holding Gym's ``resources_servers/`` etc. (site-packages of the Gym venv), without importing Gym."""
    out = subprocess.run(
        [str(gym_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    root = Path(out)
    if not (root / "nemo_gym").is_dir():
        sys.exit(f"error: nemo_gym is not installed in {gym_python} (looked in {root}); run the Gym venv set-up first")
    return root


def server_requirements(server_dir: Path) -> list[str]:
    """Third-party requirements of one server, without the ``nemo-gym`` self-reference."""
    lines: list[str] = []
    req_txt = server_dir / "requirements.txt"
    pyproject = server_dir / "pyproject.toml"
    if req_txt.exists():
        for raw in req_txt.read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("-") or "../.." in line or line.lower().replace("_", "-").startswith("nemo-gym"):
                continue  # `-e nemo-gym[dev] @ ../../` and other pip options: Gym itself is already installed
            lines.append(line)
    elif pyproject.exists():
        import tomllib

        deps = tomllib.loads(pyproject.read_text()).get("project", {}).get("dependencies", [])
        lines = [d for d in deps if not d.lower().replace("_", "-").startswith("nemo-gym")]
    else:
        sys.exit(f"error: {server_dir} has neither requirements.txt nor pyproject.toml (not a Gym server)")
    if (server_dir / "overrides.txt").exists():
        print(f"  note: {server_dir.name} has overrides.txt; not applied (check its pins by hand)")
    return lines


def servers_in_config(config_path: Path, gym_root: Path, seen: set[Path] | None = None) -> list[str]:
    """``<type>/<impl>`` of every server a Gym config (and the configs it includes) starts."""
    import yaml  # only needed for --config; the trainer venv has it

    seen = set() if seen is None else seen
    if config_path in seen:
        return []
    seen.add(config_path)
    data = yaml.safe_load(config_path.read_text()) or {}
    found: list[str] = []
    for value in data.values():
        if not isinstance(value, dict):
            continue
        for server_type, impls in value.items():
            if server_type in SERVER_TYPES and isinstance(impls, dict):
                found.extend(f"{server_type}/{impl}" for impl, cfg in impls.items() if isinstance(cfg, dict))
    for child in data.get("config_paths") or []:
        child_path = Path(child)
        for base in (Path.cwd(), gym_root):  # Gym's own order: cwd first, then its install root
            if not child_path.is_absolute() and (base / child_path).exists():
                child_path = base / child_path
                break
        found.extend(servers_in_config(child_path, gym_root, seen))
    return found


def link_venv(link: Path, target: Path, dry_run: bool) -> str:
    """Point ``link`` at ``target``; return what was done."""
    if link.is_symlink():
        if Path(os.readlink(link)) == target:
            return "ok"
        if not dry_run:
            link.unlink()
            link.symlink_to(target, target_is_directory=True)
        return f"relinked (was {os.readlink(link) if dry_run else 'another venv'})"
    if link.exists():
        return "kept (a real venv is there; remove it to use the Gym venv)"
    if not dry_run:
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(target, target_is_directory=True)
    return "linked"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gym-venv", type=Path, default=paths.gym_venv(), help="default: %(default)s")
    parser.add_argument("--venvs-dir", type=Path, default=paths.gym_server_venvs_dir(), help="Gym's uv_venv_dir")
    parser.add_argument("--server", action="append", default=[], help="extra <type>/<impl>, repeatable")
    parser.add_argument("--config", action="append", default=[], type=Path, help="Gym config; add its servers")
    parser.add_argument("--no-defaults", action="store_true", help="only --server/--config servers")
    parser.add_argument("--dry-run", action="store_true", help="print what would be done")
    args = parser.parse_args(argv)

    gym_venv = args.gym_venv.resolve()
    gym_python = gym_venv / "bin" / "python"
    if not gym_python.exists() or not (gym_venv / "bin" / "activate").exists():
        sys.exit(f"error: {gym_venv} is not a venv (needs bin/python and bin/activate)")
    gym_root = gym_package_root(gym_python)

    servers = [] if args.no_defaults else list(DEFAULT_SERVERS)
    servers += args.server
    for cfg in args.config:
        servers += servers_in_config(cfg.resolve(), gym_root)
    servers = list(dict.fromkeys(servers))

    wanted: list[str] = []
    print(f"Gym venv: {gym_venv}\nserver venvs dir (uv_venv_dir): {args.venvs_dir}")
    for server in servers:
        server_dir = gym_root / server
        if not server_dir.is_dir():
            sys.exit(f"error: no Gym server at {server_dir}")
        reqs = server_requirements(server_dir)
        print(f"  {server}: requirements {reqs or '(none beyond nemo-gym)'}")
        wanted += reqs
    wanted = list(dict.fromkeys(wanted))

    missing = json.loads(
        subprocess.run(
            [str(gym_python), "-c", _CHECK_SNIPPET],
            input=json.dumps(wanted),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    if missing:
        cmd = [str(gym_python), "-m", "pip", "install", "--disable-pip-version-check", *missing]
        print(f"installing into the Gym venv: {' '.join(missing)}\n$ {' '.join(cmd)}", flush=True)
        if not args.dry_run:
            subprocess.run(cmd, check=True)
    else:
        print("all server requirements already satisfied in the Gym venv")

    for server in servers:
        link = args.venvs_dir / server / ".venv"
        print(f"  {link} -> {gym_venv}: {link_venv(link, gym_venv, args.dry_run)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
