#!/usr/bin/env python
"""verl's legacy trainer vs its v1 (TransferQueue) trainer on the same toy run, side by side.

Runs ``benchmarks/bench_grpo_toy.py``'s recipe command (toy Gym environment, tiny model, CPU) once per trainer path on the
same rows and settings, one after the other (never concurrently: they would share 2 cores), then prints per path:
start-up time, mean step time (verl's ``timing_s/step``, first step excluded), mean rollout throughput (the core's
``rollouts_per_s``), the adapter's share of a step (legacy: padding ``gym/timing/postprocess_s``; v1: building the
samples ``gym/timing/build_s`` + dispatch ``gym/timing/dispatch_s``; the TransferQueue puts overlap the rollouts and
are reported as ``tq_put_mean_s``) and the first/last-k mean reward, plus the v1/legacy
ratios. ``v1_async`` is verl's ``colocate_async`` mode: rollouts of the next batches overlap training, so the
rollout metrics (throughput, reward, adapter time) are averaged over the steps in which rollouts finished. The
1-minute load average is printed with each run (a shared machine distorts timings).

    .venv/bin/python benchmarks/bench_v1.py [--steps 10] [--paths legacy v1_sync v1_async] [-- hydra overrides...]

Not a test; run it under the heavy lock on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

PATHS = {
    "legacy": ["trainer.use_v1=false"],
    "v1_sync": ["trainer.use_v1=true", "trainer.v1.trainer_mode=sync"],
    "v1_async": ["trainer.use_v1=true", "trainer.v1.trainer_mode=colocate_async"],
}


def _get(m: dict[str, float], key: str) -> float | None:
    """A metric under its plain name (v1) or as a legacy ``timing_s/`` entry."""
    for k in (key, f"timing_s/{key}"):
        if k in m:
            return float(m[k])
    return None


def summarize(steps: dict[int, dict[str, float]], window: int) -> dict[str, float]:
    later = [m for s, m in sorted(steps.items()) if s > 1] or list(steps.values())
    out: dict[str, float] = {"steps": float(len(steps))}
    step_s = [m["timing_s/step"] for m in later if "timing_s/step" in m]
    if step_s:
        out["step_s_mean"] = statistics.mean(step_s)
    puts = [v for m in later if (v := _get(m, "gym/timing/tq_put_mean_s")) is not None]
    if puts:
        out["tq_put_mean_s"] = statistics.mean(puts)
    rates = [v for m in later if (v := _get(m, "gym/timing/rollouts_per_s")) is not None]
    if rates:
        out["rollouts_per_s_mean"] = statistics.mean(rates)
    adapter = []
    for m in later:
        parts = [_get(m, k) for k in ("gym/timing/postprocess_s", "gym/timing/build_s", "gym/timing/dispatch_s")]
        if any(p is not None for p in parts) and m.get("timing_s/step"):
            adapter.append(sum(p for p in parts if p is not None) / m["timing_s/step"])
    if adapter:
        out["adapter_share_mean"] = statistics.mean(adapter)
    rewards = [v for _, m in sorted(steps.items()) if (v := _get(m, "gym/all/reward_mean")) is not None]
    if len(rewards) >= 2 * window:
        out["reward_first"] = statistics.mean(rewards[:window])
        out["reward_last"] = statistics.mean(rewards[-window:])
    return out


def main(argv: list[str] | None = None) -> int:
    import bench_grpo_toy as toy

    from recipe.nemo_gym.reporting.curve import load_step_metrics

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--window", type=int, default=3)
    p.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS))
    p.add_argument("--out-dir", type=Path, default=None)
    p.add_argument("--timeout", type=float, default=2400)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    root = (args.out_dir or REPO / "logs" / "bench_v1" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    results: dict[str, dict[str, float]] = {}
    for name in args.paths:
        out_dir = root / name
        out_dir.mkdir(parents=True, exist_ok=True)
        toy_args = toy.parse_args(["--steps", str(args.steps), "--", *PATHS[name], *args.overrides])
        cmd = toy.recipe_command(toy_args, out_dir)
        load = os.getloadavg()[0]
        code, wall = toy.run_recipe(cmd, out_dir, args.timeout)
        metrics = out_dir / "metrics.jsonl"
        if code != 0 or not metrics.is_file():
            print(f"{name}: exit {code} after {wall:.0f}s; log {out_dir / 'recipe.log'}", file=sys.stderr)
            return 1
        summary = summarize(load_step_metrics(metrics), args.window)
        step_total = summary.get("step_s_mean", 0.0) * (summary["steps"] - 1)
        summary.update(wall_s=wall, startup_s=max(wall - step_total, 0.0), load_1min=load)
        results[name] = summary
    keys = sorted({k for r in results.values() for k in r})
    print(f"{'metric':<22}" + "".join(f"{n:>14}" for n in results))
    for k in keys:
        print(f"{k:<22}" + "".join(f"{r.get(k, float('nan')):>14.4g}" for r in results.values()))
    for name in [n for n in results if n != "legacy" and "legacy" in results]:
        for k in ("step_s_mean", "rollouts_per_s_mean", "startup_s"):
            a, b = results["legacy"].get(k), results[name].get(k)
            if a and b:
                print(f"ratio {name}/legacy {k}: {b / a:.3f}")
    (root / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
