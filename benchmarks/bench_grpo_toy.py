#!/usr/bin/env python
"""Does GRPO raise the reward? The whole recipe on CPU with the tiny random model and the toy environment.

Runs ``python -m recipe.nemo_gym.main --config-name nemo_gym_cpu`` as a subprocess on ``configs/gym/toy_choice.yaml``
(four-option quiz whose answer is always "A"; a random model starts near 1/4), with verl's file logger on. Then it
prints the reward per step, the first-5 vs last-5 mean reward (difference and ratio), the wall time per step (verl's
``timing_s/step``) and the start-up time, and writes the reward curve PNG (``recipe/nemo_gym/reporting/report.py``).

    .venv/bin/python benchmarks/bench_grpo_toy.py [--steps 30] [--lr 1e-3] [--batch 8] [--n 8] [-- hydra overrides...]
    .venv/bin/python benchmarks/bench_grpo_toy.py --metrics logs/bench_grpo_toy/<run>/metrics.jsonl   # report only

The CPU hyper-parameters (overrides below) are chosen so the change is visible within a few dozen steps: a tiny
random model's letter logits differ by ~0.1, so a GPU-sized lr (1e-6) would take thousands of steps; with Adam at
1e-3 each step moves them by a few hundredths. One PPO update per step (mini-batch = batch) keeps it on-policy.
``logprobs_mode=raw_logprobs`` makes vLLM return the model's own logprobs (see configs/gym/toy_choice.yaml).
Not a test: CI runs tests/e2e instead. Exit status 0 when the run finished and the last-5 mean beats the first-5.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TOY_CONFIG = REPO / "configs" / "gym" / "toy_choice.yaml"
TOY_DATA = REPO / "configs" / "gym" / "data" / "toy_choice.jsonl"
TOY_AGENT = "toy_choice_simple_agent"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config-name", default="nemo_gym_cpu", help="recipe config in configs/ (default nemo_gym_cpu)")
    p.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    p.add_argument("--batch", type=int, default=8, help="prompts per step = data.train_batch_size (default 8)")
    p.add_argument("--n", type=int, default=8, help="rollouts per prompt, GRPO group size (default 8)")
    p.add_argument("--lr", type=float, default=1e-3, help="actor learning rate (default 1e-3)")
    p.add_argument("--temperature", type=float, default=1.0, help="rollout temperature (default 1.0)")
    p.add_argument("--window", type=int, default=5, help="steps averaged at each end (default 5)")
    p.add_argument("--out-dir", type=Path, help="default logs/bench_grpo_toy/<time>")
    p.add_argument("--timeout", type=float, default=3600, help="seconds before the run is stopped (default 3600)")
    p.add_argument("--metrics", type=Path, help="only report on this metrics file (no training)")
    p.add_argument("--dry-run", action="store_true", help="print the command and exit")
    p.add_argument("overrides", nargs="*", help="extra hydra overrides (after --), applied last")
    args = p.parse_args(argv)
    for key in ("steps", "batch", "n", "window"):
        if getattr(args, key) < 1:
            p.error(f"--{key} must be >= 1")
    return args


def stale_gym_overrides(config_name: str) -> list[str]:
    """Hydra deletions of the primary config's ``nemo_gym.config_overrides`` entries: they name agents of its own
    Gym environment, which would appear in the toy Gym's config as server blocks without an entrypoint."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(REPO / "configs" / f"{config_name}.yaml")
    overrides = OmegaConf.select(cfg, "nemo_gym.config_overrides", default=None) or {}
    return [f"~nemo_gym.config_overrides.{name}" for name in overrides]


def recipe_command(args: argparse.Namespace, out_dir: Path) -> list[str]:
    """The hydra command line of the run (everything the toy run changes is here)."""
    metrics_path = out_dir / "metrics.jsonl"
    micro = args.batch * args.n
    return [
        sys.executable,
        "-m",
        "recipe.nemo_gym.main",
        "--config-name",
        args.config_name,
        f"nemo_gym.config_paths=[{TOY_CONFIG}]",
        *stale_gym_overrides(args.config_name),
        f"nemo_gym.run_dir={out_dir / 'gym'}",
        f"data.train_files={TOY_DATA}",
        f"data.val_files={TOY_DATA}",
        f"data.nemo_gym.default_agent={TOY_AGENT}",
        f"data.train_batch_size={args.batch}",
        "data.max_prompt_length=256",
        # One letter is the whole reply (stop tokens); a little room shows it if that ever breaks.
        "data.max_response_length=8",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.rollout.temperature={args.temperature}",
        "actor_rollout_ref.rollout.logprobs_mode=raw_logprobs",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"trainer.total_training_steps={args.steps}",
        "trainer.total_epochs=1000",  # total_training_steps ends the run; 48 rows are many epochs
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.logger=[console,file]",
        "trainer.experiment_name=toy_choice",
        # The file logger lives in the TaskRunner (a Ray actor): tell it where to write through the runtime env.
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={metrics_path}",
        *args.overrides,
    ]


def run_recipe(cmd: list[str], out_dir: Path, timeout: float) -> tuple[int, float]:
    """Run the recipe in its own session (stopped with everything it started on timeout / Ctrl-C)."""
    from nemo_gym_adapter.runtime.procs import SessionProcess

    log = out_dir / "recipe.log"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    env["PYTHONUNBUFFERED"] = "1"
    print(f"running the recipe (log: {log}) ...", file=sys.stderr)
    t0 = time.monotonic()
    proc = SessionProcess(name="recipe", cmd=cmd, log_path=log, env=env, cwd=REPO)
    try:
        while proc.popen.poll() is None:
            if time.monotonic() - t0 > timeout:
                print(f"timeout after {timeout:.0f}s: stopping the run", file=sys.stderr)
                break
            time.sleep(2)
    finally:
        code = proc.popen.poll()
        proc.stop()  # also sweeps the session if the run left Ray/Gym processes behind
    return (code if code is not None else -1), time.monotonic() - t0


def report(metrics: Path, png: Path, window: int, wall_s: float | None = None) -> bool:
    """Print the curve, the first/last window means and timings; write the PNG. True if the reward went up."""
    from recipe.nemo_gym.reporting.curve import load_reward_curve, window_summary
    from recipe.nemo_gym.reporting.report import write_report

    print(write_report(metrics, png, window=window, table=True, wall_s=wall_s))
    return window_summary(load_reward_curve(metrics), k=window)["difference"] > 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.metrics:
        return 0 if report(args.metrics, args.metrics.with_suffix(".png"), args.window) else 1
    out_dir = (args.out_dir or REPO / "logs" / "bench_grpo_toy" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    cmd = recipe_command(args, out_dir)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "command.json").write_text(json.dumps(cmd, indent=1) + "\n")
    code, wall = run_recipe(cmd, out_dir, args.timeout)
    metrics = out_dir / "metrics.jsonl"
    print(f"recipe exit status {code} after {wall:.0f}s", file=sys.stderr)
    if not metrics.is_file() or metrics.stat().st_size == 0:
        from nemo_gym_adapter.runtime.procs import log_tail

        print(
            f"no metrics were logged; last lines of {out_dir / 'recipe.log'}:\n{log_tail(out_dir / 'recipe.log', 60)}"
        )
        return 1
    rose = report(metrics, out_dir / "reward_curve.png", args.window, wall_s=wall)
    return 0 if code == 0 and rose else 1


if __name__ == "__main__":
    sys.exit(main())
