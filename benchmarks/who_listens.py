"""Who listens where while a command runs: the TCP listeners of its whole process tree, listed once it trains.

    python benchmarks/who_listens.py --out /tmp/demo --trigger 'step:2 ' -- \\
        .venv/bin/python -m recipe.nemo_gym.main --config-name nemo_gym_cpu_toy trainer.total_training_steps=4
    python benchmarks/who_listens.py --out /tmp/demo -- bash scripts/run.sh      # the demo as users run it
    python benchmarks/who_listens.py --out /tmp/demo --knock -- ...               # and what each answers a stranger

Runs the command in its own session with its output in ``<out>.log``; ``tests.support.listeners.TreeListeners``
samples its process tree every 0.5 s (pids that re-parent away stay counted once seen, and everything in its
session) and, when ``--trigger`` first appears in the log, lists every listener held by one of those pids (psutil);
they go to ``<out>.ss`` (address, scope, pid, command) with the count per scope -- loopback, one address, every
interface -- printed. With ``--knock``, each listener gets ``tests.support.listeners.KNOCKS`` without any key, there
and then, and what it answered (a status, or no HTTP) goes to ``<out>.knock`` with the count of listeners that served
a 2xx printed. Then it waits for the command and exits with its status. The figures of docs/CLUSTER.md ("Measured:
who listens where") and docs/BENCHMARKS.md come from it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.listeners import TreeListeners, knock_table, table  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="prefix of the log (.log) and the listing (.ss)")
    parser.add_argument("--trigger", default="step:2 ", help="list the listeners once this appears in the log")
    parser.add_argument("--knock", action="store_true", help="send each listener HTTP requests without a key")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    log_path = args.out.with_suffix(".log")
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    # Stopped (SIGTERM, e.g. a timeout): the run is stopped as a whole, as its own SIGTERM handling does, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(proc.pid, signal.SIGTERM))
    watch = TreeListeners(proc.pid, log_path, args.trigger, knock=args.knock)
    watch.start()
    proc.wait()
    watch.stop()
    if watch.found is None:
        print(f"{args.trigger!r} never appeared in {log_path}: nothing listed")
    else:
        found = sorted(watch.found, key=lambda item: (item.scope, item.process))
        args.out.with_suffix(".ss").write_text(table(found) + "\n")
        counts = Counter(item.scope for item in found)
        print(f"{len(found)} listeners of {len(watch.pids)} pids: {dict(counts)} -> {args.out.with_suffix('.ss')}")
        if watch.knocks is not None:
            knocks = sorted(watch.knocks, key=lambda k: (k.listener.process, k.listener.port))
            args.out.with_suffix(".knock").write_text(knock_table(knocks) + "\n")
            opened = [k for k in knocks if k.opened]
            print(
                f"{len(opened)} of {len(knocks)} listeners served a request without a key -> {args.out.with_suffix('.knock')}"
            )
            if opened:
                print(knock_table(opened))
    print(f"exit {proc.returncode} after {time.monotonic() - t0:.0f}s; load {os.getloadavg()}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
