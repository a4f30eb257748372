#!/usr/bin/env python
"""Partial rollouts vs regenerating: what happens to turns a weight sync interrupts, side by side.

Runs the recipe twice on the same config, rows and seed, one run after the other: ``nemo_gym.partial_rollouts=true``
(a turn verl's async trainer aborts for a weight sync is resumed inside the patched vLLM server from the tokens it
had) and ``false`` (today's fallback: the abort guard answers 503 and Gym regenerates the turn from its start). Both
use an async v1 trainer mode with a weight sync every step. Default load: ``nemo_gym_cpu`` (Gym's
``example_single_tool_call``; the tiny random model writes turns up to 192 tokens, so generations are in flight at a
sync) in ``colocate_async`` with ``num_warmup_batches=4`` (rollouts of four batches ahead run while the actor trains).

Per run it prints, from the last step's cumulative ``gym/engine/*_total`` counters (summed over the server actors):
turns interrupted, resumes, turns resumed whole, tokens kept across seams, turns refused (and why), 503s and the
tokens they threw away (``regenerated_tokens``: generated again after the retry); and from every step: mean step time,
staleness max, the masked ``aborted`` rate, the mean reward, wall time and the 1-minute load average at its start.

    .venv/bin/python benchmarks/bench_partial_rollouts.py [--steps 8] [--mode colocate_async] [-- hydra overrides...]

Not a test; run it under the heavy lock. ``PYTHONPATH`` is set to this checkout for the recipe and its Ray workers.
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

from bench_step_time import run_variant  # noqa: E402  (one way to run the recipe in its own session)

MODES = {
    "colocate_async": ["trainer.v1.trainer_mode=colocate_async"],
    "separate_async": [
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.parameter_sync_step=1",
        "actor_rollout_ref.hybrid_engine=false",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "ray_kwargs.ray_init.num_gpus=2",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_zmq",
        "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.nemo_gym.cpu.checkpoint_engine",
    ],
}
COUNTS = (
    "interrupted_turns",
    "resumes",
    "resumed_turns",
    "resumed_tokens",
    "refused_turns",
    "aborted_turns",
    "regenerated_tokens",
    "seam_stop_cuts",
)


def recipe_command(args: argparse.Namespace, partial: bool, out_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "recipe.nemo_gym.main",
        "--config-name",
        args.config_name,
        "trainer.use_v1=true",
        *MODES[args.mode],
        f"trainer.v1.{args.mode}.num_warmup_batches={args.warmup}",
        f"nemo_gym.partial_rollouts={str(partial).lower()}",
        f"trainer.total_training_steps={args.steps}",
        f"nemo_gym.run_dir={out_dir / 'gym'}",
        f"hydra.run.dir={out_dir / 'hydra'}",
        "trainer.logger=[console,file]",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={out_dir / 'metrics.jsonl'}",
        *args.overrides,
    ]


def summarize(steps: dict[int, dict[str, float]]) -> dict[str, float]:
    ordered = [m for _, m in sorted(steps.items())]
    last_counts = next((m for m in reversed(ordered) if "gym/engine/interrupted_turns_total" in m), {})
    out: dict[str, float] = {"steps": float(len(ordered))}
    for key in COUNTS:
        out[key] = float(last_counts.get(f"gym/engine/{key}_total", float("nan")))
    for key, value in last_counts.items():
        if key.startswith("gym/engine/refused/"):
            out["refused/" + key.removeprefix("gym/engine/refused/").removesuffix("_total")] = float(value)
    later = ordered[1:] or ordered
    step_s = [m["timing_s/step"] for m in later if "timing_s/step" in m]
    out["step_s_mean"] = statistics.mean(step_s) if step_s else float("nan")
    stale = [m.get("training/off_policy/trajectory_staleness/max", 0.0) for m in ordered]
    out["staleness_max"] = max(stale) if stale else float("nan")
    out["masked_aborted_sum"] = sum(m.get("gym/all/masked_rate/aborted", 0.0) for m in ordered)
    rewards = [m["gym/all/reward_mean"] for m in ordered if "gym/all/reward_mean" in m]
    out["reward_mean"] = statistics.mean(rewards) if rewards else float("nan")
    return out


def main(argv: list[str] | None = None) -> int:
    from recipe.nemo_gym.reporting.curve import load_step_metrics

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config-name", default="nemo_gym_cpu")
    p.add_argument("--mode", default="colocate_async", choices=list(MODES))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=float, default=4, help="the mode's num_warmup_batches (default 4)")
    p.add_argument("--runs", nargs="+", default=["partial", "regenerate"], choices=["partial", "regenerate"])
    p.add_argument("--out-dir", type=Path, default=None)
    p.add_argument("--timeout", type=float, default=2400)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    root = (args.out_dir or REPO / "logs" / "bench_partial_rollouts" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    results: dict[str, dict[str, float]] = {}
    for name in args.runs:
        out_dir = root / name
        out_dir.mkdir(parents=True, exist_ok=True)
        cmd = recipe_command(args, name == "partial", out_dir)
        load = os.getloadavg()[0]
        print(f"{name}: running (log {out_dir / 'recipe.log'}, load {load:.1f}) ...", file=sys.stderr)
        code, wall = run_variant(cmd, out_dir, args.timeout)
        metrics = out_dir / "metrics.jsonl"
        if code != 0 or not metrics.is_file():
            print(f"{name}: exit {code} after {wall:.0f}s; log {out_dir / 'recipe.log'}", file=sys.stderr)
            return 1
        results[name] = {**summarize(load_step_metrics(metrics)), "wall_s": wall, "load_1min": load}
    keys = sorted({k for r in results.values() for k in r})
    print(f"{args.config_name}, {args.mode}, {args.steps} steps, a weight sync every step")
    print(f"{'metric':<28}" + "".join(f"{n:>14}" for n in results))
    for k in keys:
        print(f"{k:<28}" + "".join(f"{r.get(k, float('nan')):>14.4g}" for r in results.values()))
    (root / "summary.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
