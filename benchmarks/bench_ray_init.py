"""What ``ray.init`` of the run's own Ray costs with a token of its own only, and with all the access settings the
recipe gives it (``nemo_gym_adapter.access.listen``: loopback only, the token, the metrics exporters off -- two of them
pointed at a port no socket can bind), side by side.

    .venv/bin/python benchmarks/bench_ray_init.py [--repeats 2]

Each measurement is a fresh interpreter (``import ray`` outside the timing): ``ray.init(address="local",
include_dashboard=False, num_cpus=2)`` to connected, then ``ray.shutdown()`` (timed too); the arms alternate. Prints
each arm's medians, the ratio and the load average. Starts Ray: run it alone (``flock /work/locks/heavy`` here).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODE = """
import json, time, ray
t = time.perf_counter()
ray.init(address="local", include_dashboard=False, num_cpus=2, log_to_driver=False)
up = time.perf_counter() - t
t = time.perf_counter()
ray.shutdown()
print(json.dumps({"init": up, "shutdown": time.perf_counter() - t}))
"""


def token_env() -> dict[str, str]:
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}  # as listen.ray_token_env makes it


def access_env() -> dict[str, str]:
    from nemo_gym_adapter.access import listen

    return {**listen.LOCAL_ONLY_ENV, **token_env(), **listen.ray_exporters_env({})}


def measure(extra: dict[str, str]) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run(
        [sys.executable, "-c", CODE], env={**env, **extra}, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    if out.returncode != 0:
        raise SystemExit(f"ray.init failed ({sorted(extra)}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    arms = {"token": token_env(), "access": access_env()}
    print(f"load average before: {os.getloadavg()}")
    results: dict[str, list[dict[str, float]]] = {arm: [] for arm in arms}
    for _ in range(args.repeats):
        for arm, extra in arms.items():
            results[arm].append(measure(extra))
    medians = {}
    for arm, runs in results.items():
        medians[arm] = {key: statistics.median(r[key] for r in runs) for key in ("init", "shutdown")}
        print(
            f"{arm:7s} ray.init median {medians[arm]['init']:.2f} s, shutdown {medians[arm]['shutdown']:.2f} s: {runs}"
        )
    print(f"access / token, ray.init: {medians['access']['init'] / medians['token']['init']:.2f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
