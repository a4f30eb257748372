#!/usr/bin/env python
"""Step time of the real-model run, variant against variant, on the same rows: where a step's time goes and whether
the learning curve moved.

Runs ``python -m recipe.nemo_gym.main --config-name nemo_gym_cpu_smollm2_math`` (SmolLM2-135M-Instruct on Gym's
``math_with_judge``, 4 questions x 8 samples per step) once per variant, one after the other (never concurrently:
they would share the 2 cores), with verl's file logger on and the same data seed, then prints per variant and step:
verl's step time (``timing_s/step``; validation is timed apart, ``timing_s/testing``), its parts (``timing_s/gen``,
``old_log_prob``, ``update_actor``, ``update_weights``), whether the old log-probs were recomputed that step
(``onpolicy/trusted``), the guard's gap where it ran, the training reward and the greedy validation success; then
each variant's means and its ratio to the first variant. The load average (1 min) is sampled every 10 s while each
variant runs and printed with it: a shared machine distorts timings, run it under both locks.

    .venv/bin/python benchmarks/bench_step_time.py [--steps 12] [--test-freq 4 | --no-val] [--variants baseline trusted recompute shipped]
        [-- hydra overrides for every variant...]
    .venv/bin/python benchmarks/bench_step_time.py --report DIR   # the table again from a finished run's DIR

Variants (``VARIANTS``) are hydra overrides on top of the config; ``--variant-args NAME=OVERRIDE`` adds one more
override to one variant (repeatable). Not a test; exit status 0 when every variant finished.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CONFIG = "nemo_gym_cpu_smollm2_math"
# Ray's default for a worker without a whole CPU: one compute thread (what CPU runs had before the config set it).
ONE_THREAD = 'ray_kwargs.ray_init.runtime_env.env_vars.OMP_NUM_THREADS="1"'
VARIANTS: dict[str, list[str]] = {
    # The step issue 26 started from: the old log-probs recomputed by the actor on every step, one compute thread.
    "baseline": ["nemo_gym.trusted_logprobs.enable=false", ONE_THREAD],
    # The rollout's log-probs as the old ones, recomputed only on the guard's steps; one compute thread.
    "trusted": ["nemo_gym.trusted_logprobs.enable=true", ONE_THREAD],
    # The old log-probs recomputed every step, every core (the threads' effect alone).
    "recompute": ["nemo_gym.trusted_logprobs.enable=false"],
    # No override at all: whatever the config ships (trusted log-probs, every core).
    "shipped": [],
}
PARTS = ("gen", "old_log_prob", "update_actor", "update_weights")


def recipe_command(
    config_name: str, steps: int, test_freq: int, out_dir: Path, overrides: list[str], validate: bool = True
) -> list[str]:
    val = [f"trainer.test_freq={test_freq}", "trainer.val_before_train=true"]
    return [
        sys.executable,
        "-m",
        "recipe.nemo_gym.main",
        "--config-name",
        config_name,
        f"trainer.total_training_steps={steps}",
        *(val if validate else ["trainer.test_freq=-1", "trainer.val_before_train=false"]),
        "trainer.logger=[console,file]",
        f"nemo_gym.run_dir={out_dir / 'gym'}",
        # The file logger lives in the TaskRunner (a Ray actor): tell it where to write through the runtime env.
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={out_dir / 'metrics.jsonl'}",
        *overrides,
    ]


class LoadSampler:
    """The 1-minute load average every ``period`` seconds on a thread, until :meth:`stop`."""

    def __init__(self, period: float = 10.0) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def _run(self, period: float) -> None:
        while not self._stop.wait(period):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join()
        s = self.samples
        return {"load_start": s[0], "load_mean": statistics.mean(s), "load_max": max(s), "load_end": s[-1]}


def run_variant(cmd: list[str], out_dir: Path, timeout: float) -> tuple[int, float]:
    """Run the recipe in its own session (everything it started is stopped on timeout or Ctrl-C); our tree first
    on every process's path (Ray workers too: PYTHONPATH is inherited)."""
    from nemo_gym_adapter.runtime.procs import SessionProcess

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    t0 = time.monotonic()
    proc = SessionProcess(name="recipe", cmd=cmd, log_path=out_dir / "recipe.log", env=env, cwd=REPO)
    try:
        while proc.popen.poll() is None and time.monotonic() - t0 < timeout:
            time.sleep(2)
    finally:
        code = proc.popen.poll()
        proc.stop()
    return (code if code is not None else -1), time.monotonic() - t0


def run_series(root: Path, commands: dict[str, Any], timeout: float) -> dict[str, dict[str, float]]:
    """Run each named command (``out_dir -> argv``) in turn into ``root/<name>``, the load sampled while it runs;
    ``root/runs.json`` (exit, wall, load) rewritten after each."""
    info: dict[str, dict[str, float]] = {}
    for name, make in commands.items():
        out_dir = root / name
        out_dir.mkdir(parents=True, exist_ok=True)
        cmd = make(out_dir)
        (out_dir / "command.json").write_text(json.dumps(cmd, indent=1) + "\n")
        print(f"[bench] {name}: {' '.join(cmd[3:])}", file=sys.stderr, flush=True)
        sampler = LoadSampler()
        code, wall = run_variant(cmd, out_dir, timeout)
        info[name] = {"exit": float(code), "wall_s": wall, **sampler.stop()}
        (root / "runs.json").write_text(json.dumps(info, indent=1) + "\n")
        print(f"[bench] {name}: exit {code} after {wall:.0f} s", file=sys.stderr, flush=True)
    return info


def _val_key(steps: dict[int, dict[str, float]]) -> str | None:
    """verl's greedy validation reward of the (one) environment: math_with_judge's reward is its success (0/1)."""
    keys = sorted({k for m in steps.values() for k in m if k.startswith("val-core/") and "/reward/mean@" in k})
    return keys[0] if keys else None


def step_rows(steps: dict[int, dict[str, float]]) -> list[dict[str, float]]:
    """One row per logged step: timings (step without validation), recompute flag, gap, reward, validation."""
    val_key = _val_key(steps)
    rows = []
    for step, m in sorted(steps.items()):
        row: dict[str, float] = {"step": float(step)}
        if "timing_s/step" in m and "timing_s/testing" not in m:
            row["step_s"] = m["timing_s/step"]  # a step that validated: verl's v1 step timer is not the step's there
        for part in PARTS:
            if f"timing_s/{part}" in m:
                row[part] = m[f"timing_s/{part}"]
        for src, dst in (
            ("onpolicy/trusted", "trusted"),
            ("onpolicy/logprob_abs_diff_mean", "gap_mean"),
            ("onpolicy/logprob_abs_diff_max", "gap_max"),
            ("onpolicy/guard/within", "within"),
            ("gym/all/reward_mean", "reward"),
            ("actor/entropy", "entropy"),
            ("onpolicy/rollout_nll_mean", "rollout_nll"),
        ):
            if src in m:
                row[dst] = m[src]
        if val_key and val_key in m:
            row["val"] = m[val_key]
        rows.append(row)
    return rows


def summarize(rows: list[dict[str, float]]) -> dict[str, float]:
    train = [r for r in rows if "step_s" in r]
    out: dict[str, float] = {"steps": float(len(train))}
    for key in ("step_s", *PARTS, "reward"):
        values = [r[key] for r in train if key in r]
        if values:
            out[f"{key}_mean"] = statistics.mean(values)
    recomputed = [r for r in train if r.get("trusted", 0.0) < 0.5]
    out["recompute_steps"] = float(len(recomputed))
    later = [r["step_s"] for r in train if r["step"] > 1]  # step 1 pays warm-up and is the guard's first check
    if later:
        out["step_s_after_1_mean"] = statistics.mean(later)
    return out


def print_variant(name: str, rows: list[dict[str, float]], info: dict[str, float]) -> None:
    cols = (
        "step",
        "step_s",
        *PARTS,
        "trusted",
        "within",
        "gap_mean",
        "gap_max",
        "reward",
        "entropy",
        "rollout_nll",
        "val",
    )
    print(
        f"\n== {name}: exit {int(info['exit'])}, wall {info['wall_s']:.0f} s, load average (1 min) start "
        f"{info['load_start']:.1f} mean {info['load_mean']:.1f} max {info['load_max']:.1f} end {info['load_end']:.1f}"
    )
    print("".join(f"{c:>14}" for c in cols))
    for r in rows:
        print("".join(f"{r[c]:>14.4g}" if c in r else f"{'':>14}" for c in cols))


def report(root: Path) -> int:
    from recipe.nemo_gym.reporting.curve import load_step_metrics

    info = json.loads((root / "runs.json").read_text())
    summaries: dict[str, dict[str, float]] = {}
    for name, meta in info.items():
        metrics = root / name / "metrics.jsonl"
        rows = step_rows(load_step_metrics(metrics)) if metrics.is_file() else []
        print_variant(name, rows, meta)
        summaries[name] = summarize(rows)
    names = list(summaries)
    keys = sorted({k for s in summaries.values() for k in s})
    print("\n" + f"{'mean':<22}" + "".join(f"{n:>14}" for n in names))
    for k in keys:
        print(f"{k:<22}" + "".join(f"{s.get(k, float('nan')):>14.4g}" for s in summaries.values()))
    base = names[0]
    for name in names[1:]:
        for key, what in (("step_s_mean", "every step"), ("step_s_after_1_mean", "steps 2+")):
            a, b = summaries[base].get(key), summaries[name].get(key)
            if a and b:
                print(f"ratio {name}/{base} step time, {what} (steps that validated excluded): {b / a:.3f}")
    return 0 if all(int(m["exit"]) == 0 for m in info.values()) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config-name", default=CONFIG)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--test-freq", type=int, default=4)
    p.add_argument("--no-val", action="store_true", help="no validation pass (step times only: a short paired run)")
    p.add_argument("--variants", nargs="+", default=["baseline", "trusted"], choices=list(VARIANTS))
    p.add_argument("--variant-args", action="append", default=[], metavar="NAME=OVERRIDE")
    p.add_argument("--out-dir", type=Path)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--report", type=Path, help="only print the report of a finished run's directory")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    if args.report:
        return report(args.report)
    extra: dict[str, list[str]] = {}
    for item in args.variant_args:
        name, _, override = item.partition("=")
        if name not in args.variants or not override:
            p.error(f"--variant-args {item!r}: want NAME=OVERRIDE with NAME one of {args.variants}")
        extra.setdefault(name, []).append(override)
    root = (args.out_dir or REPO / "logs" / "bench_step_time" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    commands = {
        name: lambda out, name=name: recipe_command(
            args.config_name,
            args.steps,
            args.test_freq,
            out,
            [*VARIANTS[name], *extra.get(name, []), *args.overrides],
            not args.no_val,
        )
        for name in args.variants
    }
    run_series(root, commands, args.timeout)
    return report(root)


if __name__ == "__main__":
    sys.exit(main())
