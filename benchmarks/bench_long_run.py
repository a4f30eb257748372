#!/usr/bin/env python
"""A long CPU run with everything a week-long run has on (validation, checkpoints, rollout dumps), watched from outside.

Launches the recipe (default: the shipped multi-environment config, 200 steps) and samples every process it started
every ``--every`` seconds: the driver and its descendants (Ray's core processes, the TaskRunner, the agent-loop
manager, the FSDP and vLLM workers) and every process in the sessions the run's pid records name (Gym's launchers,
servers and Ray head, the watchdog), which are not the driver's descendants. Per process role: RSS, threads, open
files, sockets. At the end it prints, per role, step ``--early`` vs the last step, the ratio, and each environment's
greedy validation against its best before ``--best-before`` (issue 20's "done when"), and writes

    <out>/samples.jsonl     one line per sample: time, step, load average, per-role totals
    <out>/summary.json      the table below as JSON
    <out>/val_curve.png     greedy validation per environment + training reward per environment

    .venv/bin/python benchmarks/bench_long_run.py --out /tmp/long200 [--steps 200] [-- hydra overrides...]

The 1-minute load average is printed with each figure. Not a test: ~1 h on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from recipe.nemo_gym.reporting.curve import (  # noqa: E402
    ALL_SCOPE,
    MetricsFileError,
    RewardCurve,
    load_step_metrics,
    reward_curve,
)

# Ray sets a worker's process title to ``ray::<Actor>.<method>`` (or ``ray::IDLE``); the class names it.
_RAY_TITLE = re.compile(r"^ray::([A-Za-z_][A-Za-z0-9_]*)")
_TITLE = re.compile(r"^[A-Za-z]+::[A-Za-z_]+$")


def role_of(proc: psutil.Process, driver: int, gym_sessions: set[int]) -> str:
    """A stable name for what a process is, so samples add up per role across the run."""
    try:
        if proc.pid == driver:
            return "driver"
        cmd = proc.cmdline()
        sid = os.getsid(proc.pid)
    except (psutil.Error, OSError):
        return "gone"
    title = " ".join(cmd)
    if m := _RAY_TITLE.match(cmd[0] if cmd else ""):
        return f"ray::{m.group(1)}"
    if m := _TITLE.match(cmd[0] if cmd else ""):  # e.g. VLLM::EngineCore
        return m.group(0)
    if "nemo_gym_adapter.runtime.reaper" in title:
        return "watchdog"
    if sid in gym_sessions:
        return "gym::ray" if ("raylet" in title or "gcs_server" in title or "ray/" in title) else "gym"
    name = Path(cmd[0]).name if cmd else proc.name()
    if name in {"gcs_server", "raylet"} or "ray/_private" in title or "ray/dashboard" in title:
        return f"ray-core::{name if name in {'gcs_server', 'raylet'} else 'other'}"
    return f"other::{name}"


def gym_sessions(run_dir: Path) -> set[int]:
    sessions: set[int] = set()
    for rec in run_dir.rglob("*.pid") if run_dir.is_dir() else []:
        try:
            sessions.update(int(s) for s in json.loads(rec.read_text()).get("sessions", []))
        except (OSError, ValueError, AttributeError):
            continue
    return sessions


def sample(driver: int, run_dir: Path, seen_sessions: set[int]) -> dict[str, dict[str, float]]:
    seen_sessions |= gym_sessions(run_dir)
    procs: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(driver)
        procs[driver] = root
        procs.update({p.pid: p for p in root.children(recursive=True)})
    except psutil.Error:
        pass
    for p in psutil.process_iter():
        try:
            cmd = " ".join(p.cmdline())
            if os.getsid(p.pid) in seen_sessions or ("nemo_gym_adapter.runtime.reaper" in cmd and str(run_dir) in cmd):
                procs.setdefault(p.pid, p)
        except (psutil.Error, OSError):
            continue
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for p in procs.values():
        role = role_of(p, driver, seen_sessions)
        try:
            with p.oneshot():
                t = totals[role]
                t["rss_mb"] += p.memory_info().rss / 2**20
                t["threads"] += p.num_threads()
                t["fds"] += p.num_fds()
                t["sockets"] += len(p.net_connections(kind="all"))
                t["procs"] += 1
        except psutil.Error:
            continue
    return {r: dict(v) for r, v in totals.items() if r != "gone"}


def last_step(metrics: dict[int, dict[str, float]]) -> int:
    return max((s for s, m in metrics.items() if "training/global_step" in m), default=0)


def validation_check(metrics: dict[int, dict[str, float]], best_before: int) -> dict[str, dict]:
    """Per environment: greedy validation at each pass, its best before ``best_before``, and whether every later
    pass stayed at or above it."""
    out: dict[str, dict] = {}
    key = re.compile(r"^val-core/(?P<env>[^/]+)/reward/mean@1$")
    for step, m in sorted(metrics.items()):
        for k, v in m.items():
            if (mm := key.match(k)) and mm["env"] != "all":
                out.setdefault(mm["env"], {"passes": {}})["passes"][step] = float(v)
    for d in out.values():
        early = [v for s, v in d["passes"].items() if s < best_before]
        later = {s: v for s, v in d["passes"].items() if s >= best_before}
        d["best_before"] = max(early) if early else None
        d["min_after"] = min(later.values()) if later else None
        d["kept"] = bool(early) and all(v >= d["best_before"] for v in later.values())
    return out


def env_rewards(curve: RewardCurve) -> dict[str, list[float]]:
    """Each environment's training reward series (aligned with ``curve.steps``), without the overall one."""
    return {env: values for env, values in curve.reward.items() if env != ALL_SCOPE}


def plot(curve: RewardCurve, val: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    for env, d in val.items():
        xs = sorted(d["passes"])
        a.plot(xs, [d["passes"][s] for s in xs], marker="o", label=env)
    a.set_ylabel("greedy validation reward")
    a.legend()
    for env, values in env_rewards(curve).items():
        b.plot(curve.steps, values, label=env, alpha=0.8)
    b.set_xlabel("step")
    b.set_ylabel("training reward (batch mean)")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--config", default="nemo_gym_cpu_multi_env")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--save-freq", type=int, default=50)
    ap.add_argument("--early", type=int, default=20, help="the step memory is compared against")
    ap.add_argument("--best-before", type=int, default=50)
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--report-only", action="store_true", help="print the report of an earlier run in --out")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        run(args, out)
    return report(out, args.early, args.best_before)


def run(args: argparse.Namespace, out: Path) -> None:
    """Launch the recipe and sample its processes until it ends; ``<out>/samples.jsonl`` and ``<out>/result.json``."""
    run_dir = out / "run"
    cmd = [
        sys.executable, "-m", "recipe.nemo_gym.main", "--config-name", args.config,
        f"trainer.total_training_steps={args.steps}", f"trainer.save_freq={args.save_freq}",
        f"trainer.default_local_dir={out / 'checkpoints'}", f"trainer.rollout_data_dir={out / 'dumps'}",
        f"nemo_gym.run_dir={run_dir}", *args.overrides,
    ]  # fmt: skip
    print("running:", " ".join(cmd), flush=True)
    t0 = time.time()
    with open(out / "console.log", "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    # Stopped (SIGTERM, e.g. a budget): the run gets it too and shuts down as a whole (the recipe's own SIGTERM
    # handling), and the sampling below ends with it. Before, a SIGTERM here orphaned the run.
    signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    sessions: set[int] = set()
    step = 0
    with open(out / "samples.jsonl", "w") as f:
        while proc.poll() is None:
            try:
                step = last_step(load_step_metrics(run_dir / "metrics.jsonl"))
            except MetricsFileError:
                pass  # not written yet, or its last line half written: the step is still the one read before
            rec = {"t": round(time.time() - t0, 1), "step": step, "load1": os.getloadavg()[0]}
            rec["roles"] = sample(proc.pid, run_dir, sessions)
            f.write(json.dumps(rec) + "\n")
            f.flush()
            time.sleep(args.every)
    wall = round(time.time() - t0)
    time.sleep(10)  # then nothing the run started may be left (its Gym, Ray heads, watchdog)
    left = sample(proc.pid, run_dir, sessions)
    result = {"returncode": proc.returncode, "wall_s": wall, "left_after_exit": left, "cmd": cmd}
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")


def windows(metrics: dict[int, dict[str, float]], curve: RewardCurve, final: int, width: int = 20) -> list[str]:
    """Training dynamics per ``width`` steps: each environment's reward, the largest grad norm, mean entropy."""

    def stat(pairs: Sequence[tuple[int, float]], lo: int, fn: Callable[[list[float]], float]) -> str:
        vals = [v for s, v in pairs if lo < s <= lo + width and v == v]  # NaN: a step without the metric
        return f"{fn(vals):.2f}" if vals else "-"

    def logged(key: str) -> list[tuple[int, float]]:
        return [(s, m[key]) for s, m in metrics.items() if key in m]

    mean = lambda v: sum(v) / len(v)  # noqa: E731
    rewards = {env: list(zip(curve.steps, values, strict=True)) for env, values in env_rewards(curve).items()}
    lines = []
    for lo in range(0, final, width):
        cells = [f"{env.removesuffix('_simple_agent')} {stat(pairs, lo, mean)}" for env, pairs in rewards.items()]
        cells += [f"grad_norm max {stat(logged('actor/grad_norm'), lo, max)}"]
        cells += [f"entropy {stat(logged('actor/entropy'), lo, mean)}"]
        lines.append(f"steps {lo + 1:>3}-{lo + width:<3} " + ", ".join(cells))
    return lines


def report(out: Path, early_step: int, best_before: int) -> int:
    result = json.loads((out / "result.json").read_text()) if (out / "result.json").exists() else {}
    try:
        metrics = load_step_metrics(out / "run" / "metrics.jsonl")
    except MetricsFileError as e:  # the run ended before its first step logged (an OOM kill at start-up, a bad key)
        print(f"no step logged: {e}; every process's sampled memory stays in {out / 'samples.jsonl'}")
        return 1
    curve = reward_curve(metrics, str(out / "run" / "metrics.jsonl"))
    final = last_step(metrics)
    by_step: dict[int, dict] = {}
    for line in (out / "samples.jsonl").read_text().splitlines():
        rec = json.loads(line)
        by_step.setdefault(rec["step"], rec)  # the first sample after a step was logged: the next step's rollouts
    # Both in the same phase; the last step's first sample is shutdown, so the late one is the step before it.
    early = next((by_step[s] for s in sorted(by_step) if s >= early_step), None)
    late = next((by_step[s] for s in sorted(by_step, reverse=True) if early_step <= s < final), None)
    table = {}
    if early and late:
        for role in sorted(set(early["roles"]) | set(late["roles"])):
            a, b = early["roles"].get(role, {}), late["roles"].get(role, {})
            table[role] = {
                k: [round(a.get(k, 0), 1), round(b.get(k, 0), 1)]
                for k in ("rss_mb", "threads", "fds", "sockets", "procs")
            }
            if a.get("rss_mb"):
                table[role]["rss_ratio"] = round(b.get("rss_mb", 0) / a["rss_mb"], 3)
    val = validation_check(metrics, best_before)
    summary = {
        **{k: result.get(k) for k in ("returncode", "wall_s")}, "steps": final,
        "early_sample": early and {k: early[k] for k in ("t", "step", "load1")},
        "late_sample": late and {k: late[k] for k in ("t", "step", "load1")},
        "roles": table, "validation": val,
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    left = result.get("left_after_exit", {})
    print(f"\nrc {summary['returncode']}, {final} steps in {summary['wall_s']} s; processes left 10 s after exit: "
          f"{sum(int(r['procs']) for r in left.values())} {sorted(left)}")  # fmt: skip
    if early and late:
        print(
            f"memory: step {early['step']} (load {early['load1']:.1f}) vs step {late['step']} (load {late['load1']:.1f})"
        )
        print(f"{'role':34} {'rss MB':>17} {'ratio':>6} {'threads':>11} {'fds':>11} {'sockets':>11} {'procs':>7}")
        for role, d in table.items():
            cell = lambda k, d=d: f"{d[k][0]:g}->{d[k][1]:g}"  # noqa: E731
            print(f"{role:34} {cell('rss_mb'):>17} {d.get('rss_ratio', float('nan')):6.3f} {cell('threads'):>11} "
                  f"{cell('fds'):>11} {cell('sockets'):>11} {cell('procs'):>7}")  # fmt: skip
    trend = [(s, by_step[s]) for s in sorted(by_step) if 0 <= s < final and s % max(1, final // 10) == 0]
    if trend:
        print(
            "total RSS MB by step (load): "
            + "  ".join(
                f"{s}:{sum(r['rss_mb'] for r in rec['roles'].values()):.0f} ({rec['load1']:.1f})" for s, rec in trend
            )
        )
    print("\n".join(windows(metrics, curve, final)))
    for env, d in val.items():
        passes = " ".join(f"{s}:{v:g}" for s, v in sorted(d["passes"].items()))
        print(f"val {env}: best before {best_before} = {d['best_before']}, min after = {d['min_after']}, "
              f"kept={d['kept']}  [{passes}]")  # fmt: skip
    plot(curve, val, out / "val_curve.png")
    print("plot:", out / "val_curve.png")
    return int(summary["returncode"] or 0)


if __name__ == "__main__":
    sys.exit(main())
