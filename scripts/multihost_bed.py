"""Build and tear down the multi-host test bed: hosts as network namespaces, a Ray cluster across them.

    python scripts/multihost_bed.py up [--hosts 3] [--gpu-hosts 2,3]   # build, print it, hold until SIGTERM/Ctrl-C
    python scripts/multihost_bed.py check [--hosts 3]                  # build, run a task on every host, tear down
    python scripts/multihost_bed.py sweep [--all]                      # remove the leftovers of dead beds

Host 1 is this machine's own namespace (10.77.0.1 on a bridge; the Ray head, the trainer); hosts 2.. are namespaces
``ngv<pid>h<i>`` (10.77.0.<i>) with a Ray worker node each (``--gpu-hosts`` get one logical GPU: verl places its actor
ranks, and so its vLLM replicas, there). Run something on a host with ``ip netns exec ngv<pid>h<i> <cmd>``; join the
cluster with ``ray.init(address=<ray_address>)`` or ``ray_kwargs.ray_init.address=<ray_address>``. ``up`` prints one
JSON line when ready and one after teardown (``leftovers`` empty when nothing was left on any host; exit status 1
otherwise). Needs root for namespaces; falls back to loopback addresses 127.77.0.<i> otherwise (``--mode``). Heavy:
run it under ``flock /work/wt/heavy.lock`` on the shared machine. The library is
``tests.support.multihost`` (hosts: ``tests.support.hostnet``); ``tests/integration/gym/test_multihost.py`` uses it.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: the bed lives in tests/support


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("up", "check"):
        s = sub.add_parser(name)
        s.add_argument("--hosts", type=int, default=3)
        s.add_argument("--gpu-hosts", default="2,3", help="hosts with one logical GPU each (comma-separated)")
        s.add_argument("--mode", choices=("auto", "netns", "loopback"), default="auto")
    sweep = sub.add_parser("sweep")
    sweep.add_argument("--all", action="store_true", help="also beds whose owner is alive")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)

    from tests.support.hostnet import sweep_stale
    from tests.support.multihost import MultiHostBed

    if args.command == "sweep":
        print(json.dumps({"removed": sweep_stale(all_owners=args.all)}))
        return 0
    gpus = {int(i): {"GPU": 1} for i in args.gpu_hosts.split(",") if i.strip() and int(i) <= args.hosts}
    bed = MultiHostBed(hosts=args.hosts, resources=gpus, mode=args.mode)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # the bed's own handler runs first and tears down; then we print
        signal.signal(sig, lambda *_: stop.set())
    bed.start()
    hosts = [{"name": h.name, "address": h.address, "netns": h.netns} for h in bed.hosts]
    pids = {h.name: sorted(bed.processes_on(h)) for h in bed.hosts}
    print(
        json.dumps(
            {
                "mode": bed.mode,
                "ray_address": bed.ray_address,
                "hosts": hosts,
                "pids": pids,
                "run_dir": str(bed.run_dir),
                **bed.timings,
            }
        ),
        flush=True,
    )
    if args.command == "check":
        _check(bed)
    else:
        while not stop.wait(1.0):
            pass
    leftovers = bed.close()
    print(json.dumps({"teardown_s": bed.timings.get("teardown_s"), "leftovers": asdict(leftovers)}), flush=True)
    return 1 if leftovers else 0


def _check(bed) -> None:
    """Join as the driver on host 1 and run a task on every host; each must report its own host's address."""
    import ray

    t0 = time.perf_counter()
    ray.init(address=bed.ray_address, log_to_driver=False)
    try:

        @ray.remote(num_cpus=0)
        def where() -> str:
            return ray.util.get_node_ip_address()

        got = {h.name: ray.get(where.options(resources={h.name: 0.01}).remote(), timeout=120) for h in bed.hosts}
    finally:
        ray.shutdown()
    wrong = {name: ip for name, ip in got.items() if ip != next(h.address for h in bed.hosts if h.name == name)}
    print(json.dumps({"tasks": got, "wrong": wrong, "driver_s": time.perf_counter() - t0}), flush=True)
    if wrong:
        raise SystemExit(f"tasks ran at the wrong addresses: {wrong}")


if __name__ == "__main__":
    sys.exit(main())
