#!/usr/bin/env python
"""The catalogue sweep: every stock NeMo Gym resources server that can run here, its own example rows through the
adapter's rollout collection (``python -m nemo_gym_adapter.collect``, what a user runs), offline.

1. **Inventory** (``benchmarks/gym_inventory.py``): which of Gym 0.7's stock resources servers can run on this machine
   (requirements on PyPI, no external service, key, container or network) with which config and agent; the others
   are listed at the end with the first reason they cannot.
2. **Venvs** (``scripts/prepare_gym_venvs.py --config <each candidate's config>``, online, into ``--venvs-dir``): every
   server the candidates start, shared where that changes nothing and in its own overlay venv where it would; an
   environment whose server cannot be prepared (a requirement without its module) joins the list of those that
   cannot run, with the problem.
3. **Runs**, in a network namespace of their own (loopback only, ``unshare -n``; ``--online`` to skip): one patched
   vLLM serving the tiny random qwen25 model; environments in batches whose configs share no top-level key, one Gym
   per batch (``collect --env A --env B ... --policy-base-url <vLLM>``), a batch that does not start re-run one
   environment at a time (Gym stops every server when one dies, so that is the only way to name it). Judges and
   simulated users that are the policy get a default cap on tokens for calls that set none (``--default-max-tokens``:
   the random model would otherwise write until its context is full).

One line per environment: started, rows back (Gym results) of rows sent, failures and masked rows by reason, rows with
more than one model call and the contiguity over them, wall time (its share of the batch's Gym start plus its slowest
row). Then ``K/N environments ran end to end`` (started, and every row came back as a Gym result: scored, or masked
by the environment or the adapter's token checks) and why each of the others did not. ``--out`` gets one JSON record
per environment. Long and CPU-heavy (an hour and more on 2 cores): run it under ``flock /work/heavy.lock`` on a shared
machine.

    .venv/bin/python benchmarks/gym_catalogue.py                      # all candidates; results in logs/gym_catalogue/
    .venv/bin/python benchmarks/gym_catalogue.py --env blackjack --env grl_sokoban --limit 2
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from nemo_gym_adapter.runtime import paths  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", action="append", help="only these environments (default: every candidate)")
    ap.add_argument("--skip", action="append", default=[], help="leave these out")
    ap.add_argument("--limit", type=int, default=3, help="example rows per environment (default 3)")
    ap.add_argument("--batch", type=int, default=6, help="environments per Gym (default 6)")
    ap.add_argument("--max-steps", type=int, default=3, help="simple_agent model calls per rollout (default 3)")
    ap.add_argument("--max-output-tokens", type=int, default=48, help="per model call of the policy (default 48)")
    ap.add_argument("--default-max-tokens", type=int, default=128, help="cap for model calls that set none (judges)")
    ap.add_argument("--concurrency", type=int, default=5, help="rollouts in flight per batch (default 5)")
    ap.add_argument("--timeout", type=float, default=180.0, help="per-rollout deadline, s (default 180)")
    ap.add_argument("--startup-timeout", type=float, default=900.0, help="Gym start-up deadline, s (default 900)")
    ap.add_argument("--model", help="policy checkpoint (default: the tiny random qwen25 demo model)")
    ap.add_argument("--vllm-arg", action="append", default=[], help="extra vLLM server flag (repeatable)")
    ap.add_argument("--venvs-dir", type=Path, default=paths.cache_dir() / "gym-catalogue-venvs", help="uv_venv_dir")
    ap.add_argument("--work-dir", type=Path, default=paths.logs_dir() / "gym_catalogue", help="logs and results")
    ap.add_argument("--out", type=Path, help="one JSON record per environment (default <work-dir>/results.jsonl)")
    ap.add_argument("--online", action="store_true", help="run with this host's network (default: a netns)")
    ap.add_argument("--no-prepare", action="store_true", help="use --venvs-dir as it is")
    ap.add_argument("--plan", type=Path, help=argparse.SUPPRESS)  # the offline phase, re-executed in the netns
    args = ap.parse_args(argv)
    args.out = args.out or args.work_dir / "results.jsonl"
    return args


# ------------------------------------------------------------------------------------------------ phase 1: plan


def plan(args: argparse.Namespace) -> dict[str, Any]:
    """Candidates to run (config, agent, rows) and the environments that cannot run here with their reason."""
    import gym_inventory

    from nemo_gym_adapter.gym.launch import gym_package_root

    root = gym_package_root(paths.gym_venv())
    records = gym_inventory.inventory(root)
    chosen = [r for r in records if (not args.env or r.env in args.env) and r.env not in args.skip]
    cannot = {r.env: r.reason for r in chosen if not r.runnable}
    runs = [r for r in chosen if r.runnable]
    if runs and not args.no_prepare:
        for env, problem in prepare(args, root, runs).items():
            cannot[env] = problem
    return {
        "total": len(records),
        "runs": [
            {"env": r.env, "config": r.config, "agent": r.agent, "via_env": r.via_env, "rows": min(args.limit, r.example_rows)}
            for r in runs
            if r.env not in cannot
        ],
        "cannot": cannot,
    }  # fmt: skip


def prepare(args: argparse.Namespace, root: Path, runs: list[Any]) -> dict[str, str]:
    """Every candidate's servers' venvs; ``{env: problem}`` for those a server of which could not be prepared."""
    from nemo_gym_adapter.gym.venv_prep import servers_in_config

    report = args.work_dir / "venvs.json"
    cmd = [
        sys.executable,
        str(REPO / "scripts/prepare_gym_venvs.py"),
        "--no-defaults",
        "--venvs-dir",
        str(args.venvs_dir),
    ]
    cmd += [f"--config={root / r.config}" for r in runs] + ["--report", str(report)]
    t0 = time.monotonic()
    print(f"preparing the servers' venvs in {args.venvs_dir} ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    (args.work_dir / "venvs.log").write_text(proc.stdout + proc.stderr)
    if not report.exists():
        sys.exit(f"error: preparing the venvs failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    prepared = json.loads(report.read_text())
    print(f"  {len(prepared)} servers in {time.monotonic() - t0:.0f} s (log: {args.work_dir / 'venvs.log'})")
    problems = {}
    for r in runs:
        mine = servers_in_config(root / r.config, root)
        bad = [f"{s}: {'; '.join(prepared[s]['problems'])}" for s in mine if prepared.get(s, {}).get("problems")]
        if bad:
            problems[r.env] = "its server cannot be prepared: " + " | ".join(bad)
    return problems


# ------------------------------------------------------------------------------------------------ phase 2: runs


def batches(runs: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    """Greedy batches of ``size`` whose configs define no top-level key twice; ``--env`` ones only (a config that is
    not what ``collect --env`` starts runs alone, with ``--config-path``/``--data``/``--agent``)."""
    import yaml

    from nemo_gym_adapter.gym.launch import gym_package_root

    root = gym_package_root(paths.gym_venv())
    out: list[tuple[list[dict[str, Any]], set[str]]] = []
    for run in runs:
        keys = set(yaml.safe_load((root / run["config"]).read_text()) or {})
        for envs, used in out:
            if run["via_env"] and envs[0]["via_env"] and len(envs) < size and not keys & used:
                envs.append(run)
                used |= keys
                break
        else:
            out.append(([run], keys))
    return [envs for envs, _ in out]


def collect_command(args: argparse.Namespace, envs: list[dict[str, Any]], base_url: str, output: Path) -> list[str]:
    """The ``collect`` command line for one batch (its extra Gym config: the default cap on judge tokens)."""
    from nemo_gym_adapter.gym.launch import gym_package_root

    cap = args.work_dir / "sweep_overrides.yaml"
    cap.write_text(json.dumps({"policy_model": {"responses_api_models": {"vllm_model": {"extra_body": {
        "max_tokens": args.default_max_tokens}}}}}))  # fmt: skip
    cmd = [sys.executable, "-m", "nemo_gym_adapter.collect", "--policy-base-url", base_url, "--model-name", "tiny"]
    if envs[0]["via_env"]:
        cmd += [x for e in envs for x in ("--env", e["env"])]
    else:
        (run,) = envs
        example = gym_package_root(paths.gym_venv()) / "resources_servers" / run["env"] / "data" / "example.jsonl"
        cmd += ["--config-path", run["config"], "--data", str(example), "--agent", run["agent"]]
    cmd += ["--config-path", str(cap), "--limit", str(args.limit), "--repeats", "1", "--max-steps", str(args.max_steps)]
    cmd += ["--max-output-tokens", str(args.max_output_tokens), "--concurrency", str(args.concurrency)]
    cmd += ["--timeout", str(args.timeout), "--retries", "1", "--startup-timeout", str(args.startup_timeout)]
    return [*cmd, "--output", str(output), "--json", "--no-progress"]


def run_batch(args: argparse.Namespace, envs: list[dict[str, Any]], base_url: str) -> list[dict[str, Any]]:
    """One Gym for ``envs`` through ``collect``; a batch that does not start is run again one environment at a time."""
    name = "+".join(e["env"] for e in envs)[:100]
    work = args.work_dir / "batches" / name
    work.mkdir(parents=True, exist_ok=True)
    output = work / "rollouts.jsonl"
    env = {**os.environ, "NGV_GYM_SERVER_VENVS": str(args.venvs_dir), "NGV_LOG_DIR": str(work), "PYTHONPATH": str(REPO)}
    cmd = collect_command(args, envs, base_url, output)
    (work / "command.txt").write_text(shlex.join(cmd) + "\n")
    t0 = time.monotonic()
    deadline = args.startup_timeout + args.timeout * (sum(e["rows"] for e in envs) + 2)
    try:
        proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=deadline)
        stdout, stderr, status = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:  # collect stops everything it started when killed... by SIGKILL it cannot
        stdout, stderr, status = str(e.stdout or ""), f"collect did not finish within {deadline:.0f} s", -9
    wall = time.monotonic() - t0
    (work / "collect.log").write_text(f"$ {shlex.join(cmd)}\nexit {status}\n{stderr}\n{stdout}")
    lines = [json.loads(x) for x in output.read_text().splitlines()] if output.exists() else []
    if not lines:  # Gym did not start (or the rows were refused): name the culprit
        if len(envs) > 1:
            print(f"  batch {name} did not start ({wall:.0f} s); each alone", flush=True)
            return [r for e in envs for r in run_batch(args, [e], base_url)]
        error = next((x for x in stderr.splitlines() if x.startswith("error:")), stderr.strip()[-300:])
        return [{"env": envs[0]["env"], "started": False, "error": error[:600], "wall_s": round(wall)}]
    summary = json.loads(stdout[stdout.index("{") :]) if "{" in stdout else {}
    setup = float(summary.get("setup_s", 0.0))
    out, start = [], 0
    for e in envs:  # rows are sent file by file, so indices map to environments by their row counts
        mine = [x for x in lines if start <= x["index"] < start + e["rows"]]
        start += e["rows"]
        out.append(env_record(e, mine, setup, len(envs)))
    return out


def env_record(run: dict[str, Any], lines: list[dict[str, Any]], setup_s: float, batch: int) -> dict[str, Any]:
    """One environment's result from its ``collect --output`` lines."""
    failed = Counter(x["failure"]["reason"] for x in lines if x["failure"])
    masked = Counter(x["masked_reason"] for x in lines if x["masked_reason"])
    multi = [x for x in lines if x["num_turns"] > 1 or x["contiguity_failure"]]
    broken = sum(x["contiguity_failure"] for x in multi)
    return {
        "env": run["env"],
        "started": True,
        "rows": run["rows"],
        "results": sum(1 for x in lines if not x["failure"]),
        "failed": dict(failed),
        "masked": dict(masked),
        "multi_call_rows": len(multi),
        "contiguity": round(1 - broken / len(multi), 3) if multi else None,
        "rewards": [x["reward"] for x in lines],
        "details": sorted({(x["failure"] or {}).get("detail", "")[:300] for x in lines if x["failure"]})[:2],
        "gym_start_s": round(setup_s),
        "batch": batch,
        "wall_s": round(setup_s / batch + max((x["latency_s"] or 0.0 for x in lines), default=0.0)),
    }


def ok(record: dict[str, Any]) -> bool:
    return bool(record["started"]) and record["results"] == record["rows"]


def line(r: dict[str, Any]) -> str:
    if not r["started"]:
        return f"{r['env']:46s} started=NO  {r['error'][:200]}  ({r['wall_s']} s)"
    fmt = lambda c: ",".join(f"{k}:{v}" for k, v in sorted(c.items())) or "-"  # noqa: E731
    contiguity = "n/a" if r["contiguity"] is None else f"{r['contiguity']:.2f}"
    return (
        f"{r['env']:46s} started=yes rows_back={r['results']}/{r['rows']} failed={fmt(r['failed'])} "
        f"masked={fmt(r['masked'])} multi_call={r['multi_call_rows']} contiguity={contiguity} wall={r['wall_s']} s "
        f"(Gym start {r['gym_start_s']} s shared by {r['batch']})"
    )


def run_all(args: argparse.Namespace, the_plan: dict[str, Any]) -> int:
    """Phase 2 (in the netns unless ``--online``): the vLLM, every batch, the lines and ``K/N``."""
    from nemo_gym_adapter.vllm.server import start_vllm_server

    model = args.model or str(paths.tiny_models_dir() / "qwen25")
    results: list[dict[str, Any]] = []
    t0 = time.monotonic()
    with start_vllm_server(model, "tiny", extra_args=args.vllm_arg, timeout=600) as vllm, open(args.out, "w") as out:
        print(f"vLLM up at {vllm.base_url} in {vllm.start_seconds:.0f} s; load {os.getloadavg()[0]:.1f}", flush=True)
        for envs in batches(the_plan["runs"], args.batch):
            for r in run_batch(args, envs, vllm.base_url):
                r["load"] = round(os.getloadavg()[0], 1)
                results.append(r)
                out.write(json.dumps(r) + "\n")
                out.flush()
                print(line(r), f"load={r['load']}", flush=True)
    k = sum(ok(r) for r in results)
    cannot = the_plan["cannot"]
    print(f"\n{k}/{len(results)} environments ran end to end ({the_plan['total']} stock resources servers; {len(cannot)} "
          f"cannot run here); {time.monotonic() - t0:.0f} s, load {os.getloadavg()[0]:.1f}")  # fmt: skip
    for r in results:
        if not ok(r):
            why = r.get("error") or "; ".join(r["details"]) or f"{r['results']}/{r['rows']} rows back"
            print(f"  did not run end to end: {r['env']}: {why[:300]}")
    print("cannot run here:")
    for env, reason in sorted(cannot.items()):
        print(f"  {env:46s} {reason[:240]}")
    return 0 if k == len(results) else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    if args.plan is not None:
        return run_all(args, json.loads(args.plan.read_text()))
    the_plan = plan(args)
    plan_path = args.work_dir / "plan.json"
    plan_path.write_text(json.dumps(the_plan, indent=1))
    print(f"{len(the_plan['runs'])} environments to run, {len(the_plan['cannot'])} cannot run here", flush=True)
    argv_run = [sys.executable, str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:])]
    argv_run += ["--plan", str(plan_path)]
    if args.online:
        return run_all(args, the_plan)
    # Its own network namespace: loopback only, so no environment reaches beyond this machine (the same command).
    wrapped = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv_run]
    return subprocess.run(wrapped).returncode


if __name__ == "__main__":
    sys.exit(main())
