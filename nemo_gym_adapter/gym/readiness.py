"""When a Gym we launched can serve rollouts, and what to say when it cannot (component 3).

:func:`wait_ready` is the wait of :meth:`GymServers.start <nemo_gym_adapter.gym.servers.GymServers.start>`: it
returns as soon as Gym's own readiness condition holds (:func:`serves`: every server instance and every model endpoint
answers), checked whenever Gym's launcher log announces a server instead of waiting for the head's ``/health`` flag,
which Gym's launcher sets after its own fixed 3 s polling rounds. A server that lost its port to another process raises
``ports.GymPortInUseError`` (the launch is retried on new ports); a launcher that died or a deadline that passed raises
the ``GymServerError`` of :func:`start_failure`, which names the culprit -- a crashed server, the head, the servers that
do not answer, an unreachable model -- with its log tail. Reads a running Gym through
:class:`~nemo_gym_adapter.gym.head.GymHead` only; owns no process.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from nemo_gym_adapter.errors import GymServerError
from nemo_gym_adapter.gym.head import GymHead, answers, http_get
from nemo_gym_adapter.gym.launch import GymLaunchSpec
from nemo_gym_adapter.gym.ports import BIND_FAILED_MARKER, GymPortInUseError, port_collisions
from nemo_gym_adapter.runtime.procs import LogWatch, SessionProcess, log_tail

# Without a log line that announces a server, probe this often anyway (a quiet server, another log format).
FALLBACK_PROBE_S = 1.0
# What Gym's launcher log says when something became reachable: uvicorn binding (head and every server, whose
# output Gym copies into the launcher's stdout) and Gym's own "All N / N servers ready!". Our own probes make the
# head log access lines, which must not count as events, so only these do.
# A server's failed bind wakes it too (ports.port_collisions).
READY_MARKERS = (b"Uvicorn running on", b"servers ready", BIND_FAILED_MARKER)
_CRASHED = re.compile(r"Process `([^`]+)` finished unexpectedly")


def wait_ready(
    gym: GymHead, launcher: SessionProcess, deadline: float, spec: GymLaunchSpec, run_dir: Path | None
) -> None:
    """Return once the Gym that ``launcher`` started can serve rollouts (:func:`serves`); probes run when Gym's log
    says a server came up. Raises ``GymPortInUseError`` (a server lost its port) or :func:`start_failure`'s error."""
    log = LogWatch(launcher.log_path, READY_MARKERS)
    while True:
        lost = port_collisions(launcher.tail(400))
        if lost:  # Gym stops everything within a polling round anyway (or, for the head, waits forever)
            server, port = lost[0]
            raise GymPortInUseError(
                f"NeMo Gym ({gym.head_url}): {server} could not bind port {port}: address already in use\n"
                f"--- last lines of {launcher.log_path} ---\n{launcher.tail(20)}",
                server=server,
                port=port,
                run_dir=run_dir,
            )
        if not launcher.alive():
            why = f"exited with code {launcher.popen.returncode} before becoming ready"
            raise start_failure(gym, launcher, why, run_dir)
        if serves(gym, spec):
            return
        if time.monotonic() > deadline:
            raise start_failure(gym, launcher, f"not ready after {spec.startup_timeout_s:.0f}s", run_dir, spec)
        log.wait(min(FALLBACK_PROBE_S, max(0.0, deadline - time.monotonic())))


def serves(gym: GymHead, spec: GymLaunchSpec) -> bool:
    """Gym's own readiness condition, checked by us as soon as it may hold.

    Gym's launcher marks its head ready (``/health`` 200) once every server instance answers HTTP and every model
    endpoint answers, but it checks on a fixed 3 s cadence (and 3 s for the head itself). The same condition,
    read from the head's ``/server_instances`` and the config's model ``base_url``s, holds up to a few seconds
    earlier; nothing in a rollout depends on the head's flag. With Gym's model wait switched off
    (``model_endpoint_readiness_timeout_seconds <= 0``) only Gym's own ``/health`` counts.
    """
    try:
        status, _ = http_get(f"{gym.head_url}/health", timeout=3.0)
    except OSError:
        return False  # the head server itself is not up yet
    if status == 200:
        return not gym.unready_instances()
    if float(spec.config_overrides.get("model_endpoint_readiness_timeout_seconds", 1)) <= 0:
        return False
    try:
        # Read (once, cached) while the servers still start, not after the last one answers: parsing Gym's
        # config is ~0.1 s that would otherwise sit at the end of the critical path.
        endpoints = model_endpoints(gym.global_config())
        instances = gym.server_instances()
    except (OSError, GymServerError):
        return False
    # Gym publishes the instance list once every server process is spawned; before that it is empty.
    if not instances or any(not answers(inst.url) for inst in instances.values()):
        return False
    return bool(endpoints) and all(answers(_probe_url(url)) for url in endpoints)


def model_endpoints(config: dict[str, Any]) -> list[str]:
    """The model ``base_url``s Gym waits for before it calls itself ready (every ``responses_api_models`` block's
    ``*base_url`` keys, a string or a list), deduplicated, in config order."""
    urls: list[str] = []
    for block in config.values():
        models = block.get("responses_api_models") if isinstance(block, dict) else None
        if not isinstance(models, dict):
            continue
        for server in models.values():
            if not isinstance(server, dict):
                continue
            for key, value in server.items():
                if str(key).endswith("base_url"):
                    for url in [value] if isinstance(value, str) else value if isinstance(value, list) else []:
                        if isinstance(url, str) and url and url.rstrip("/") not in urls:
                            urls.append(url.rstrip("/"))
    return urls


def _probe_url(base_url: str) -> str:
    """What Gym GETs to see a model endpoint answer: ``<base>/models`` for an OpenAI ``/v1`` URL, else the URL."""
    return f"{base_url}/models" if base_url.endswith("/v1") else base_url


def start_failure(
    gym: GymHead, launcher: SessionProcess, why: str, run_dir: Path | None, spec: GymLaunchSpec | None = None
) -> GymServerError:
    """A GymServerError naming the culprit (crashed server, unready servers, unreachable model) + log tails (the
    servers' own under ``<run_dir>/servers/``)."""
    text = launcher.tail(400)
    crashed = _CRASHED.findall(text)
    if crashed:
        culprits, detail = crashed, "crashed"
    elif not answers(f"{gym.head_url}/health"):
        state = "still starting (parsing config, starting Ray)" if launcher.alive() else "gone (config error?)"
        culprits, detail = ["head server"], f"launcher {state}; not up"
    else:
        culprits = [n for n in gym.unready_instances() if n != "head server"]
        detail = "not answering"
        if not culprits and spec is not None:
            culprits = [u for u in spec.policy_base_url if not answers(f"{u}/models")]
            detail = "model endpoint not answering (Gym waits for it)"
    parts = [f"NeMo Gym ({gym.head_url}): {why}; {detail}: {', '.join(culprits) or '-'}"]
    for name in culprits:
        server_log = (run_dir or Path(".")) / "servers" / f"{name.replace('/', '_')}.log"
        if server_log.exists():
            parts.append(f"--- last lines of {server_log} ---\n{log_tail(server_log, 30)}")
    parts.append(f"--- last lines of {launcher.log_path} ---\n{launcher.tail(40)}")
    return GymServerError("\n".join(parts))
