"""Start, attach to and stop NeMo Gym 0.7 from the trainer process (component 3).

Gym runs in its own venv (``paths.gym_venv()``) as ``<gym venv>/bin/gym env start`` -- one launcher process that
starts a Ray cluster (Gym always calls ``ray.init``), a head server thread and one subprocess per configured server.
We never import ``nemo_gym`` (it rewrites ``sys.path``, ``HF_HOME`` and ``builtins.print``); everything after the
launch is HTTP against the head server: ``/health`` (200 only once every server and model endpoint answers),
``/server_instances`` and ``/global_config_dict_yaml``. :meth:`GymServers.start` returns as soon as that condition
holds (every instance and model endpoint answers), checked whenever Gym's log announces a server, instead of waiting
for the head's flag, which Gym's launcher sets after its own fixed 3 s polling rounds
(:mod:`~nemo_gym_adapter.gym.readiness`, which also names the culprit when Gym does not come up).

    with GymServers.start(GymLaunchSpec(config_paths=[...], policy_base_url=["127.0.0.1:8000"],
                                        policy_model_name="m")) as gym:
        gym.head_url, gym.global_config(), gym.server_instances(), gym.run_url("my_agent")

Lifecycle (STYLE.md §8): the launcher runs in its own session with its log under ``run_dir``; Gym's per-server logs
go to ``run_dir/servers/<name>.log``; ``run_dir/gym.pid`` (:data:`PID_FILE`, a ``reaper`` record) names that session
from the launch until :meth:`GymServers.stop`, for a sweep should the process that started Gym be killed outright. Teardown (context exit, exception, ``stop()``, SIGTERM/atexit via
``procs.stop_all``) stops the pid tree, then sweeps the launcher's *session*: Ray's agents are re-parented to init
when the raylet dies and ignore SIGTERM, but they keep the session id, so they are found by it, never by name.
``attach`` mode owns nothing and never stops anything. Given a Ray head started earlier (``start(spec, ray_head=)``,
:mod:`nemo_gym_adapter.gym.ray_head`), Gym joins it instead of starting its own. What to start (spec, config file, command,
environment) is :mod:`nemo_gym_adapter.gym.launch`; what a running Gym answers over HTTP is
:class:`nemo_gym_adapter.gym.head.GymHead`.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path

from nemo_gym_adapter.access import gym_guard
from nemo_gym_adapter.errors import AdapterConfigError, GymServerError
from nemo_gym_adapter.gym import readiness, venv_prep
from nemo_gym_adapter.gym.head import GymHead, GymServerInstance, http_get
from nemo_gym_adapter.gym.launch import (
    TRAINING_MODEL_CONFIG,
    GymLaunchSpec,
    config_files,
    launch_command,
    launch_config,
    launch_env,
    resolve_config_paths,
)
from nemo_gym_adapter.gym.ports import HEAD_SERVER, GymPortInUseError, free_port_in, safe_port_range
from nemo_gym_adapter.gym.ray_head import GymRayHead
from nemo_gym_adapter.gym.warm import WarmLauncher
from nemo_gym_adapter.runtime import paths
from nemo_gym_adapter.runtime.procs import SessionProcess, alive, session_members
from nemo_gym_adapter.runtime.reaper import write_pid_record

__all__ = ["TRAINING_MODEL_CONFIG", "GymHead", "GymLaunchSpec", "GymServerInstance", "GymServers"]

logger = logging.getLogger(__name__)
PID_FILE = "gym.pid"  # in a launch's run dir from its launch until it is stopped (reaper; the manager rewrites it)


class GymServers(GymHead):
    """A running NeMo Gym, started by us (:meth:`start`) or attached to (:meth:`attach`). Context manager."""

    def __init__(self, head_url: str, launcher: SessionProcess | None = None, run_dir: Path | None = None) -> None:
        super().__init__(head_url)
        self._launcher = launcher
        self.run_dir = run_dir
        self.startup_seconds: float | None = None
        self.spec: GymLaunchSpec | None = None  # what start() ran (head port fixed), for restart()
        self.restarts = 0
        self.on_restart: list[Callable[[GymServers], None]] = []  # run after each restart (e.g. a new pid file)
        self.ray_head: GymRayHead | None = None  # the Ray head Gym joined (start(ray_head=)); used, not owned
        self.ray_wait_seconds = 0.0  # of startup_seconds: waiting for that head
        self.warm = False  # launched by a warm launcher (start(warm=)), not cold
        self._record: Path | None = None  # the launch's pid record (PID_FILE in its run dir) until stop()
        self.attach_timeout_s = 60.0  # attach(): how long to wait for it, then and at each reattach()

    @classmethod
    def start(
        cls, spec: GymLaunchSpec, ray_head: GymRayHead | None = None, warm: WarmLauncher | None = None
    ) -> GymServers:
        """Launch Gym and wait until the head reports ready and every server instance answers.

        With ``ray_head`` (:class:`ray_head.GymRayHead`, started earlier), first wait for it and have Gym join it
        (``ray_head_node_address`` and its token) instead of starting a Ray cluster of its own; the wait counts in
        ``startup_seconds`` (``ray_wait_seconds`` alone). The head is used, not owned: :meth:`stop` leaves it.
        With ``warm`` (:class:`warm.WarmLauncher`), that process runs the launch (its imports already done) and
        becomes Gym's launcher, owned like a cold one; if it cannot, the launch is cold (it logs why).

        A server (or the head server) that loses its port to another process between Gym's probe and its bind is
        relaunched with new ports, with a warning naming the server and the port, up to ``spec.port_retries`` times
        (:mod:`~nemo_gym_adapter.gym.ports`); each retry logs under ``<run_dir>/port_retry<n>`` and launches cold (a
        warm launcher serves one launch); a lost head port is retried only when ``spec.head_port`` was not pinned.
        ``run_dir`` stays the first attempt's (pid records, restarts).

        Raises ``AdapterConfigError`` for a bad spec (before starting anything) and ``GymServerError`` naming the
        server that is not ready (or the Ray head), with its log tail, on timeout or crash
        (``ports.GymPortInUseError`` once the retries are spent); everything started is stopped first.
        """
        pinned_head = spec.head_port is not None
        first_run_dir: Path | None = None  # the first attempt's (its default name is only known once it ran)
        for attempt in range(spec.port_retries + 1):
            try:
                gym = cls._start_once(spec, ray_head, warm)
            except GymPortInUseError as e:
                if attempt == spec.port_retries or (e.server == HEAD_SERVER and pinned_head):
                    raise
                first_run_dir = first_run_dir or e.run_dir
                retry_dir = first_run_dir / f"port_retry{attempt + 1}" if first_run_dir is not None else None
                logger.warning(
                    "NeMo Gym: %s lost port %d to another process (address already in use); relaunching Gym with new "
                    "ports (retry %d of nemo_gym.port_retries=%d, logs in %s)",
                    e.server,
                    e.port,
                    attempt + 1,
                    spec.port_retries,
                    retry_dir,
                )
                spec, warm = spec.model_copy(update={"run_dir": retry_dir}), None
                continue
            if first_run_dir is not None:
                gym.run_dir = first_run_dir
            return gym
        raise AssertionError("unreachable: the last attempt returns or raises")

    @classmethod
    def _start_once(
        cls, spec: GymLaunchSpec, ray_head: GymRayHead | None = None, warm: WarmLauncher | None = None
    ) -> GymServers:
        """One launch of :meth:`start` (no retry)."""
        config_paths = resolve_config_paths(spec)
        python = spec.gym_venv / "bin" / "python"
        if not python.exists():
            raise AdapterConfigError(f"gym.gym_venv: {python} missing; run scripts/setup.sh")
        files = config_files(spec, config_paths)
        if spec.server_venvs_dir is not None:  # a server not prepared at set-up is prepared now, never by Gym's uv
            roots = tuple(Path(r) for r in spec.env.get("NEMO_GYM_EXTRA_ROOTS", "").split(os.pathsep) if r)
            venv_prep.ensure(files, spec.gym_venv, spec.server_venvs_dir, roots, spec.config_overrides)
        t0 = time.monotonic()
        if ray_head is not None:
            address = ray_head.wait_ready(spec.startup_timeout_s)
            spec = spec.model_copy(update={"ray_head_node_address": address, "ray_auth_token": ray_head.auth_token})
        ray_wait_s = time.monotonic() - t0
        probe_host = spec.host if spec.host != "0.0.0.0" else "127.0.0.1"
        head_port = spec.head_port or free_port_in(probe_host, *(spec.port_range or safe_port_range()))
        run_dir = spec.run_dir or paths.logs_dir() / "gym" / f"{time.strftime('%Y%m%d-%H%M%S')}-{head_port}"
        run_dir.mkdir(parents=True, exist_ok=True)
        launch_yaml = run_dir / "ngv_launch.yaml"
        cfg = launch_config(spec, head_port, run_dir, files)
        launch_yaml.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
        cmd, env = launch_command(spec, config_paths, launch_yaml), launch_env(spec)
        if spec.access_key is not None:  # our reads of Gym (readiness included) send it from now on
            gym_guard.use_key(spec.access_key.get_secret_value())
        launcher = warm.launch(cmd, env, run_dir, run_dir / "gym.log") if warm is not None else None
        warm_used = launcher is not None
        if launcher is None:
            launcher = SessionProcess("NeMo Gym launcher", cmd, run_dir / "gym.log", env=env, cwd=run_dir)
        launcher.stop_timeout_s = spec.stop_timeout_s
        # From the launch on, not only once Gym is ready: the launcher leads the session every Gym server joins.
        write_pid_record(run_dir / PID_FILE, [launcher.pid])
        gym = cls(f"http://{_connect_host(spec.host)}:{head_port}", launcher=launcher, run_dir=run_dir)
        gym._record = run_dir / PID_FILE
        gym.ray_head, gym.ray_wait_seconds, gym.warm = ray_head, ray_wait_s, warm_used
        try:
            readiness.wait_ready(gym, launcher, t0 + spec.startup_timeout_s, spec, run_dir)
            if spec.access_key is not None:  # every server refuses a keyless request, or the launch stops
                gym_guard.check_guarded(gym.base_urls())
        except BaseException:
            gym.stop()
            raise
        launcher.remember_descendants()
        gym.startup_seconds = time.monotonic() - t0
        gym.spec = spec.model_copy(update={"head_port": head_port, "run_dir": run_dir})
        return gym

    def restart(self, drop_replicas: Sequence[str] = ()) -> None:
        """Stop this Gym and start it again from the same spec, on the same head port (``head_url`` stays), its logs
        in ``<run_dir>/restart<n>``. ``drop_replicas`` (``host:port``) leave ``policy_base_url``: Gym 0.7's model
        proxy cannot stop routing to a dead vLLM replica otherwise. Restarts every server: Gym's launcher stops
        all of them anyway within a minute of one dying. Raises ``GymServerError`` for an attached Gym, when no
        replica would be left, or (as :meth:`start`) when the new Gym does not come up. The Ray head Gym joined
        (``start(ray_head=)``) is reused while it is alive, else restarted first. The launch is cold (a warm
        launcher serves one launch: ``gym.warm``)."""
        if self._launcher is None or self.spec is None:
            raise GymServerError(f"Gym at {self.head_url} was not started by us; it cannot be restarted")
        spec = self.spec
        keep = [u for u in spec.policy_base_url if urllib.parse.urlsplit(u).netloc not in set(drop_replicas)]
        if not keep:
            raise GymServerError(f"Gym at {self.head_url}: every vLLM replica is down ({list(drop_replicas)})")
        self.restarts += 1
        run_dir = (self.run_dir or paths.logs_dir() / "gym") / f"restart{self.restarts}"
        # The old record stays until the new launch has written its own: the run dir is never without one, so its
        # watchdog (runtime.reaper) does not take the restart for the Gym's end.
        old_record, self._record = self._record, None
        try:
            self.stop()
            head = self.ray_head
            if head is not None and not head.alive():
                logger.warning("Gym's Ray head %s is gone (log %s); starting a new one", head.address, head.log_path)
                head.restart()
            new = GymServers.start(spec.model_copy(update={"policy_base_url": keep, "run_dir": run_dir}), ray_head=head)
        finally:
            if old_record is not None:
                old_record.unlink(missing_ok=True)
        # run_dir stays the first one (pid file, sweep); the new launcher logs under restart<n>/.
        self._launcher, self.spec, self._config, self._record = new._launcher, new.spec, None, new._record
        self.head_url, self.startup_seconds = new.head_url, new.startup_seconds
        self.ray_wait_seconds, self.warm = new.ray_wait_seconds, new.warm
        logger.warning(
            "Gym restarted (%d) in %.1fs at %s, replicas %s",
            self.restarts,
            new.startup_seconds or 0,
            self.head_url,
            keep,
        )
        for hook in self.on_restart:
            hook(self)

    @classmethod
    def attach(cls, head_url: str, timeout: float = 60.0) -> GymServers:
        """Use a Gym someone else started (never stopped by us); waits up to ``timeout`` for it to be ready."""
        gym = cls(head_url)
        gym.attach_timeout_s = timeout
        gym._wait_attached(timeout)
        return gym

    def reattach(self) -> None:
        """An attached Gym that went down (its host lost, its service restarted): wait up to ``attach_timeout_s`` for
        the Gym at ``head_url`` to answer and be ready again, forget what was read of the old one (its servers'
        ports change with a new launch) and run the ``on_restart`` hooks (the manager checks again that it calls
        exactly our replicas). Counted in ``restarts``. Raises ``GymServerError`` when it does not come back, and
        for a Gym we started (:meth:`restart` is for that one)."""
        if self.owned:
            raise GymServerError(f"Gym at {self.head_url} was started by us: restart() it, not reattach()")
        t0 = time.monotonic()
        self._wait_attached(self.attach_timeout_s)
        self._config = None
        self.restarts += 1
        logger.warning("Gym at %s answers again after %.1fs: attached again", self.head_url, time.monotonic() - t0)
        for hook in self.on_restart:
            hook(self)

    def _wait_attached(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status, _ = http_get(f"{self.head_url}/health")
                if status == 200 and not self.unready_instances():
                    return
                last = f"/health answered {status}"
            except OSError as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise GymServerError(f"Gym head server at {self.head_url}: not ready after {timeout:.0f}s ({last})")
            time.sleep(0.5)

    @property
    def owned(self) -> bool:
        """True when we started this Gym (and so stop it)."""
        return self._launcher is not None

    @property
    def log_path(self) -> Path | None:
        return self._launcher.log_path if self._launcher else None

    def pids(self) -> set[int]:
        """Launcher + every live descendant and session member (empty in attach mode)."""
        if self._launcher is None:
            return set()
        self._launcher.remember_descendants()
        pids = {self._launcher.pid, *self._launcher._known_descendants, *session_members(self._launcher.pid)}
        return {p for p in pids if alive(p)}

    def stop(self) -> None:
        """Stop everything we started (idempotent); a no-op for an attached Gym."""
        if self._launcher is not None:
            self._launcher.stop()
            gym_guard.use_key(None)
        if self._record is not None:
            self._record.unlink(missing_ok=True)

    def __enter__(self) -> GymServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host
