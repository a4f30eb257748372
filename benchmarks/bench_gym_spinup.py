#!/usr/bin/env python
"""Time NeMo Gym spin-up (example_single_tool_call + simple_agent + training vllm_model config, prebuilt venvs).

Variants, each run ``--repeat`` times, one Gym alive at a time:

- ``ours``    ``GymServers.start`` (Gym starts its own Ray cluster): what the trainer does by default. Ready when
              every server instance and model endpoint answers, probed when Gym's log announces a server
              (``readiness.serves``; with ``--vllm`` only: without a model Gym's own ``/health`` flag is awaited);
- ``by-hand`` the same ``gym env start`` typed by hand (hydra overrides, no wrapper), timed to head ``/health`` 200
              (Gym's own flag, set after its fixed 3 s polling rounds): the baseline;
- ``ray-up``  ``GymServers.start`` joining a Ray head (``gym_ray.GymRayHead``: Gym's venv, no dashboard) that is
              already up (started and waited for first): what a pre-started Ray saves. Ray's own start is printed
              separately;
- ``early``   what the trainer sees with ``nemo_gym.ray_head: early`` (the default): the head is started, then
              ``--overlap-s`` of verl's own start-up pass (simulated by sleeping; on a real run verl's workers and
              vLLM take 30 s and more), then ``GymServers.start(spec, ray_head=head)`` is timed to ready: the critical
              path, including any wait for the head. Ray's own start (watched from a thread) and the total (overlap
              + critical path) are printed too. The sleep is idle: on a real run the head's start competes for the
              CPUs with verl's start-up, which this variant does not show (the head's CPU seconds are printed).
- ``guarded`` ``ours`` with Gym's servers requiring the run's key (``nemo_gym.access.guard_gym``, the recipe's
              default: ``access.gym_guard``'s boot in every Gym interpreter, the launch's keyless-401 check); its
              ratio against ``ours`` is what the guard costs a start;
- ``warm``    ``early`` plus a warm Gym launcher (``gym_warm.WarmLauncher``, ``nemo_gym.warm_launcher: true``, the
              default) started right after the head: Gym's launcher imports during the overlap, and
              ``GymServers.start(spec, ray_head=head, warm=warm)`` is timed to ready the same way.

Without ``--vllm`` Gym is pointed at a dead model URL and told not to wait for it, so only Gym is timed. With
``--vllm`` a tiny-qwen25 vLLM is started first (timed) and one ``/run`` is timed on every Gym.

    .venv/bin/python benchmarks/bench_gym_spinup.py [--repeat 2] [--variants ours,guarded,by-hand,ray-up,early,warm] [--vllm]
                                                 [--overlap-s 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path

from pydantic import SecretStr

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nemo_gym_adapter.access import gym_guard  # noqa: E402
from nemo_gym_adapter.gym.ray_head import GymRayHead  # noqa: E402
from nemo_gym_adapter.gym.servers import GymServers  # noqa: E402
from nemo_gym_adapter.gym.warm import WarmLauncher  # noqa: E402
from nemo_gym_adapter.runtime import paths  # noqa: E402
from nemo_gym_adapter.runtime.procs import SessionProcess, free_port  # noqa: E402
from tests.support.gym_fixtures import (  # noqa: E402
    SINGLE_TOOL_CALL_AGENT,
    SINGLE_TOOL_CALL_CONFIG,
    example_rows,
    single_tool_call_spec,
)

TRAINING_MODEL = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
NO_MODEL_WAIT = {"model_endpoint_readiness_timeout_seconds": 0}


def _post_run(url: str, headers: dict[str, str]) -> float:
    row = example_rows()[0]
    row = {**row, "responses_create_params": {**row["responses_create_params"], "max_output_tokens": 16}}
    headers = {"Content-Type": "application/json", **headers}
    req = urllib.request.Request(url, data=json.dumps(row).encode(), headers=headers)
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=300) as r:
        json.loads(r.read())
    return time.monotonic() - t0


def _spec(base_url: str, model: str, with_run: bool, key: SecretStr | None = None):
    return single_tool_call_spec(
        [base_url], model, startup_timeout_s=600, config_overrides={} if with_run else NO_MODEL_WAIT, access_key=key
    )


def start_warm(base_url: str, model: str, with_run: bool, head: GymRayHead) -> WarmLauncher:
    """A warm launcher with the environment Gym will get when it joins ``head`` (as ``gym_warm.start_warm_for``)."""
    return WarmLauncher.for_spec(_spec(base_url, model, with_run), head)


def bench_ours(
    base_url: str,
    model: str,
    ray_head: GymRayHead | None,
    with_run: bool,
    warm: WarmLauncher | None = None,
    key: SecretStr | None = None,
) -> tuple[float, float | None, float]:
    """(spin-up s, one /run s or None, s of it waiting for ``ray_head``); ``key``: Gym's servers require it."""
    with GymServers.start(_spec(base_url, model, with_run, key), ray_head=ray_head, warm=warm) as gym:
        if warm is not None and not gym.warm:
            raise SystemExit(f"the warm launcher was not used (see the warning above; its log: {warm.log_path})")
        CPU_SECONDS.append(_cpu_seconds(gym.pids()))
        run_s = _post_run(gym.run_url(SINGLE_TOOL_CALL_AGENT), gym_guard.client_headers()) if with_run else None
        assert gym.startup_seconds is not None
        return gym.startup_seconds, run_s, gym.ray_wait_seconds


CPU_SECONDS: list[float] = []  # per start of ours/ray-up: CPU seconds Gym's live processes had used when ready


def _cpu_seconds(pids: set[int]) -> float:
    """User + system CPU seconds of ``pids`` so far (Gym's launcher, servers, Ray helpers): the work a spin-up needs,
    which bounds its wall time from below at (CPU seconds / cores) whatever the readiness check does."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def bench_by_hand(base_url: str, model: str) -> float:
    """`gym env start` with hydra overrides, as a user would type it; timed until the head reports ready."""
    port = free_port()
    run_dir = paths.logs_dir() / "gym" / f"bench-by-hand-{port}"
    run_dir.mkdir(parents=True, exist_ok=True)
    gym_venv = paths.gym_venv()
    cmd = [
        str(gym_venv / "bin" / "gym"),
        "env",
        "start",
        f"+config_paths=[{SINGLE_TOOL_CALL_CONFIG},{TRAINING_MODEL}]",
        f"+policy_base_url=[{base_url}]",
        "+policy_api_key=EMPTY",
        f"+policy_model_name={model}",
        f"+head_server={{host: 127.0.0.1, port: {port}}}",
        f"+uv_venv_dir={paths.gym_server_venvs_dir()}",
        "+skip_venv_if_present=true",
        "++model_endpoint_readiness_timeout_seconds=0",
        f"++{SINGLE_TOOL_CALL_AGENT}.responses_api_agents.simple_agent.max_steps=3",
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["RAY_ADDRESS"] = "local"  # see gym_servers: never join a cluster found in /tmp/ray
    t0 = time.monotonic()
    proc = SessionProcess("gym env start (by hand)", cmd, run_dir / "gym.log", env=env, cwd=run_dir)
    try:
        proc.wait_http_ready(f"http://127.0.0.1:{port}/health", timeout=600, interval=0.25)
        return time.monotonic() - t0
    finally:
        proc.stop()


@contextlib.contextmanager
def ray_head(watch: bool):
    """A Ray head from Gym's venv (``gym_ray.GymRayHead``, the trainer's); with ``watch``, a thread notes when it is
    up (``start_seconds``) while the caller goes on."""
    head = GymRayHead.start()
    watcher = threading.Thread(target=head.wait_ready, args=(300,), daemon=True)
    if watch:
        watcher.start()
    try:
        yield head
    finally:
        head.stop()
        if watch:
            watcher.join(timeout=5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--variants", default="ours,by-hand,ray-up,early,warm")
    parser.add_argument(
        "--overlap-s",
        type=float,
        default=5.0,
        help="early: seconds of verl's start-up between the head's start and Gym's (a real run: 30 s and more)",
    )
    parser.add_argument("--vllm", action="store_true", help="serve the tiny model and time one /run per Gym")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")

    results: dict[str, list[float]] = {v: [] for v in variants}
    ray_start: list[float] = []  # Ray head's own start (ray-up, early)
    head_cpu: list[float] = []  # CPU seconds the head used to come up
    early_total: dict[str, list[float]] = {}  # early, warm: overlap + critical path
    load_by: dict[str, list[float]] = {}  # 1-min load average at each start, per variant
    runs: list[float] = []
    load_seen: list[float] = []
    with contextlib.ExitStack() as stack:
        if args.vllm:
            from nemo_gym_adapter.demo_models import build_tiny_model
            from tests.support.vllm_fixtures import start_vllm_server

            vllm = stack.enter_context(start_vllm_server(build_tiny_model("qwen25")))
            base_url, model = vllm.base_url, vllm.model_name
            print(f"vLLM (tiny qwen25) ready in {vllm.start_seconds:.1f} s", flush=True)
        else:
            base_url, model = f"http://127.0.0.1:{free_port()}/v1", "none"
        for i in range(args.repeat):
            for variant in variants:
                load = os.getloadavg()[0]
                load_seen.append(load)
                load_by.setdefault(variant, []).append(load)
                note = ""
                if variant == "ours":
                    secs, run_s, _ = bench_ours(base_url, model, None, args.vllm)
                elif variant == "guarded":
                    key = SecretStr(secrets.token_urlsafe(32))
                    secs, run_s, _ = bench_ours(base_url, model, None, args.vllm, key=key)
                elif variant == "by-hand":
                    secs, run_s = bench_by_hand(base_url, model), None
                elif variant in ("ray-up", "early", "warm"):
                    with ray_head(watch=variant != "ray-up") as head:
                        warm = start_warm(base_url, model, args.vllm, head) if variant == "warm" else None
                        try:
                            if variant == "ray-up":
                                head.wait_ready(300)
                            else:
                                time.sleep(args.overlap_s)  # verl's own start-up
                            secs, run_s, waited = bench_ours(base_url, model, head, args.vllm, warm)
                        finally:
                            if warm is not None:
                                warm.stop()
                        assert head.start_seconds is not None
                        ray_start.append(head.start_seconds)
                        head_cpu.append(_cpu_seconds(head.pids()))
                        note = f", Ray head up in {head.start_seconds:.1f} s"
                        if warm is not None:
                            note += f", warm launcher's imports done {warm.ready_seconds or 0:.1f} s after its start"
                        if variant != "ray-up":
                            early_total.setdefault(variant, []).append(args.overlap_s + secs)
                            note += (
                                f", waited {waited:.1f} s for it; total with the overlap {args.overlap_s + secs:.1f} s"
                            )
                else:
                    parser.error(f"unknown variant {variant!r}")
                results[variant].append(secs)
                if run_s is not None:
                    runs.append(run_s)
                extra = f", one /run {run_s:.2f} s" if run_s is not None else ""
                print(f"[{i + 1}/{args.repeat}] {variant:8s} spin-up {secs:6.1f} s (load avg {load:.1f}){extra}{note}")
    print("\nGym spin-up with prebuilt venvs, to ready (goal <= 6 s; median (min-max)):")
    for variant, secs in results.items():
        if secs:
            rel = ""
            for base in ("by-hand", "ours", "early"):
                if results.get(base) and variant not in ("by-hand", base) and (base != "early" or variant == "warm"):
                    rel += f", {statistics.median(secs) / statistics.median(results[base]):.2f}x {base}"
            load = statistics.median(load_by[variant])
            print(
                f"  {variant:8s} {statistics.median(secs):5.1f} s ({min(secs):.1f}-{max(secs):.1f}) over {len(secs)}, "
                f"load {load:.1f}{rel}"
            )
    for variant, totals in early_total.items():
        print(
            f"  {variant}: critical path above; with the {args.overlap_s:.0f} s overlap (verl's start-up) total "
            f"{statistics.median(totals):.1f} s ({min(totals):.1f}-{max(totals):.1f})"
        )
    if ray_start:
        print(
            f"  Ray head (Gym's venv) own start: {statistics.median(ray_start):.1f} s "
            f"({min(ray_start):.1f}-{max(ray_start):.1f}), {statistics.median(head_cpu):.1f} CPU s used by the time Gym was ready"
        )
    if runs:
        print(f"  one /run (tiny model, 16 tokens): median {statistics.median(runs):.2f} s")
    if CPU_SECONDS:
        cpu = statistics.median(CPU_SECONDS)
        print(
            f"  CPU seconds Gym's processes used to get ready (ours, ray-up): {cpu:.1f} "
            f"({min(CPU_SECONDS):.1f}-{max(CPU_SECONDS):.1f}) = at least {cpu / (os.cpu_count() or 1):.1f} s "
            f"on {os.cpu_count()} idle cores"
        )
    if load_seen:
        lo, med, hi = min(load_seen), statistics.median(load_seen), max(load_seen)
        print(f"  load average (1 min) at each start: {med:.1f} ({lo:.1f}-{hi:.1f}) on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
