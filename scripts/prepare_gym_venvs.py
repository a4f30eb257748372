#!/usr/bin/env python
"""Make NeMo Gym's servers start offline, each seeing the packages it asked for: share a venv where that changes
nothing another server uses, give a server its own overlay venv where it would; check every server can import what
its code imports. Never silently: a server that cannot be prepared is named, with why, and the exit status is 1.

Set-up runs it for the servers our shipped configs use; any other server is prepared on first use, when a launch
names it (``nemo_gym_adapter.gym.venv_prep``: the steps, what is remembered, and the why;
``nemo_gym_adapter.gym.server_venvs``: the mechanisms). Run it with any Python >= 3.11 (set-up uses the trainer
venv's); it never imports ``nemo_gym``. Needs PyPI (or the pip cache) only when something is to be decided or built.

    .venv/bin/python scripts/prepare_gym_venvs.py                    # the servers our shipped configs use
    .venv/bin/python scripts/prepare_gym_venvs.py --config my.yaml   # plus every server a Gym config names
    .venv/bin/python scripts/prepare_gym_venvs.py --no-defaults --server resources_servers/mcqa  # one server
    .venv/bin/python scripts/prepare_gym_venvs.py --no-defaults --config ... --venvs-dir DIR --report out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # so the script also runs from a checkout that is not pip-installed

from nemo_gym_adapter.errors import SetupError  # noqa: E402  (stdlib-only modules)
from nemo_gym_adapter.gym import venv_prep as vp  # noqa: E402
from nemo_gym_adapter.runtime import paths  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Exit status 1 when a server has a problem."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gym-venv", type=Path, default=paths.gym_venv(), help="default: %(default)s")
    parser.add_argument("--venvs-dir", type=Path, default=paths.gym_server_venvs_dir(), help="Gym's uv_venv_dir")
    parser.add_argument("--server", action="append", default=[], help="extra <type>/<impl>, repeatable")
    parser.add_argument("--config", action="append", default=[], type=Path, help="Gym config; add its servers")
    parser.add_argument("--no-defaults", action="store_true", help="only --server/--config servers")
    parser.add_argument("--dry-run", action="store_true", help="decide and print, build nothing")
    parser.add_argument("--report", type=Path, help="write {server: {venv, why, problems}} as JSON")
    args = parser.parse_args(argv)
    try:
        gym_root = vp.gym_package_root(args.gym_venv.resolve())
        servers: dict[str, set[str]] = {s: {"app.py"} for s in ([] if args.no_defaults else vp.DEFAULT_SERVERS)}
        for extra in args.server:
            servers.setdefault(extra, {"app.py"})
        for cfg in args.config:
            for server, entries in vp.servers_in_config(cfg.resolve(), gym_root).items():
                servers.setdefault(server, set()).update(entries)
        with vp.locked(args.venvs_dir.resolve()):
            info = vp.prepare(servers, args.gym_venv, args.venvs_dir, dry_run=args.dry_run)
    except SetupError as e:
        sys.exit(f"error: {e}")
    if args.report:
        keep = ("venv", "why", "problems", "reqs")
        args.report.write_text(json.dumps({s: {k: i.get(k) for k in keep} for s, i in info.items()}, indent=1))
    return 1 if any(i["problems"] for i in info.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
