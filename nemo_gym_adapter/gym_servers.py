"""Start, attach to and stop NeMo Gym 0.7 from the trainer process (component 3).

Gym runs in its own venv (``paths.gym_venv()``) as ``<gym venv>/bin/gym env start`` -- one launcher process that
starts a Ray cluster (Gym always calls ``ray.init``), a head server thread and one subprocess per configured server.
We never import ``nemo_gym`` (it rewrites ``sys.path``, ``HF_HOME`` and ``builtins.print``); everything after the
launch is HTTP against the head server: ``/health`` (200 only once every server and model endpoint answers),
``/server_instances`` and ``/global_config_dict_yaml``.

    with GymServers.start(GymLaunchSpec(config_paths=[...], policy_base_url=["127.0.0.1:8000"],
                                        policy_model_name="m")) as gym:
        gym.head_url, gym.global_config(), gym.server_instances(), gym.run_url("my_agent")

Lifecycle (STYLE.md §8): the launcher runs in its own session with its log under ``run_dir``; Gym's per-server logs
go to ``run_dir/servers/<name>.log``. Teardown (context exit, exception, ``stop()``, SIGTERM/atexit via
``procs.stop_all``) stops the pid tree, then sweeps the launcher's *session*: Ray's agents are re-parented to init
when the raylet dies and ignore SIGTERM, but they keep the session id, so they are found by it, never by name.
``attach`` mode owns nothing and never stops anything.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from nemo_gym_adapter import paths
from nemo_gym_adapter.errors import AdapterConfigError, GymServerError
from nemo_gym_adapter.procs import ManagedProcess, free_port, kill_tree, log_tail

TRAINING_MODEL_CONFIG = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
_API_KEY_ENV = "NGV_GYM_POLICY_API_KEY"  # the key reaches Gym via ${oc.env:...}, never argv or a file
_API_KEY_REF = "${oc.env:" + _API_KEY_ENV + "}"
# Trainer-side variables that must not leak into Gym's interpreter or make it join the trainer's Ray cluster
# (Ray refuses a driver with another Python minor version anyway).
_SCRUBBED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "RAY_ADDRESS", "CONDA_PREFIX")
logger = logging.getLogger(__name__)
_CRASHED = re.compile(r"Process `([^`]+)` finished unexpectedly")


class GymLaunchSpec(BaseModel):
    """What to start. Invalid values raise pydantic's ``ValidationError`` naming the field (use :meth:`parse`
    to get an ``AdapterConfigError`` with dotted keys instead)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config_paths: list[str] = Field(min_length=1, description="Gym configs; relative: trainer cwd, then Gym's root")
    policy_base_url: list[str] = Field(min_length=1, description="vLLM replicas: 'host:port' or 'http://host:port/v1'")
    policy_model_name: str = Field(min_length=1)
    policy_api_key: SecretStr = SecretStr("EMPTY")
    host: str = Field("127.0.0.1", description="Gym's default_host and head host (addresses.choose_gym_host)")
    head_port: int | None = Field(None, ge=1, le=65535, description="None: a free port")
    port_range: tuple[int, int] | None = Field(None, description="Gym's port_range_low/high for its servers")
    ray_head_node_address: str | None = Field(None, description="a Ray cluster started with Gym's Python version")
    gym_venv: Path = Field(default_factory=paths.gym_venv)
    server_venvs_dir: Path | None = Field(
        default_factory=paths.gym_server_venvs_dir, description="uv_venv_dir with prebuilt .venv links; None: uv"
    )
    config_overrides: dict[str, Any] = Field(default_factory=dict, description="merged last (written as YAML)")
    hydra_overrides: list[str] = Field(default_factory=list, description="raw `gym env start` overrides, last")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment for Gym")
    startup_timeout_s: float = Field(300.0, gt=0)
    stop_timeout_s: float = Field(3.0, gt=0, description="SIGTERM grace before SIGKILL (Ray agents ignore it)")
    run_dir: Path | None = Field(None, description="Gym's cwd and logs; default logs/gym/<time>-<port>")

    @field_validator("policy_base_url")
    @classmethod
    def _normalise_urls(cls, urls: list[str]) -> list[str]:
        out = []
        for i, url in enumerate(urls):
            url = url.strip().rstrip("/")
            if "://" not in url:
                url = f"http://{url}"  # verl keys replicas by "ip:port"
            if not re.fullmatch(r"https?://[^/\s]+(/v1)?", url):
                raise ValueError(f"[{i}] {url!r} is not 'host:port' or 'http://host:port/v1'")
            out.append(url if url.endswith("/v1") else f"{url}/v1")
        return out

    @field_validator("port_range")
    @classmethod
    def _ordered(cls, pr: tuple[int, int] | None) -> tuple[int, int] | None:
        if pr is not None and not (1024 <= pr[0] < pr[1] <= 65535):
            raise ValueError(f"{pr} must be (low, high) with 1024 <= low < high <= 65535")
        return pr

    @classmethod
    def parse(cls, data: dict[str, Any], prefix: str = "gym") -> GymLaunchSpec:
        """Validate a plain dict (e.g. from the training config); errors name the dotted key, e.g. ``gym.host``."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            lines = [f"{prefix}.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
            raise AdapterConfigError("invalid Gym launch spec:\n  " + "\n  ".join(lines)) from e


class GymServerInstance(BaseModel):
    """One entry of the head server's ``/server_instances`` (extra fields kept)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    process_name: str
    server_type: str
    name: str  # the implementation, e.g. ``simple_agent``
    host: str
    port: int
    url: str


def gym_package_root(gym_venv: Path) -> Path:
    """Gym's install root (site-packages holding ``nemo_gym/`` and the built-in ``resources_servers/`` etc.)."""
    for site in sorted(gym_venv.glob("lib/python3*/site-packages")):
        if (site / "nemo_gym").is_dir():
            return site
    raise AdapterConfigError(f"gym.gym_venv: no nemo_gym under {gym_venv}/lib/python3*/site-packages; run setup")


def resolve_config_paths(spec: GymLaunchSpec, cwd: Path | None = None) -> list[str]:
    """Make paths relative to the trainer's cwd absolute (Gym runs in ``run_dir``); keep Gym-relative ones as they
    are, for Gym to resolve against its install root. A path found nowhere is an ``AdapterConfigError``."""
    cwd = cwd or Path.cwd()
    roots = [Path(r) for r in spec.env.get("NEMO_GYM_EXTRA_ROOTS", "").split(os.pathsep) if r]
    roots.append(gym_package_root(spec.gym_venv))
    out = []
    for i, entry in enumerate(spec.config_paths):
        p = Path(entry)
        if p.is_absolute() or (cwd / p).is_file():
            if not (cwd / p).is_file():
                raise AdapterConfigError(f"gym.config_paths[{i}]: {entry} does not exist")
            out.append(str((cwd / p).resolve()))
        elif any((r / p).is_file() for r in roots):
            out.append(entry)
        else:
            looked = ", ".join(str(r / p) for r in [cwd, *roots])
            raise AdapterConfigError(f"gym.config_paths[{i}]: {entry!r} not found (looked in {looked})")
    return out


def _http(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url``: (status, body). Raises ``OSError`` when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _answers(url: str) -> bool:
    """Gym's own readiness notion: any HTTP answer at all (a server need not route ``/``)."""
    try:
        _http(url, timeout=3.0)
        return True
    except (OSError, ValueError):
        return False


def session_members(sid: int) -> list[int]:
    """Pids of live processes in session ``sid`` (our launcher's own session: only Gym's processes are in it)."""
    import psutil

    out = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == sid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except (OSError, psutil.Error):
            continue
    return out


class SessionProcess(ManagedProcess):
    """A ManagedProcess whose ``stop`` also kills whatever is left in its session (the Gym launcher, a Ray head).

    Also applies when ``procs.stop_all`` runs it at exit or on SIGTERM. Ray's agents outlive the raylet as orphans
    that ignore SIGTERM; only the session id still ties them to us.
    """

    stop_timeout_s = 3.0

    def stop(self, timeout: float | None = None) -> None:
        timeout = self.stop_timeout_s if timeout is None else timeout
        self.remember_descendants()
        sid = self.pid  # start_new_session: the launcher leads a session whose id is its pid
        before = set(session_members(sid))
        super().stop(timeout=timeout)
        leftovers = set(session_members(sid)) | {p for p in before if _alive(p)}
        if leftovers:
            kill_tree(leftovers, timeout=2.0)


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class GymServers:
    """A running NeMo Gym, started by us (:meth:`start`) or attached to (:meth:`attach`). Context manager."""

    def __init__(self, head_url: str, launcher: SessionProcess | None = None, run_dir: Path | None = None) -> None:
        self.head_url = head_url.rstrip("/")
        self._launcher = launcher
        self.run_dir = run_dir
        self._config: dict[str, Any] | None = None
        self.startup_seconds: float | None = None

    # ------------------------------------------------------------------ start / attach / stop
    @classmethod
    def start(cls, spec: GymLaunchSpec) -> GymServers:
        """Launch Gym and wait until the head reports ready and every server instance answers.

        Raises ``AdapterConfigError`` for a bad spec (before starting anything) and ``GymServerError`` naming the
        server that is not ready, with its log tail, on timeout or crash; everything started is stopped first.
        """
        config_paths = resolve_config_paths(spec)
        python = spec.gym_venv / "bin" / "python"
        if not python.exists():
            raise AdapterConfigError(f"gym.gym_venv: {python} missing; run scripts/setup.sh")
        head_port = spec.head_port or free_port(spec.host if spec.host != "0.0.0.0" else "127.0.0.1")
        run_dir = spec.run_dir or paths.logs_dir() / "gym" / f"{time.strftime('%Y%m%d-%H%M%S')}-{head_port}"
        run_dir.mkdir(parents=True, exist_ok=True)
        launch_yaml = run_dir / "ngv_launch.yaml"
        launch_yaml.write_text(json.dumps(_launch_config(spec, head_port, run_dir), indent=1))  # JSON is YAML
        cmd = [
            str(spec.gym_venv / "bin" / "gym"),
            "env",
            "start",
            "+config_paths=[" + ",".join(json.dumps(p) for p in [*config_paths, str(launch_yaml)]) + "]",
            *spec.hydra_overrides,
        ]
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env.update(spec.env)
        env.update(
            {
                _API_KEY_ENV: spec.policy_api_key.get_secret_value(),
                "PATH": f"{spec.gym_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
                "PYTHONUNBUFFERED": "1",
                "RAY_USAGE_STATS_ENABLED": "0",
            }
        )
        if not spec.ray_head_node_address:
            # Gym calls ray.init() without an address, which joins the cluster named in /tmp/ray/ray_current_cluster
            # (any `ray start` on this machine, even a dead one: it then hangs). "local" always starts a new one.
            env["RAY_ADDRESS"] = "local"
        elif "RAY_AUTH_MODE" not in env and (Path.home() / ".ray" / "auth_token").exists():
            # `ray start` (Ray >= 2.5x) enables token auth and writes this token, but a process that only connects
            # stays in "disabled" mode and is refused; say "token" like the cluster (override via spec.env).
            env["RAY_AUTH_MODE"] = "token"
        t0 = time.monotonic()
        launcher = SessionProcess(name="NeMo Gym launcher", cmd=cmd, log_path=run_dir / "gym.log", env=env, cwd=run_dir)
        launcher.stop_timeout_s = spec.stop_timeout_s
        gym = cls(f"http://{_connect_host(spec.host)}:{head_port}", launcher=launcher, run_dir=run_dir)
        try:
            gym._wait_ready(t0 + spec.startup_timeout_s, spec)
        except BaseException:
            gym.stop()
            raise
        launcher.remember_descendants()
        gym.startup_seconds = time.monotonic() - t0
        return gym

    @classmethod
    def attach(cls, head_url: str, timeout: float = 60.0) -> GymServers:
        """Use a Gym someone else started (never stopped by us); waits up to ``timeout`` for it to be ready."""
        gym = cls(head_url)
        deadline = time.monotonic() + timeout
        while True:
            try:
                status, _ = _http(f"{gym.head_url}/health")
                if status == 200 and not gym._unready_instances():
                    return gym
                last = f"/health answered {status}"
            except OSError as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise GymServerError(f"Gym head server at {gym.head_url}: not ready after {timeout:.0f}s ({last})")
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
        return {p for p in pids if _alive(p)}

    def stop(self) -> None:
        """Stop everything we started (idempotent); a no-op for an attached Gym."""
        if self._launcher is not None:
            self._launcher.stop()

    def __enter__(self) -> GymServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ what the rollout client needs
    def global_config(self, refresh: bool = False) -> dict[str, Any]:
        """Gym's whole config (``/global_config_dict_yaml``) with interpolations resolved (``base_url`` is
        ``${policy_base_url}`` there). It holds secrets: don't log it. Our own API key reference cannot resolve in
        this process (the key lives in Gym's environment only) and reads ``<redacted>``."""
        if self._config is None or refresh:
            from omegaconf import OmegaConf

            status, body = _http(f"{self.head_url}/global_config_dict_yaml", timeout=30)
            if status != 200:
                raise GymServerError(f"Gym head server {self.head_url}: /global_config_dict_yaml answered {status}")
            # FastAPI returns the YAML text as a JSON string. Redact before resolving (reading resolves).
            raw = OmegaConf.to_container(OmegaConf.create(json.loads(body)), resolve=False)
            if raw.get("policy_api_key") == _API_KEY_REF:
                raw["policy_api_key"] = "<redacted>"
            cfg = OmegaConf.create(raw)
            try:
                self._config = OmegaConf.to_container(cfg, resolve=True)
            except Exception as e:  # e.g. ${oc.env:X} of a variable only Gym's environment has
                logger.warning("Gym config has interpolations we cannot resolve here (%s); using them verbatim", e)
                self._config = OmegaConf.to_container(cfg, resolve=False)
        return self._config

    def server_instances(self) -> dict[str, GymServerInstance]:
        """``/server_instances`` keyed by instance (top-level config) name."""
        status, body = _http(f"{self.head_url}/server_instances", timeout=30)
        if status != 200:
            raise GymServerError(f"Gym head server {self.head_url}: /server_instances answered {status}")
        return {d["process_name"]: GymServerInstance.model_validate(d) for d in json.loads(body)}

    def server_url(self, name: str) -> str:
        """``http://host:port`` of the server instance ``name`` (from the global config, as Gym's client does)."""
        block = self.global_config().get(name)
        try:
            (server,) = [cfg for impls in block.values() for cfg in impls.values()]
            return f"http://{server['host']}:{server['port']}"
        except (AttributeError, TypeError, ValueError, KeyError) as e:
            raise GymServerError(f"Gym has no server instance {name!r} (head {self.head_url})") from e

    def routes(self) -> Any:
        """This Gym's agent → environment-server routes (``rollout_client.GymRoutes``: one routing rule for both)."""
        import urllib.parse

        from nemo_gym_adapter.rollout_client import GymRoutes  # lazy: aiohttp is only needed when routing

        instances = [inst.model_dump() for inst in self.server_instances().values()]
        head_host = urllib.parse.urlsplit(self.head_url).hostname or "127.0.0.1"
        return GymRoutes.from_config(self.global_config(), instances, head_host=head_host)

    def environment_servers_by_agent(self) -> dict[str, list[str]]:
        """Agent instance name -> the environment servers fronting it (Gym's collector routes through these)."""
        return {agent: [r.server for r in routes] for agent, routes in self.routes().servers_by_agent.items()}

    def run_url(self, agent_name: str) -> str:
        """The ``/run`` URL for rows of ``agent_name``: its one environment server (as ``rollout_collection``)."""
        routes = self.routes().servers_by_agent.get(agent_name, ())
        if len(routes) != 1:
            names = [r.server for r in routes]
            raise GymServerError(f"agent {agent_name!r} is fronted by {len(routes)} environment servers: {names}")
        return routes[0].run_url

    # ------------------------------------------------------------------ readiness
    def _wait_ready(self, deadline: float, spec: GymLaunchSpec) -> None:
        launcher = self._launcher
        assert launcher is not None  # only start() waits
        while True:
            if not launcher.alive():
                raise self._failure(f"exited with code {launcher.popen.returncode} before becoming ready")
            try:
                status, _ = _http(f"{self.head_url}/health", timeout=3.0)
                if status == 200 and not self._unready_instances():
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise self._failure(f"not ready after {spec.startup_timeout_s:.0f}s", spec)
            time.sleep(0.5)

    def _unready_instances(self) -> list[str]:
        try:
            instances = self.server_instances()
        except (OSError, GymServerError):
            return ["head server"]
        return [name for name, inst in instances.items() if not _answers(inst.url)]

    def _failure(self, why: str, spec: GymLaunchSpec | None = None) -> GymServerError:
        """A GymServerError naming the culprit (crashed server, unready servers, unreachable model) + log tails."""
        launcher = self._launcher
        assert launcher is not None
        text = launcher.tail(400)
        crashed = _CRASHED.findall(text)
        if crashed:
            culprits, detail = crashed, "crashed"
        elif not _answers(f"{self.head_url}/health"):
            state = "still starting (parsing config, starting Ray)" if launcher.alive() else "gone (config error?)"
            culprits, detail = ["head server"], f"launcher {state}; not up"
        else:
            culprits = [n for n in self._unready_instances() if n != "head server"]
            detail = "not answering"
            if not culprits and spec is not None:
                culprits = [u for u in spec.policy_base_url if not _answers(f"{u}/models")]
                detail = "model endpoint not answering (Gym waits for it)"
        parts = [f"NeMo Gym ({self.head_url}): {why}; {detail}: {', '.join(culprits) or '-'}"]
        for name in culprits:
            server_log = (self.run_dir or Path(".")) / "servers" / f"{name.replace('/', '_')}.log"
            if server_log.exists():
                parts.append(f"--- last lines of {server_log} ---\n{log_tail(server_log, 30)}")
        parts.append(f"--- last lines of {launcher.log_path} ---\n{launcher.tail(40)}")
        return GymServerError("\n".join(parts))


def _connect_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else host


def _launch_config(spec: GymLaunchSpec, head_port: int, run_dir: Path) -> dict[str, Any]:
    """Everything we set on Gym, as one config file merged after the user's configs (CLI overrides still win)."""
    cfg: dict[str, Any] = {
        "policy_base_url": list(spec.policy_base_url),
        "policy_api_key": _API_KEY_REF,
        "policy_model_name": spec.policy_model_name,
        "default_host": spec.host,
        "head_server": {"host": spec.host, "port": head_port},
        "nemo_gym_log_dir": str(run_dir / "servers"),
        # Gym gives up on its own after these; ours (same budget) names the culprit, so let ours fire first.
        "server_spinup_timeout_seconds": spec.startup_timeout_s + 60,
        "model_endpoint_readiness_timeout_seconds": spec.startup_timeout_s + 60,
    }
    if spec.server_venvs_dir is not None:
        cfg.update(uv_venv_dir=str(spec.server_venvs_dir), skip_venv_if_present=True)
    if spec.ray_head_node_address:
        cfg["ray_head_node_address"] = spec.ray_head_node_address
    if spec.port_range:
        cfg.update(port_range_low=spec.port_range[0], port_range_high=spec.port_range[1])
    return _deep_merge(cfg, spec.config_overrides)


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
