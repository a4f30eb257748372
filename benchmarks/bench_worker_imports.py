"""What ``import verl`` costs in every process of a CPU run (the driver before ``ray.init``, the TaskRunner, each
worker), with the CPU backend loaded the old way (``recipe.nemo_gym.cpu.rollout``: vLLM imported everywhere) and
the new one (``recipe.nemo_gym.cpu.registry``: vLLM imported where verl builds the replicas).

    .venv/bin/python benchmarks/bench_worker_imports.py [--repeats 3]

Each measurement is a fresh interpreter (``VERL_USE_EXTERNAL_MODULES`` set, as Ray sets it in a worker), the two
arms alternating; prints each arm's median, their ratio and the load average before and after. Run it alone on the
machine (``flock /work/locks/heavy`` here): it is CPU-bound.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARMS = {
    "old (cpu.rollout)": "recipe.nemo_gym.cpu.platform,recipe.nemo_gym.cpu.rollout",
    "new (cpu.registry)": "recipe.nemo_gym.cpu.platform,recipe.nemo_gym.cpu.registry",
}
CODE = "import time, sys; t = time.perf_counter(); import verl; print(time.perf_counter() - t, 'vllm' in sys.modules)"


def measure(modules: str) -> tuple[float, bool]:
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": modules, "VERL_PLATFORM": "cpu", "VLLM_TARGET_DEVICE": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", CODE], env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=True
    )
    seconds, vllm = out.stdout.split()[-2:]
    return float(seconds), vllm == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    measure(ARMS["new (cpu.registry)"])  # warm the page cache once, not counted
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    imported: dict[str, bool] = {}
    for _ in range(args.repeats):
        for arm, modules in ARMS.items():
            seconds, imported[arm] = measure(modules)
            times[arm].append(seconds)
    for arm, values in times.items():
        print(
            f"{arm:20s} import verl: median {statistics.median(values):.2f} s of {values}; vLLM imported: "
            f"{imported[arm]}"
        )
    old, new = (statistics.median(v) for v in times.values())
    print(f"new / old: {new / old:.2f} ({old - new:+.2f} s per process that imports verl)")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
