"""Collect or evaluate NeMo Gym rollouts without training: a policy against Gym environments → JSONL + summary.

    python -m nemo_gym_adapter.collect                                   # the demo's tiny model + example env
    python -m nemo_gym_adapter.collect --model /ckpt/step_100 --env example_single_tool_call --repeats 8 \\
        --output rollouts.jsonl                                          # a checkpoint, served here (patched vLLM)
    python -m nemo_gym_adapter.collect --policy-base-url http://10.0.0.5:8000/v1 --model-name qwen \\
        --config-path my_env.yaml --data eval.jsonl                      # any OpenAI-compatible server
    python -m nemo_gym_adapter.collect --gym-head-url http://127.0.0.1:11000 --data eval.jsonl   # a running Gym

The policy is a checkpoint (``--model``; default: the demo's tiny model) served here by vLLM with the token-ID patch
(``vllm.server.start_vllm_server``; ``--vllm-arg`` passes more server flags; ``--tool-parser`` the tool parser, by
default the model's own: ``ngv_json`` for the converted tool model, ``hermes`` otherwise; ``--no-patch`` serves it with
stock vLLM's rendering, to measure what the patch fixes) on loopback, or any OpenAI-compatible server
(``--policy-base-url``; its key, if it needs one, from ``NGV_ROLLOUT_API_KEY``). Gym is
started here with the bundled environments (``--env NAME``: the config that declares its ``data/example.jsonl`` for an
agent, as Gym links rows to agents, preferring one that needs nothing from outside -- a key nobody sets, an API, a
program not installed --, else naming what it needs: ``gym.catalogue``) and/or your configs
(``--config-path``) in front of that policy, or attached to (``--gym-head-url``: that Gym's own policy). Rows: ``--data``
JSONL files (rows without ``agent_ref``/``task_source`` go to ``--agent``, else to the one ``--env``'s agent) or each
``--env``'s bundled examples (routed to the declaring agent), times ``--repeats``; every row is checked before
anything starts (errors name ``file:line``).

Only this run's own clients get in, as in training (``nemo_gym_adapter.access``, docs/CLUSTER.md): a key generated
for this invocation is required on every route of the model server started here (Gym's model server gets it through
its environment) and, in the header ``X-NGV-Run-Key``, by every server of the Gym started here (``access.gym_guard``;
``--no-gym-guard`` to call Gym's servers yourself), whose Ray is a head of its own (``gym.ray_head``: loopback, a token
of its own, no dashboard, no metrics exporters). What collect does not start it cannot close, and says so in one line
on stderr: an attached Gym (``--gym-head-url``) and an external policy server (``--policy-base-url``).

Every row goes through :class:`~nemo_gym_adapter.rollouts.core.RolloutCore`, as in training, so the summary is the
training metrics (``metrics.compute_metrics``: reward, success and masked rates by reason, turns, tokens, latency)
per environment and overall; ``--prompt-length``/``--response-length`` apply training's token budgets (default:
none). ``--output`` gets one JSON line per rollout as it finishes (index, env, reward, masked reason, Gym's result or
the failure). Everything started here is stopped at the end. Exit status: 0 when every rollout returned a result, 1
otherwise (or on a set-up error, named), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TextIO

DEFAULT_ENVS = ("example_single_tool_call",)
NO_LIMIT = 1 << 20  # token budget when none is given: report every rollout, never truncate
SUMMARY_KEYS: tuple[str, ...] = ("num_samples", "reward_mean", "success_rate", "masked_rate", "contiguity_rate")
SUMMARY_KEYS += ("num_turns_mean", "generated_tokens_mean", "truncation_rate", "latency_p50", "split_rate")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m nemo_gym_adapter.collect", description=__doc__.split("\n\n")[0])
    g = p.add_argument_group("environments and rows")
    default_envs = ", ".join(DEFAULT_ENVS)
    g.add_argument(
        "--env",
        action="append",
        dest="envs",
        metavar="NAME",
        help=f"bundled Gym resources server to start (repeatable; default {default_envs} unless --config-path)",
    )
    g.add_argument("--config-path", action="append", default=[], metavar="YAML", help="Gym config (repeatable)")
    g.add_argument("--gym-head-url", help="attach to a running Gym's head server instead of starting one")
    g.add_argument("--data", action="append", default=[], metavar="JSONL", help="row files (repeatable)")
    g.add_argument(
        "--agent",
        metavar="NAME",
        help="agent for --data rows without agent_ref/task_source (Gym's agent_map._default; default: the agent of "
        "the one --env). An --env's own example rows go to the agent its config declares them for",
    )
    g.add_argument("--repeats", type=int, default=4, help="send every row this many times (default 4)")
    g.add_argument("--limit", type=int, default=None, help="use only the first N rows of each file (before repeats)")
    g.add_argument("--max-steps", type=int, default=4, help="simple_agent model calls per rollout (default 4)")
    m = p.add_argument_group("policy")
    m.add_argument("--model", help="checkpoint to serve with the patched vLLM (default: the demo's tiny qwen25)")
    m.add_argument("--vllm-arg", action="append", default=[], metavar="ARG", help="extra vLLM server flag (repeatable)")
    m.add_argument(
        "--tool-parser",
        metavar="NAME",
        help="vLLM tool parser for --model (hermes, ngv_json, ...; none: no tool parsing). Default: the model's own "
        "(a converted demo model's manifest; hermes for any other checkpoint)",
    )
    m.add_argument(
        "--no-patch",
        action="store_true",
        help="serve --model with stock vLLM, without the token-ID patch (to measure what it fixes)",
    )
    m.add_argument("--policy-base-url", help="use this OpenAI-compatible server (…/v1) instead of serving --model")
    g.add_argument(
        "--no-gym-guard",
        action="store_true",
        help="the Gym started here answers without this run's key (to call its servers yourself; default: every Gym "
        "server requires it, X-NGV-Run-Key)",
    )
    m.add_argument("--model-name", help="served model name (default: what the server lists first)")
    m.add_argument("--temperature", type=float, default=1.0)
    m.add_argument("--top-p", type=float, default=None)
    m.add_argument(
        "--max-output-tokens",
        type=int,
        default=64,
        help="per model call, at most (a row's own smaller one is kept; 64)",
    )
    m.add_argument("--prompt-length", type=int, default=None, help="training's prompt budget (default: none)")
    m.add_argument("--response-length", type=int, default=None, help="training's response budget (default: none)")
    m.add_argument(
        "--contiguity",
        choices=("mask", "truncate", "split"),
        default="mask",
        help="rollouts whose calls do not form one history: nemo_gym.trajectory.contiguity (default mask)",
    )
    c = p.add_argument_group("client and output")
    c.add_argument("--concurrency", type=int, default=32, help="rollouts in flight at once (default 32)")
    c.add_argument("--timeout", type=float, default=600.0, help="per-rollout deadline in seconds (default 600)")
    c.add_argument("--retries", type=int, default=3, help="resends after connection errors (default 3)")
    c.add_argument("--startup-timeout", type=float, default=300.0, help="seconds for Gym to start (default 300)")
    c.add_argument("--output", type=Path, help="write one JSON line per rollout (result or failure record)")
    c.add_argument("--json", action="store_true", help="print the summary as JSON")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.add_argument("-v", "--verbose", action="store_true", help="log what is started and stopped")
    args = p.parse_args(argv)
    if args.envs is None:
        args.envs = [] if args.config_path or args.gym_head_url else list(DEFAULT_ENVS)
    positive = ("repeats", "concurrency", "max_output_tokens", "max_steps", "limit", "prompt_length", "response_length")
    for key in positive:
        if getattr(args, key) is not None and getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.timeout <= 0 or args.retries < 0 or args.startup_timeout <= 0:
        p.error("--timeout and --startup-timeout must be > 0 and --retries >= 0")
    if (args.tool_parser or args.no_patch) and args.policy_base_url:
        p.error("--tool-parser and --no-patch are for the --model served here, not a --policy-base-url server")
    if args.model and args.policy_base_url:
        p.error("--model serves a checkpoint here; --policy-base-url uses a running server: give one of them")
    if args.gym_head_url and (args.envs or args.config_path or args.model or args.policy_base_url or args.no_gym_guard):
        p.error(
            "--gym-head-url attaches to a running Gym with its own environments and policy: drop --env, "
            "--config-path, --model, --policy-base-url and --no-gym-guard"
        )
    if args.gym_head_url and not args.data:
        p.error("--gym-head-url needs --data (the bundled examples belong to environments started here)")
    if not args.data and not args.envs:
        p.error("no rows: give --data, or --env for its bundled examples")
    if args.agent and not args.data:
        p.error("--agent names the agent for --data rows without routing; an --env's examples go to the agent its "
                "config declares them for")  # fmt: skip
    for path in args.data:
        if not Path(path).is_file():
            p.error(f"--data {path}: no such file")
    return args


def row_files(args: argparse.Namespace, bundled: Sequence[Any], out_dir: Path) -> list[tuple[Path, str | None]]:
    """(file, default agent) pairs: --data files (rows without routing: ``--agent``, else the one --env's agent), or
    each --env's examples routed to the agent its config declares them for (``gym.catalogue``, as Gym's collate)."""
    from nemo_gym_adapter.gym.catalogue import declared_rows

    if args.data:
        default = args.agent or (bundled[0].agent if len(bundled) == 1 else None)
        return [(Path(path), default) for path in args.data]
    return [(declared_rows(env, out_dir), env.agent) for env in bundled]


ATTACHED_NOTE = (
    "note: --gym-head-url {url}: a Gym collect did not start -- its servers and the model server they call answer "
    "whoever its owner lets in; collect adds no key to them (docs/CLUSTER.md)"
)
EXTERNAL_POLICY_NOTE = (
    "note: --policy-base-url {url}: a server collect did not start -- it requires a key only if its owner made it; "
    "collect sends {sends} (docs/CLUSTER.md)"
)


def start_gym(args: argparse.Namespace, stack: ExitStack, bundled: Sequence[Any]) -> Any:
    """A Gym started here with --env/--config-path in front of the policy (served here unless --policy-base-url),
    every server of both requiring this invocation's key (module docstring), on a Ray head of its own."""
    from pydantic import SecretStr

    from nemo_gym_adapter.access import key as access_key
    from nemo_gym_adapter.gym.launch import TRAINING_MODEL_CONFIG, GymLaunchSpec
    from nemo_gym_adapter.gym.ray_head import GymRayHead
    from nemo_gym_adapter.gym.servers import GymServers
    from nemo_gym_adapter.wire.policy import read_model_card

    configs = [env.config for env in bundled]
    base_url, name = args.policy_base_url, args.model_name
    run_key = access_key.generate().value  # only this process and the servers it starts know it
    # Gym's Ray comes up while vLLM starts (what the recipe's nemo_gym.ray_head: early does)
    head = GymRayHead.start()
    stack.callback(head.stop)
    key: SecretStr | None
    if base_url is None:
        from nemo_gym_adapter.demo_models.converter import tool_parser_of
        from nemo_gym_adapter.vllm.server import NO_PATCH_FLAG, start_vllm_server, tool_args

        model = args.model or _demo_model()
        name = name or Path(model).name
        parser = tool_parser_of(model) if args.tool_parser is None else args.tool_parser
        parser = None if parser == "none" else parser
        patch = "no token-ID patch" if args.no_patch else "token-ID patch"
        key = run_key
        print(f"starting vLLM ({patch}, tool parser {parser}) with {model} ...", file=sys.stderr)
        extra = [*args.vllm_arg, *([NO_PATCH_FLAG] if args.no_patch else [])]  # the key on every route either way
        server = start_vllm_server(model, name, extra_args=extra, tool_args=tool_args(parser), api_key=key)
        base_url = stack.enter_context(server).base_url
    else:
        chosen = access_key.from_env()
        key = chosen.value if chosen is not None else None
        sends = f"{access_key.ENV} from your environment" if key is not None else f"no key ({access_key.ENV} is unset)"
        print(EXTERNAL_POLICY_NOTE.format(url=base_url, sends=sends), file=sys.stderr)
    name = name or read_model_card({base_url: "--policy-base-url"}, api_key=key).name
    # A random model that calls a tool would otherwise loop until its context is full.
    agents = [env.agent for env in bundled if env.agent_impl == "simple_agent"]
    max_steps = {"responses_api_agents": {"simple_agent": {"max_steps": args.max_steps}}}
    spec = GymLaunchSpec(
        config_paths=[*configs, *args.config_path, TRAINING_MODEL_CONFIG],
        policy_base_url=[base_url],
        policy_model_name=name,
        **({"policy_api_key": key} if key is not None else {}),
        access_key=None if args.no_gym_guard else run_key,
        config_overrides={agent: max_steps for agent in agents},
        startup_timeout_s=args.startup_timeout,
    )
    print(f"starting NeMo Gym ({', '.join(args.envs + args.config_path)}) ...", file=sys.stderr)
    gym = stack.enter_context(GymServers.start(spec, ray_head=head))
    guarded = "every server requires this run's key" if spec.access_key is not None else "unguarded (--no-gym-guard)"
    print(f"NeMo Gym ready at {gym.head_url} in {gym.startup_seconds or 0:.1f}s ({guarded})", file=sys.stderr)
    return gym


def _demo_model() -> str:
    from nemo_gym_adapter.demo_models import build_tiny_model

    return str(build_tiny_model("qwen25"))


def record(row: Any) -> dict[str, Any]:
    """One JSONL line of ``--output`` for a ``rollouts.core.RowResult``."""
    o, t = row.outcome, row.trajectory
    return {
        "index": row.index,
        "env": row.env,
        "agent": o.agent,
        "server": o.server,
        "latency_s": o.latency_s,
        "attempts": o.attempts,
        "reward": t.gym_reward,
        "masked_reason": t.masked_reason.value if t.masked_reason else None,
        "samples": len(row.samples),  # > 1: split into segments (nemo_gym.trajectory.contiguity: split)
        "num_turns": t.num_turns,  # model calls (kept ones, when a history broke)
        "contiguity_failure": t.contiguity_failure,
        "result": o.result,
        "failure": o.failure.__dict__ if o.failure else None,
    }


def summarize(metrics: Mapping[str, float], prefix: str = "gym") -> dict[str, dict[str, float]]:
    """Training metrics by scope (``all`` first, then environments): :data:`SUMMARY_KEYS` plus every non-zero
    ``masked_rate/<reason>``."""
    scopes: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        _, scope, name = key.split("/", 2) if key.startswith(f"{prefix}/") and key.count("/") >= 2 else ("", "", "")
        if scope and scope != "timing" and (name in SUMMARY_KEYS or (name.startswith("masked_rate/") and value)):
            scopes.setdefault(scope, {})[name] = value
    return dict(sorted(scopes.items(), key=lambda item: (item[0] != "all", item[0])))


def print_summary(summary: Mapping[str, Any], out: TextIO = sys.stdout) -> None:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) and not v.is_integer() else str(int(v) if isinstance(v, float) else v)

    print("\n== NeMo Gym rollouts ==", file=out)
    for key, value in summary.items():
        if isinstance(value, dict) and key != "by_env":
            value = ", ".join(f"{k}={fmt(v)}" for k, v in value.items()) or "-"
        if key != "by_env":
            print(f"  {key:<18} {fmt(value)}", file=out)
    for scope, values in summary["by_env"].items():
        print(f"  [{scope}]", file=out)
        for name, value in values.items():
            print(f"    {name:<26} {fmt(value)}", file=out)


async def run(core: Any, rows: list[Any], overrides: Mapping[str, Any], output: Path | None) -> Any:
    """The step through the core; with ``output``, each rollout's line is written the moment it finishes."""
    with ExitStack() as stack:
        sink = stack.enter_context(open(output, "w")) if output else None

        def write(row: Any) -> None:
            if sink is not None:
                sink.write(json.dumps(record(row)) + "\n")

        async with core:
            return await core.run_step([r.data for r in rows], [r.env_name for r in rows], overrides, on_row=write)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    # Heavy imports only after the arguments are known to be good (STYLE.md §2).
    from nemo_gym_adapter.data.dataset import check_gym_jsonl, load_gym_jsonl
    from nemo_gym_adapter.errors import AdapterError
    from nemo_gym_adapter.gym.catalogue import bundled_env
    from nemo_gym_adapter.gym.launch import gym_package_root
    from nemo_gym_adapter.gym.servers import GymServers
    from nemo_gym_adapter.rollouts.client import RolloutClientConfig
    from nemo_gym_adapter.rollouts.core import RolloutCore
    from nemo_gym_adapter.rollouts.trajectory import TrajectoryConfig
    from nemo_gym_adapter.runtime import paths

    try:
        with ExitStack() as stack:
            t0 = time.monotonic()
            gym_root = None if args.gym_head_url else gym_package_root(paths.gym_venv())
            bundled = [bundled_env(gym_root, env) for env in args.envs] if gym_root is not None else []
            for env in bundled:
                if env.needs:  # every config of the environment needs something: say what before Gym refuses it
                    print(
                        f"warning: --env {env.name}: {env.config} (the config that declares its examples) needs "
                        f"{'; '.join(env.needs)}; no config of it needs nothing from outside. Define the keys in a "
                        "config of yours (--config-path), set the environment variables, or install the programs",
                        file=sys.stderr,
                    )
            files = row_files(args, bundled, Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ngv-rows-"))))
            # Every row is checked before anything starts: a bad row costs a second, not a Gym start-up. The rows are
            # loaded again once Gym runs, with its task_source map (a cache hit apart from that map).
            for path, default in files:
                check_gym_jsonl([path], default_agent=default)
            if args.gym_head_url:
                print(ATTACHED_NOTE.format(url=args.gym_head_url), file=sys.stderr)
                gym = GymServers.attach(args.gym_head_url)
            else:
                gym = start_gym(args, stack, bundled)
            routes = gym.routes()
            setup_s = time.monotonic() - t0
            rows: list[Any] = []
            for path, default in files:
                loaded = load_gym_jsonl([path], task_source_map=routes.task_sources, default_agent=default)
                rows += list(loaded[: args.limit])
            rows = rows * args.repeats
            trajectory = TrajectoryConfig(
                prompt_length=args.prompt_length or NO_LIMIT,
                response_length=args.response_length or NO_LIMIT,
                contiguity=args.contiguity,
            )
            client = RolloutClientConfig(
                max_concurrency=args.concurrency,
                timeout_s=args.timeout,
                max_connection_retries=args.retries,
                progress=False if args.no_progress else None,
            )
            sampling = {"max_output_tokens": args.max_output_tokens, "temperature": args.temperature}
            overrides = {**sampling, "top_p": args.top_p}
            step = asyncio.run(run(RolloutCore(routes, trajectory, client), rows, overrides, args.output))
    except AdapterError as e:  # set-up, config, dataset or server errors: the message says what and where
        print(f"error: {e}", file=sys.stderr)
        return 1
    failed = Counter(row.outcome.failure.reason for row in step.rows if row.outcome.failure is not None)
    results = len(step.rows) - sum(failed.values())
    summary = {"rollouts": len(step.rows), "results": results, "failed_by_reason": dict(failed), "setup_s": setup_s}
    summary |= {**step.timings, "by_env": summarize(step.metrics)}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print_summary(summary)
    return 0 if results == len(step.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
