#!/usr/bin/env python
"""Do verl's async trainer modes hide an environment's latency? sync vs colocate_async vs separate_async, side by side,
at several seconds of latency per tool call.

Runs ``python -m recipe.nemo_gym.main --config-name nemo_gym_cpu_latency`` (our ``toy_latency`` Gym server, two tool
calls per rollout, the tiny random model, 4 rows x 4 samples per step) once per (latency, mode), one after the other,
same rows and seed, and prints per run: mean step time (verl's ``timing_s/step``, the first ``--skip`` steps left out:
start-up of the pipeline), its ratio to sync at the same latency, trained rollouts per second (samples of a step /
step time), the Gym rollouts' own mean latency (``gym/timing/latency_p50``), staleness, and the training reward over
the first and last ``--window`` steps (the curve is printed too). The 1-minute load average is sampled every 10 s
during each run. Run it under both locks on a shared machine.

    .venv/bin/python benchmarks/bench_env_latency.py [--latencies 0 1 3] [--modes sync colocate_async separate_async]
        [--steps 20] [--warmup-batches 2] [-- hydra overrides for every run...]
    .venv/bin/python benchmarks/bench_env_latency.py --report DIR

Not a test. Exit status 0 when every run finished.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_step_time import run_series  # noqa: E402

CONFIG = "nemo_gym_cpu_latency"
LATENCY_KEY = "nemo_gym.config_overrides.toy_latency.resources_servers.toy_latency.tool_latency_s"
SEPARATE_ASYNC = [
    "trainer.v1.separate_async.parameter_sync_step=1",
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "ray_kwargs.ray_init.num_gpus=2",  # Ray's logical GPU slots: the actor and the standalone replica
    "actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_zmq",
    "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.nemo_gym.cpu.checkpoint_engine",
]


def mode_overrides(mode: str, warmup_batches: float) -> list[str]:
    out = [f"trainer.v1.trainer_mode={mode}"]
    if mode != "sync":
        out.append(f"trainer.v1.{mode}.num_warmup_batches={warmup_batches}")
    return out + (SEPARATE_ASYNC if mode == "separate_async" else [])


def command(latency: float, mode: str, steps: int, warmup: float, out_dir: Path, extra: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "recipe.nemo_gym.main",
        "--config-name",
        CONFIG,
        f"{LATENCY_KEY}={latency}",
        *mode_overrides(mode, warmup),
        f"trainer.total_training_steps={steps}",
        f"nemo_gym.run_dir={out_dir / 'gym'}",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={out_dir / 'metrics.jsonl'}",
        *extra,
    ]


def summarize(steps: dict[int, dict[str, float]], skip: int, window: int, samples_per_step: int) -> dict[str, float]:
    ordered = [m for _, m in sorted(steps.items())]
    later = ordered[skip:] or ordered
    out: dict[str, float] = {"steps": float(len(ordered))}
    step_s = [m["timing_s/step"] for m in later if "timing_s/step" in m]
    if step_s:
        out["step_s_mean"] = statistics.mean(step_s)
        out["rollouts_per_s"] = samples_per_step / out["step_s_mean"]
    for key, name in (
        ("timing_s/gen", "gen_s_mean"),
        ("timing_s/update_actor", "update_s_mean"),
        ("gym/timing/latency_p50", "rollout_latency_p50"),
        ("training/off_policy/trajectory_staleness/max", "staleness_max"),
    ):
        values = [m[key] for m in later if key in m]
        if values:
            out[name] = statistics.mean(values) if "staleness" not in name else max(values)
    rewards = [m["critic/score/mean"] for m in ordered if "critic/score/mean" in m]
    if len(rewards) >= 2 * window:
        out["reward_first"] = statistics.mean(rewards[:window])
        out["reward_last"] = statistics.mean(rewards[-window:])
    return out


def report(root: Path, skip: int, window: int, samples_per_step: int) -> int:
    from recipe.nemo_gym.reporting.curve import load_step_metrics

    runs = json.loads((root / "runs.json").read_text())
    table: dict[str, dict[str, float]] = {}
    for name, meta in runs.items():
        metrics = root / name / "metrics.jsonl"
        steps = load_step_metrics(metrics) if metrics.is_file() else {}
        s = summarize(steps, skip, window, samples_per_step)
        s.update(meta)
        table[name] = s
        curve = " ".join(f"{m.get('critic/score/mean', float('nan')):.2f}" for _, m in sorted(steps.items()))
        times = " ".join(f"{m.get('timing_s/step', float('nan')):.1f}" for _, m in sorted(steps.items()))
        print(
            f"{name}: exit {int(meta['exit'])}, wall {meta['wall_s']:.0f} s, load {meta['load_start']:.1f} -> "
            f"mean {meta['load_mean']:.1f} (max {meta['load_max']:.1f})\n  reward per step: {curve}\n"
            f"  step time per step (s): {times}"
        )
    cols = (
        "step_s_mean",
        "ratio_to_sync",
        "rollouts_per_s",
        "gen_s_mean",
        "update_s_mean",
        "rollout_latency_p50",
        "staleness_max",
        "reward_first",
        "reward_last",
        "load_mean",
    )
    for name, s in table.items():
        latency, _, mode = name.partition("s_")
        sync = table.get(f"{latency}s_sync", {}).get("step_s_mean")
        if sync and "step_s_mean" in s:
            s["ratio_to_sync"] = s["step_s_mean"] / sync
    print("\n" + f"{'run':<24}" + "".join(f"{c:>20}" for c in cols))
    for name, s in table.items():
        print(f"{name:<24}" + "".join(f"{s[c]:>20.3g}" if c in s else f"{'':>20}" for c in cols))
    (root / "summary.json").write_text(json.dumps(table, indent=1) + "\n")
    return 0 if all(int(m["exit"]) == 0 for m in runs.values()) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--latencies", type=float, nargs="+", default=[0.0, 1.0, 3.0])
    p.add_argument("--modes", nargs="+", default=["sync", "colocate_async", "separate_async"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--skip", type=int, default=2, help="first steps left out of the step-time mean")
    p.add_argument("--window", type=int, default=5, help="steps averaged at each end of the reward curve")
    p.add_argument("--warmup-batches", type=float, default=2, help="num_warmup_batches of the async modes")
    p.add_argument("--samples-per-step", type=int, default=16, help="train_batch_size x n of the config")
    p.add_argument("--out-dir", type=Path)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--report", type=Path)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    if args.report:
        return report(args.report, args.skip, args.window, args.samples_per_step)
    root = (args.out_dir or REPO / "logs" / "bench_env_latency" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    commands = {
        f"{latency:g}s_{mode}": lambda out, latency=latency, mode=mode: command(
            latency, mode, args.steps, args.warmup_batches, out, args.overrides
        )
        for latency in args.latencies
        for mode in args.modes
    }
    run_series(root, commands, args.timeout)
    return report(root, args.skip, args.window, args.samples_per_step)


if __name__ == "__main__":
    sys.exit(main())
