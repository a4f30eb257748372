"""A warm Gym launcher (component 3): ``nemo_gym.warm_launcher: true``, the default.

Gym's launcher (``gym env start``, Gym's venv) spends its first ~2.3 s alone on one core importing scipy, numpy,
pandas, openai, wandb, sqlalchemy, fastapi...: the start of Gym's spin-up critical path. :class:`WarmLauncher` starts
that interpreter early, next to Gym's Ray head (:func:`early.early_gym_servers`, or the manager's own start), running
:mod:`nemo_gym_adapter.gym.warm_boot`: it imports those third-party modules (:data:`PRELOAD`) and waits for one
command on its stdin. ``GymServers.start(spec, warm=)`` then hands it the launch (:meth:`WarmLauncher.launch`: the
``gym env start`` argv, cwd = Gym's run dir, log = ``<run_dir>/gym.log``) and it runs Gym's own ``gym`` script
in-process: same argv, cwd, log, environment, interpreter (the script's ``#!``) and ``sys.path[0]`` as a cold launch.
``nemo_gym`` itself is imported only then (~0.2 s): its ``__init__`` derives paths, ``sys.path`` and ``HF_HOME`` from
the cwd at import, which is only known at launch.

It falls back to the cold launch, with a warning saying why, when the warm process died, is not ready within
:data:`READY_TIMEOUT_S`, or was started for another Gym venv or another environment (:func:`env_mismatch`: its
environment is fixed at start -- what launch.gym_env gives for ``nemo_gym.env``, the API key and the Ray head's
address and token -- and pre-imported modules may have read it, so a launch whose environment differs in any
variable goes cold; names only are logged, never values).

One launch per warm process: Gym restarts (``on_server_down: restart``, ``GymServers.restart``) launch cold. A
restart is rare, and a fresh warm process after each use would put ~1.6 CPU s of imports on 2 cores beside every
training run's steps to save ~2 s on that rare path; a restarted Ray head has a new token anyway.

Lifecycle: a ``procs.SessionProcess`` (its own session and log ``<log dir>/gym_warm-<pid>.log``), so it is stopped by
:meth:`WarmLauncher.stop`, at exit and on SIGTERM; with a run dir, ``<run_dir>/gym_warm.pid`` (:data:`PID_FILE`)
names it for the driver's sweep until it is stopped or handed over (then ``gym.pid`` covers it). If the trainer dies
outright, the warm process reads end-of-input on stdin and exits by itself.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import shlex
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import SecretStr

from nemo_gym_adapter.access.key import policy_key
from nemo_gym_adapter.config import NemoGymConfig
from nemo_gym_adapter.errors import AdapterError
from nemo_gym_adapter.gym import warm_boot
from nemo_gym_adapter.gym.launch import GymLaunchSpec, access_env, gym_env
from nemo_gym_adapter.runtime import paths
from nemo_gym_adapter.runtime.procs import (
    EarlySlot,
    LogWatch,
    SessionProcess,
    alive,
    log_tail,
    session_members,
)
from nemo_gym_adapter.runtime.reaper import write_pid_record

if TYPE_CHECKING:
    from nemo_gym_adapter.gym.ray_head import GymRayHead

logger = logging.getLogger(__name__)

PID_FILE = "gym_warm.pid"  # in the run directory while the warm launcher waits (same record as gym.pid)
READY_TIMEOUT_S = 30.0  # at launch: how long to wait for imports still under way before launching cold instead
STOP_TIMEOUT_S = 3.0
_SEQ = itertools.count(1)  # log names of the warm launchers this process starts
# Third-party modules Gym 0.7's launcher imports (``-X importtime`` of ``nemo_gym.cli.env``, plus ray, which it
# imports to join the head), none reading the cwd or sys.argv at import. Never nemo_gym or Hugging Face libraries
# (warm_boot.CWD_SENSITIVE: the boot exits rather than keep them).
PRELOAD: tuple[str, ...] = (
    "numpy",
    "scipy.stats",
    "pandas",
    "openai",
    "wandb",
    "sqlalchemy",
    "devtools",
    "fastapi",
    "aiohttp",
    "requests",
    "hydra",
    "omegaconf",
    "uvicorn",
    "pydantic",
    "rich.markdown",
    "rich.table",
    "psutil",
    "tqdm.auto",
    "ray",
)


def interpreter(script: Path, fallback: Path) -> list[str]:
    """What the kernel runs for ``script`` (its ``#!`` line, split), so the warm process has the ``sys.executable``
    a cold launch has; ``[fallback]`` when the script has no usable ``#!`` line."""
    try:
        with open(script, "rb") as f:
            first = f.readline(4096).decode("utf-8", errors="replace").strip()
    except OSError:
        return [str(fallback)]
    if first.startswith("#!"):
        words = shlex.split(first[2:])
        if words:
            return words
    return [str(fallback)]


def ready_at(log_text: str, started: float) -> float | None:
    """Seconds from ``started`` (``time.time()``) to the boot's ready line in ``log_text`` (None if absent)."""
    match = re.search(re.escape(warm_boot.READY_LINE) + r" at t=([0-9.]+)", log_text)
    return float(match.group(1)) - started if match else None


def env_mismatch(started_with: Mapping[str, str], launch: Mapping[str, str]) -> list[str]:
    """Names of the variables that differ between the two environments (set in one only, or to another value)."""
    return sorted(k for k in set(started_with) | set(launch) if started_with.get(k) != launch.get(k))


class WarmLauncher:
    """Gym's interpreter with its imports done, waiting for one launch (module docstring)."""

    def __init__(
        self,
        gym_venv: Path,
        env: Mapping[str, str],
        run_dir: Path | None = None,
        preload: Sequence[str] | None = None,
    ) -> None:
        self.gym_venv = gym_venv
        self.script = gym_venv / "bin" / "gym"
        self.env = dict(env)
        self.run_dir = run_dir
        self.preload = list(PRELOAD if preload is None else preload)
        self.proc: SessionProcess | None = None  # None once handed over (or never started)
        self.launched = False
        self._watch: LogWatch | None = None
        self._ready = False
        self._t0 = 0.0
        self.ready_seconds: float | None = None  # spawn -> imports done (read from its log by launch())

    @classmethod
    def start(
        cls,
        gym_venv: Path,
        env: Mapping[str, str],
        run_dir: Path | None = None,
        preload: Sequence[str] | None = None,
    ) -> WarmLauncher:
        """Spawn it and return at once."""
        warm = cls(gym_venv, env, run_dir, preload)
        warm._spawn()
        return warm

    @classmethod
    def for_spec(
        cls,
        spec: GymLaunchSpec,
        head: GymRayHead | None = None,
        run_dir: Path | None = None,
        preload: Sequence[str] | None = None,
    ) -> WarmLauncher:
        """Start one for the launch of ``spec`` (joining ``head`` if given, as ``GymServers.start`` will); its log and
        pid file go to ``run_dir`` (default: the spec's)."""
        address, token = (head.address, head.auth_token) if head else (spec.ray_head_node_address, spec.ray_auth_token)
        guard = access_env(spec.access_key, spec.host, spec.port_range, spec.head_port)
        env = gym_env(
            spec.gym_venv, spec.env, spec.policy_api_key, address, token, guard=guard, ray_metrics=spec.ray_metrics
        )
        return cls.start(spec.gym_venv, env, run_dir or spec.run_dir, preload)

    def _spawn(self) -> None:
        cmd = [
            *interpreter(self.script, self.gym_venv / "bin" / "python"),
            str(Path(warm_boot.__file__).resolve()),
            str(self.script),
            ",".join(self.preload),
        ]
        log_dir = self.run_dir or paths.logs_dir() / "gym"
        log = log_dir / f"gym_warm-{time.strftime('%Y%m%d-%H%M%S')}-{next(_SEQ)}.log"
        self._t0 = time.time()
        self.proc = SessionProcess(
            "warm Gym launcher (pre-imports, waits for the launch)",
            cmd,
            log,
            env=self.env,
            cwd=self.run_dir,
            stdin=subprocess.PIPE,
        )
        self.proc.stop_timeout_s = STOP_TIMEOUT_S
        self._watch = LogWatch(log, [warm_boot.READY_LINE.encode()])
        if self.run_dir is not None:
            write_pid_record(self.run_dir / PID_FILE, [self.proc.pid])  # it leads its own session
        logger.info("warm Gym launcher starting (pid %d), log %s", self.proc.pid, log)

    @property
    def log_path(self) -> Path | None:
        return self.proc.log_path if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def pids(self) -> set[int]:
        """The waiting process and what is left in its session (nothing once handed over: Gym's pids then)."""
        if self.proc is None:
            return set()
        return {p for p in {self.proc.pid, *session_members(self.proc.pid)} if alive(p)}

    def launch(self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path) -> SessionProcess | None:
        """Hand this process the launch ``argv`` (``gym env start ...``) to run in ``cwd`` with its output appended to
        ``log_path``; it is then Gym's launcher and the caller's to stop (returned). None, with a warning naming
        the reason, when it cannot be used (then it is stopped and the caller launches cold)."""
        why = self._unusable(argv, env)
        if why is not None:
            logger.warning(
                "nemo_gym.warm_launcher: the warm Gym launcher (%s) %s; launching Gym cold", self.log_path, why
            )
            self.stop()
            return None
        proc = self.proc
        assert proc is not None and proc.popen.stdin is not None
        with open(log_path, "ab") as log:  # the header a cold launch's log starts with (procs.ManagedProcess)
            log.write(f"\n$ {' '.join(argv)}\n".encode())
        try:
            proc.popen.stdin.write(
                (json.dumps({"argv": list(argv), "cwd": str(cwd), "log": str(log_path)}) + "\n").encode()
            )
            proc.popen.stdin.close()
        except OSError as e:  # it died just now
            logger.warning(
                "warm Gym launcher (%s): the launch could not be sent (%s); launching Gym cold", proc.log_path, e
            )
            self.stop()
            return None
        logger.info(
            "Gym launched by the warm launcher (pid %d, imports done %.1fs after its start)",
            proc.pid,
            self.ready_seconds or 0,
        )
        proc.name = f"NeMo Gym launcher (warm; its imports: {proc.log_path})"
        proc.log_path = log_path
        self.proc, self.launched = None, True
        self._remove_pid_file()
        return proc

    def _unusable(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        """Why this process cannot run the launch ``argv`` with ``env``; None when it can (waits for its imports)."""
        if self.proc is None:
            return "was already used" if self.launched else "was stopped"
        if not argv or Path(argv[0]) != self.script:
            return f"was started for {self.script}, the launch runs {argv[0] if argv else '(nothing)'}"
        differ = env_mismatch(self.env, env)
        if differ:
            return (
                f"was started with another environment: the launch's differs in {differ} (nemo_gym.env, "
                "nemo_gym.policy_api_key, the Ray head or the trainer's own environment changed since)"
            )
        return self._wait_ready(READY_TIMEOUT_S)

    def _wait_ready(self, timeout: float) -> str | None:
        assert self.proc is not None and self._watch is not None
        deadline = time.monotonic() + timeout
        while not self._ready:
            if self._watch.wait(min(0.25, max(0.0, deadline - time.monotonic()))):
                self._ready, self.ready_seconds = True, ready_at(log_tail(self.proc.log_path, 20), self._t0)
                break
            if not self.proc.alive():
                code = self.proc.popen.returncode
                return f"exited with code {code} before its imports were done; last lines:\n{log_tail(self.proc.log_path, 5)}"
            if time.monotonic() >= deadline:
                return f"has not finished its imports after {timeout:.0f}s"
        if not self.proc.alive():
            return f"exited with code {self.proc.popen.returncode}; last lines:\n{log_tail(self.proc.log_path, 5)}"
        return None

    def stop(self) -> None:
        """Stop the waiting process (a no-op once handed over: it is Gym's launcher then) and remove its pid file."""
        if self.proc is not None:
            self.proc.stop()
        self._remove_pid_file()

    def _remove_pid_file(self) -> None:
        if self.run_dir is not None:
            (self.run_dir / PID_FILE).unlink(missing_ok=True)

    def __repr__(self) -> str:
        state = "used" if self.launched else "waiting" if self.alive() else "stopped"
        return f"WarmLauncher({self.script}, {state})"


# --------------------------------------------------------------------------------- the trainer's early start

EARLY: EarlySlot[WarmLauncher] = EarlySlot()  # started next to the early Ray head, not yet claimed by a manager


def wants_warm(gym: NemoGymConfig) -> bool:
    """True when we start a warm launcher: ``nemo_gym.warm_launcher: true`` and Gym is started, not attached."""
    return gym.head_url is None and gym.warm_launcher


def start_warm_for(gym: NemoGymConfig, head: GymRayHead | None) -> WarmLauncher | None:
    """Start a warm launcher with the environment the ``nemo_gym:`` section's Gym will get (joining ``head``); None,
    with a warning, if it cannot be started (Gym then launches cold, and fails there if the venv is broken)."""
    try:
        return _start_warm_for(gym, head)
    except (OSError, AdapterError) as e:
        logger.warning("nemo_gym.warm_launcher: could not start a warm Gym launcher (%s); Gym will launch cold", e)
        return None


def _start_warm_for(gym: NemoGymConfig, head: GymRayHead | None) -> WarmLauncher:
    gym_venv = Path(gym.gym_venv) if gym.gym_venv else paths.gym_venv()
    token: SecretStr | None
    address, token = (head.address, head.auth_token) if head else (gym.external_ray_head, None)
    key = policy_key(gym)
    # Gym's host is chosen later (addresses.choose_gym_host); loopback is the one-host answer. Elsewhere the launch's
    # environment differs and the launch is cold (env_mismatch), which costs time, not safety.
    guard = access_env(key, "127.0.0.1", gym.port_range, gym.head_port) if gym.guards_gym else None
    env = gym_env(gym_venv, dict(gym.env), key, address, token, guard=guard, ray_metrics=gym.access.ray_dashboard)
    run_dir = Path(gym.run_dir) if gym.run_dir else None
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
    return WarmLauncher.start(gym_venv, env, run_dir)


def claim_early_warm() -> WarmLauncher | None:
    """The warm launcher started early in this process (the caller now owns it), or None."""
    return EARLY.claim()
