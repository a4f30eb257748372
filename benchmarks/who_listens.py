"""Who listens where while a command runs: the TCP listeners of its whole process tree, listed once it trains.

    python benchmarks/who_listens.py --out /tmp/demo --trigger 'step:2 ' -- \\
        .venv/bin/python -m recipe.nemo_gym.main --config-name nemo_gym_cpu_toy trainer.total_training_steps=4
    python benchmarks/who_listens.py --out /tmp/demo -- bash scripts/run.sh      # the demo as users run it

Runs the command in its own session with its output in ``<out>.log``; samples its process tree every 0.5 s (pids that
re-parent away stay counted once seen, and everything in its session); when ``--trigger`` first appears in the log it
lists, with ``ss -ltnp``, every listener held by one of those pids into ``<out>.ss`` (address, scope, pid, command)
and prints the count per scope -- loopback, one address, every interface -- then waits for the command and exits
with its status. The figures of docs/CLUSTER.md ("Measured: who listens where") and docs/BENCHMARKS.md come from it.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil

_USER = re.compile(r"pid=(\d+),")


def scope(host: str) -> str:
    host = host.strip("[]").removeprefix("::ffff:")
    if host in ("*", "0.0.0.0", "::"):
        return "any"
    try:
        return "loopback" if ipaddress.ip_address(host).is_loopback else "address"
    except ValueError:
        return "address"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="prefix of the log (.log) and the listing (.ss)")
    parser.add_argument("--trigger", default="step:2 ", help="list the listeners once this appears in the log")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    log_path = args.out.with_suffix(".log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    seen: dict[int, str] = {}
    listed = False
    t0 = time.monotonic()
    while proc.poll() is None:
        members = []
        try:
            root = psutil.Process(proc.pid)
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            pass
        for other in psutil.process_iter():
            try:
                if os.getsid(other.pid) == proc.pid:
                    members.append(other)
            except OSError:
                pass
        for member in members:
            try:
                seen.setdefault(member.pid, " ".join(member.cmdline())[:120] or member.name())
            except psutil.Error:
                pass
        if not listed and args.trigger in log_path.read_text(errors="replace"):
            listed = True
            time.sleep(1.0)
            rows = []
            out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
            for line in out.splitlines():
                host = line.split()[3].rpartition(":")[0]
                rows += [
                    (line.split()[3], scope(host), int(p), seen[int(p)]) for p in _USER.findall(line) if int(p) in seen
                ]
            rows = sorted(set(rows), key=lambda r: (r[1], r[3]))
            args.out.with_suffix(".ss").write_text("".join(f"{a:30s} {s:8s} {p:7d} {c}\n" for a, s, p, c in rows))
            counts = Counter(r[1] for r in rows)
            print(
                f"{time.monotonic() - t0:.0f}s: {len(rows)} listeners: {dict(counts)} -> {args.out.with_suffix('.ss')}"
            )
        time.sleep(0.5)
    print(f"exit {proc.returncode} after {time.monotonic() - t0:.0f}s; load {os.getloadavg()}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
