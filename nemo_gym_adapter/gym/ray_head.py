"""Gym's Ray head, started early (component 3): ``nemo_gym.ray_head: early``, the default.

NeMo Gym 0.7 always calls ``ray.init``; without an address its launcher starts a whole Ray cluster (GCS, raylet,
agents: ~3 s on 2 cores) on the spin-up's critical path. :class:`GymRayHead` runs ``ray start --head --block`` from
*Gym's* venv (Ray refuses a driver of another Python version, so never the trainer's cluster) without waiting for
it, so it comes up while verl starts its workers and vLLM; ``GymServers.start(spec, ray_head=head)`` then waits
for it (:meth:`GymRayHead.wait_ready`, driven by the head's log) and hands its address to Gym as
``ray_head_node_address``. A Gym restart reuses the head while it is alive (``GymServers.restart``).

The head process:

- has a ``--temp-dir`` of its own: ``ray start`` records its address in ``<temp dir>/ray_current_cluster``, where
  every plain ``ray.init()`` on the machine would find and join it (or hang on it once it is gone); removed on stop;
- no dashboard web UI and, unless ``nemo_gym.access.ray_dashboard``, none of Ray's metrics exporters
  (``access.listen.ray_exporters_env``: the dashboard agent's, the dashboard process's and the autoscaler monitor's
  answer every user of the host); free ports for the GCS, the Ray client server and the dashboard agent (Ray's fixed defaults
  6379/10001/52365 collide between two heads on one machine); its workers' ports ephemeral, never Ray's CLI band
  that Gym's servers would otherwise share (:mod:`~nemo_gym_adapter.gym.ports`);
- a one-machine Ray: Gym's processes always run on the launcher's host and connect through 127.0.0.1, so the head
  runs with Ray's ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (``access.listen``): node address 127.0.0.1 and every one
  of its ports (GCS, raylet, workers, agents) on loopback -- ``--node-ip-address=127.0.0.1`` would not do it, Ray
  rewrites it to the host's address and binds its gRPC ports on every interface -- unless ``nemo_gym.env`` sets it;
- token auth with a token of its own, passed through the environment only (``RAY_AUTH_MODE=token``,
  ``RAY_AUTH_TOKEN``; Gym gets it via ``GymLaunchSpec.ray_auth_token``): loopback keeps other hosts out, the token
  other users of this host;
- the environment Gym's own processes get (``launch.gym_process_env``): the Ray workers Gym's servers start
  are the head's children and inherit it;
- is a ``procs.SessionProcess``: :meth:`GymRayHead.stop` stops the tree, then sweeps its session (Ray's agents are
  re-parented to init and ignore SIGTERM); registered with ``procs``, so atexit/SIGTERM stop it too; and, when it
  has a run directory, ``<run_dir>/gym_ray.pid`` (:data:`PID_FILE`) names its session until it stops, for the
  sweeps of :mod:`nemo_gym_adapter.runtime.reaper` (the trainer's watchdog, the driver) if the process that started it is
  killed outright.

In the trainer (:func:`nemo_gym_adapter.gym.early.early_gym_servers`): both recipe task runners start the head before ``init_workers``/``init``,
in the TaskRunner actor that later creates the rollout manager, and park it in :data:`EARLY` (a process-wide handle);
the manager claims it (:func:`claim_early_head`) and stops it at shutdown. A manager that finds none (tests build
managers directly) starts one itself at the top of its start-up (:func:`start_head_for`), before finding and
patching the replicas, so it still overlaps. ``nemo_gym.head_url`` (attach) starts none.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from pydantic import SecretStr

from nemo_gym_adapter.access.listen import LOCAL_ONLY_ENV, ray_exporters_env
from nemo_gym_adapter.config import NemoGymConfig
from nemo_gym_adapter.errors import GymServerError
from nemo_gym_adapter.gym.launch import gym_package_root, gym_process_env
from nemo_gym_adapter.runtime import paths
from nemo_gym_adapter.runtime.procs import (
    EarlySlot,
    LogWatch,
    SessionProcess,
    alive,
    descendants,
    free_port,
    log_tail,
    session_members,
)
from nemo_gym_adapter.runtime.reaper import write_pid_record

logger = logging.getLogger(__name__)

PID_FILE = "gym_ray.pid"  # in the run directory while the head runs (same record as managers.base's gym.pid)
READY_MARKER = b"Ray runtime started"  # what `ray start` prints once the head node is up
STOP_TIMEOUT_S = 3.0  # SIGTERM grace before SIGKILL (Ray's agents ignore SIGTERM anyway)
# A head that exits before it is up is started again (new ports) this many times within the same deadline. Measured
# in the e2e tier at load ~12: `ray start` gave up after 54 s with "The current node timed out during startup ...
# the GCS has become overloaded" and the whole run ended at start-up; load spikes pass, a new head comes up.
START_RETRIES = 2


def head_command(gym_venv: Path, port: int, client_port: int | None, agent_port: int, temp_dir: Path) -> list[str]:
    """``ray start --head --block`` from Gym's venv, with the ports and temp dir given (module docstring)."""
    cmd = [
        str(gym_venv / "bin" / "ray"),
        "start",
        "--head",
        "--block",
        f"--port={port}",
        "--include-dashboard=false",
        f"--dashboard-agent-listen-port={agent_port}",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
        # Ray's CLI default hands workers and drivers ports of 10002-19999, Gym's servers' default band (gym.ports);
        # 0 = ephemeral ports, what `ray.init()` of a local cluster does (ray/_private/services.py:1852)
        "--min-worker-port=0",
        "--max-worker-port=0",
    ]
    if client_port is not None:  # Ray refuses the option when its client server cannot run (no grpc)
        cmd.append(f"--ray-client-server-port={client_port}")
    return cmd


def head_env(
    gym_venv: Path,
    extra: Mapping[str, str],
    token: str,
    base: dict[str, str] | None = None,
    metrics: bool = False,
) -> dict[str, str]:
    """The head's environment: Gym's (:func:`launch.gym_process_env`) plus token auth with ``token``; Ray's metrics
    exporters off unless ``metrics`` (``nemo_gym.access.ray_dashboard``) or ``extra`` sets their variables."""
    env = gym_process_env(gym_venv, dict(extra), base)
    env.pop("RAY_AUTH_TOKEN_PATH", None)  # the token below is the only one
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    env.update({k: v for k, v in LOCAL_ONLY_ENV.items() if k not in extra})  # loopback only (module docstring)
    env.update(ray_exporters_env(extra, metrics))
    # Ray prestarts one Python worker per CPU when the first driver connects -- Gym's launcher, at the start of Gym's
    # spin-up, where those imports compete for the CPUs; Gym's servers only connect at start-up, so workers start
    # when a Gym server first submits Ray work instead (``nemo_gym.env`` can set it back to 1).
    env.setdefault("RAY_prestart_worker_first_driver", "0")
    # On SIGTERM, ``ray start --block`` (Ray 2.60) first drains the node for Ray Serve, polling for up to 30 s; Gym runs
    # no Serve, and our stop SIGKILLs the head after STOP_TIMEOUT_S: every run's end waited those seconds out and
    # killed the head instead of letting it tear its processes down. 0 = Ray's immediate teardown.
    env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
    return env


def _has_ray_client(gym_venv: Path) -> bool:
    try:
        return (gym_package_root(gym_venv) / "grpc").is_dir()
    except Exception:  # no Gym there: `ray start` will say so in its log
        return True


class GymRayHead:
    """A Ray head for Gym, from Gym's venv (module docstring). :meth:`start` returns at once; :meth:`wait_ready`
    returns its address once it is up."""

    def __init__(
        self,
        gym_venv: Path | None = None,
        run_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        metrics: bool = False,
    ) -> None:
        self.gym_venv = gym_venv or paths.gym_venv()
        self.run_dir = run_dir
        self.env = dict(env or {})
        self.metrics = metrics  # Ray's metrics exporters on (nemo_gym.access.ray_dashboard)
        self.proc: SessionProcess | None = None
        self.port = 0
        self.temp_dir: Path | None = None
        self.start_seconds: float | None = None  # spawn -> "Ray runtime started" seen (by wait_ready)
        self.restarts = 0
        self.start_retries_left = START_RETRIES
        self._token = SecretStr("")
        self._watch: LogWatch | None = None
        self._t0 = 0.0
        self._ready = False
        self._wait_lock = threading.Lock()  # one waiter at a time (a bench may watch it from another thread)

    @classmethod
    def start(
        cls,
        gym_venv: Path | None = None,
        run_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        metrics: bool = False,
    ) -> GymRayHead:
        """Spawn the head and return without waiting for it."""
        head = cls(gym_venv, run_dir, env, metrics)
        head._spawn()
        return head

    def _spawn(self) -> None:
        self.port, agent_port = free_port(), free_port()
        client_port = free_port() if _has_ray_client(self.gym_venv) else None
        # short: Ray's socket paths under it must fit in 107 bytes
        self.temp_dir = Path(tempfile.gettempdir()) / f"ngv-ray-{self.port}"
        log_dir = self.run_dir or paths.logs_dir() / "gym"
        log = log_dir / f"ray_head-{self.port}.log"
        token = secrets.token_hex(32)
        self._token = SecretStr(token)
        cmd = head_command(self.gym_venv, self.port, client_port, agent_port, self.temp_dir)
        env = head_env(self.gym_venv, self.env, token, metrics=self.metrics)
        self._t0, self._ready, self.start_seconds = time.monotonic(), False, None
        self.proc = SessionProcess("Gym's Ray head (ray start from Gym's venv)", cmd, log, env=env, cwd=self.run_dir)
        self.proc.stop_timeout_s = STOP_TIMEOUT_S
        self._watch = LogWatch(log, [READY_MARKER])
        self._write_pid_file()
        logger.info("Gym's Ray head starting at %s (pid %d), log %s", self.address, self.proc.pid, log)

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``: Gym's processes run on this host, and the head listens on loopback only."""
        return f"127.0.0.1:{self.port}"

    @property
    def auth_token(self) -> SecretStr:
        return self._token

    @property
    def log_path(self) -> Path | None:
        return self.proc.log_path if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def wait_ready(self, timeout: float) -> str:
        """The head's address once ``ray start`` says it is up (at once if it already did and still runs).

        Raises ``GymServerError`` naming the head, with its log tail, if it exits first or ``timeout`` passes."""
        if self.proc is None or self._watch is None:
            raise GymServerError("Gym's Ray head: wait_ready() before start()")
        with self._wait_lock:
            return self._wait_ready(time.monotonic() + timeout, timeout)

    def _wait_ready(self, deadline: float, timeout: float) -> str:
        assert self.proc is not None and self._watch is not None
        while not self._ready:
            if self._watch.wait(min(0.25, max(0.0, deadline - time.monotonic()))):
                self._ready = True
                self.start_seconds = time.monotonic() - self._t0
                logger.info("Gym's Ray head up at %s in %.1fs", self.address, self.start_seconds)
                break
            if not self.alive():
                why = f"exited with code {self.proc.popen.returncode} before it was up"
                if self.start_retries_left <= 0 or time.monotonic() >= deadline:
                    raise self._fail(why)
                self.start_retries_left -= 1
                logger.warning(
                    "Gym's Ray head %s %s (%s; log %s); starting a new one (retry %d of %d)",
                    self.address,
                    why,
                    _last_line(self.proc.log_path),
                    self.proc.log_path,
                    START_RETRIES - self.start_retries_left,
                    START_RETRIES,
                )
                self.restart()
                continue
            if time.monotonic() >= deadline:
                raise self._fail(f"not up after {timeout:.0f}s")
        if not self.alive():
            raise self._fail(f"exited with code {self.proc.popen.returncode} after it was up")
        self.proc.remember_descendants()
        return self.address

    def _fail(self, why: str) -> GymServerError:
        assert self.proc is not None
        return GymServerError(
            f"Gym's Ray head ({' '.join(self.proc.cmd[:3])}, {self.address}): {why}\n"
            f"--- last lines of {self.proc.log_path} ---\n{log_tail(self.proc.log_path)}"
        )

    def pids(self) -> set[int]:
        """The head and every live process of its tree and session."""
        if self.proc is None:
            return set()
        pid = self.proc.pid
        return {p for p in {pid, *descendants(pid), *session_members(pid)} if alive(p)}

    def restart(self) -> None:
        """Stop this head (if anything is left of it) and start a new one (new ports, temp dir and token)."""
        self.stop()
        self.restarts += 1
        self._spawn()

    def stop(self) -> None:
        """Stop the head's tree and session, remove its temp dir and pid file. Idempotent."""
        if self.proc is not None:
            self.proc.stop()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        if self.run_dir is not None:
            (self.run_dir / PID_FILE).unlink(missing_ok=True)

    def _write_pid_file(self) -> None:
        if self.run_dir is not None and self.proc is not None:
            write_pid_record(self.run_dir / PID_FILE, [self.proc.pid])  # it leads its session

    def __repr__(self) -> str:
        state = "up" if self._ready and self.alive() else "starting" if self.alive() else "stopped"
        return f"GymRayHead({self.address}, {state})"


def _last_line(path: Path | None) -> str:
    lines = [line for line in log_tail(path).splitlines() if line.strip()] if path else []
    return lines[-1].strip() if lines else "no output"


# --------------------------------------------------------------------------------- the trainer's early start

EARLY: EarlySlot[GymRayHead] = EarlySlot()  # started by gym.early.early_gym_servers(), not yet claimed here


def wants_head(gym: NemoGymConfig) -> bool:
    """True when we start Gym's Ray head: ``nemo_gym.ray_head: early`` and Gym is started, not attached."""
    return gym.head_url is None and gym.ray_head == "early"


def start_head_for(gym: NemoGymConfig) -> GymRayHead:
    """Start the head the ``nemo_gym:`` section asks for (its Gym venv, run dir and environment)."""
    run_dir = Path(gym.run_dir) if gym.run_dir else None
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
    return GymRayHead.start(Path(gym.gym_venv) if gym.gym_venv else None, run_dir, gym.env, gym.access.ray_dashboard)


def claim_early_head() -> GymRayHead | None:
    """The head :func:`~nemo_gym_adapter.gym.early.early_gym_servers` started in this process (the caller now owns it and stops it), restarted
    first if it died; None when there is none."""
    head = EARLY.claim()
    if head is not None and not head.alive():
        logger.warning("Gym's Ray head started early is gone (log %s); starting a new one", head.log_path)
        head.restart()
    return head
