"""Run NeMo Gym as a service that trainers on other hosts attach to (``nemo_gym.head_url``).

    python -m nemo_gym_adapter.gym.service \\
        --config-path resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml \\
        --policy-base-url http://10.0.0.2:41234/v1 --policy-base-url http://10.0.0.3:40111/v1 \\
        --policy-model-name /models/Qwen2.5-1.5B-Instruct --reachable-from 10.0.0.1 [--head-port 11000]

Starts Gym (its own venv and Ray, prebuilt server venvs, Gym's training model config appended) listening on the
address through which the ``--reachable-from`` hosts reach this one (``addresses.choose_gym_host``; ``--host``
overrides), prints one JSON line ``{"head_url": ..., "host": ..., "reason": ...}`` once every server is ready, and
runs until SIGTERM/SIGINT, then stops Gym's whole process tree. The ``--policy-base-url`` values must be the
trainer's vLLM replicas (its log prints them while it waits to attach); a trainer refuses a Gym that calls others.

The replicas answer only requests carrying the run's rollout key (``nemo_gym_adapter.access``): give this process
the key the trainer uses in ``NGV_ROLLOUT_API_KEY`` (the same variable on the trainer's driver chooses it there);
Gym's model server gets it through its environment, never a file or argv.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading

from nemo_gym_adapter.access.key import from_env
from nemo_gym_adapter.gym.addresses import choose_gym_host, route_source_address
from nemo_gym_adapter.gym.launch import TRAINING_MODEL_CONFIG, GymLaunchSpec
from nemo_gym_adapter.gym.servers import GymServers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m nemo_gym_adapter.gym.service", description=__doc__.split("\n\n")[0])
    p.add_argument("--config-path", action="append", required=True, help="a Gym config (repeat for several)")
    p.add_argument("--policy-base-url", action="append", required=True, help="a vLLM replica (repeat per replica)")
    p.add_argument("--policy-model-name", required=True, help="the served model name (verl: the model path)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--reachable-from", action="append", help="a host that will attach (repeat for several)")
    where.add_argument("--host", help="listen on this address instead")
    p.add_argument("--head-port", type=int, default=None, help="Gym's head server port (default: a free one)")
    p.add_argument("--run-dir", default=None, help="Gym's cwd and logs (default logs/gym/<time>-<port>)")
    p.add_argument("--config-overrides", default="{}", help="JSON merged into Gym's config last")
    p.add_argument("--no-training-model-config", action="store_true", help=f"do not append {TRAINING_MODEL_CONFIG}")
    p.add_argument("--startup-timeout-s", type=float, default=600.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    callers = args.reachable_from or []
    node_ip = route_source_address(callers[0]) if callers else None
    choice = choose_gym_host(args.host, callers=callers, node_ip=node_ip)
    logging.getLogger(__name__).info("Gym listens on %s: %s", choice.host, choice.reason)
    config_paths = list(args.config_path)
    if not args.no_training_model_config and TRAINING_MODEL_CONFIG not in config_paths:
        config_paths.append(TRAINING_MODEL_CONFIG)
    key = from_env()
    if key is None:
        logging.getLogger(__name__).warning(
            "NGV_ROLLOUT_API_KEY is not set: Gym sends no key, and replicas that require the run's key refuse it"
        )
    optional = {"head_port": args.head_port, "run_dir": args.run_dir, "policy_api_key": key.value if key else None}
    spec = GymLaunchSpec.parse(
        {
            "config_paths": config_paths,
            "policy_base_url": args.policy_base_url,
            "policy_model_name": args.policy_model_name,
            "host": choice.host,
            "config_overrides": json.loads(args.config_overrides),
            "startup_timeout_s": args.startup_timeout_s,
            **{k: v for k, v in optional.items() if v is not None},
        },
        prefix="gym_service",
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with GymServers.start(spec) as gym:
        print(json.dumps({"head_url": gym.head_url, "host": choice.host, "reason": choice.reason}), flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
