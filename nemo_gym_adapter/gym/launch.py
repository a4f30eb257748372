"""What to start as NeMo Gym 0.7 (component 3, the specification half): the launch spec, its config file, command line
and environment. Pure apart from reading the file system; :mod:`nemo_gym_adapter.gym.servers` runs it.

Everything we set on Gym goes into one config file (``<run_dir>/ngv_launch.yaml``, :func:`launch_config`) merged
after the user's Gym configs: the policy (our vLLM replicas: ``policy_base_url`` one string as Gym's CLI sets it, the
replica list only to the model servers that call the policy, :func:`policy_url_config`), the head server, log and venv
directories, timeouts, the port band of its servers (:mod:`~nemo_gym_adapter.gym.ports`).
The policy API key never appears in it, in argv or in a file: the file says ``${oc.env:NGV_GYM_POLICY_API_KEY}``
and the key reaches Gym through its environment (:func:`launch_env`). Gym config paths relative to the trainer's
cwd become absolute (Gym runs in ``run_dir``); Gym-relative ones stay, for Gym to resolve (:func:`resolve_config_paths`).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from nemo_gym_adapter.access.listen import LOCAL_ONLY_ENV, ray_exporters_env
from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.gym.ports import safe_port_range
from nemo_gym_adapter.runtime import paths

TRAINING_MODEL_CONFIG = "responses_api_models/vllm_model/configs/vllm_model_for_training.yaml"
API_KEY_ENV = "NGV_GYM_POLICY_API_KEY"  # the key reaches Gym via ${oc.env:...}, never argv or a file
API_KEY_REF = "${oc.env:" + API_KEY_ENV + "}"
# Trainer-side variables that must not leak into Gym's interpreter or make it join the trainer's Ray cluster
# (Ray refuses a driver with another Python minor version anyway).
_SCRUBBED_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "RAY_ADDRESS", "CONDA_PREFIX")


class GymLaunchSpec(BaseModel):
    """What to start. Invalid values raise pydantic's ``ValidationError`` naming the field (use :meth:`parse`
    to get an ``AdapterConfigError`` with dotted keys instead)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    config_paths: list[str] = Field(min_length=1, description="Gym configs; relative: trainer cwd, then Gym's root")
    policy_base_url: list[str] = Field(min_length=1, description="vLLM replicas: 'host:port' or 'http://host:port/v1'")
    policy_model_name: str = Field(min_length=1)
    policy_api_key: SecretStr = SecretStr("EMPTY")
    access_key: SecretStr | None = Field(
        None, description="every Gym server requires it and Gym sends it to its own (access.gym_guard); env only"
    )
    host: str = Field("127.0.0.1", description="Gym's default_host and head host; a node IP when multi-node")
    head_port: int | None = Field(None, ge=1, le=65535, description="None: a free port")
    port_range: tuple[int, int] | None = Field(
        None, description="Gym's port_range_low/high for its servers; None: ports.safe_port_range()"
    )
    port_retries: int = Field(2, ge=0, description="relaunches with new ports when a server loses its port")
    ray_head_node_address: str | None = Field(None, description="a Ray cluster started with Gym's Python version")
    ray_auth_token: SecretStr | None = Field(None, description="that cluster's token (ray_head.GymRayHead), env only")
    ray_metrics: bool = Field(
        False, description="a Ray Gym starts itself keeps Ray's metrics exporters (access.listen.ray_exporters_env)"
    )
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


POLICY_URL_REF = "${policy_base_url}"


def config_files(spec: GymLaunchSpec, config_paths: list[str]) -> list[Path]:
    """The Gym configs of ``config_paths`` (:func:`resolve_config_paths`' output) as files: absolute ones as they
    are, Gym-relative ones under the first root holding them (``NEMO_GYM_EXTRA_ROOTS``, then Gym's package root)."""
    roots = [Path(r) for r in spec.env.get("NEMO_GYM_EXTRA_ROOTS", "").split(os.pathsep) if r]
    roots.append(gym_package_root(spec.gym_venv))
    out = []
    for entry in config_paths:
        p = Path(entry)
        out.append(p if p.is_absolute() else next((r / p for r in roots if (r / p).is_file()), roots[-1] / p))
    return out


def policy_model_servers(files: list[Path], extra: dict[str, Any] | None = None) -> list[tuple[str, str]]:
    """``(instance, impl)`` of every model server whose ``base_url`` is exactly ``${policy_base_url}`` in these Gym
    config files, the configs they include (``config_paths``, Gym-relative ones against the including file's Gym
    root) and ``extra`` (the spec's ``config_overrides``): the servers that call the policy and take a replica list."""
    import yaml

    found: list[tuple[str, str]] = []
    seen: set[Path] = set()
    todo: list[Path | dict[str, Any]] = [*files, *([extra] if extra else [])]
    while todo:
        item = todo.pop(0)
        if isinstance(item, Path):
            if item in seen or not item.is_file():
                continue
            seen.add(item)
            data = yaml.safe_load(item.read_text()) or {}
            root = item.parent
            while root.parent != root and not (root / "responses_api_models").is_dir():
                root = root.parent  # Gym's package root (or a root laid out like it)
            todo += [Path(p) if Path(p).is_absolute() else root / p for p in data.get("config_paths") or []]
        else:
            data = item
        for name, block in data.items() if isinstance(data, dict) else ():
            models = block.get("responses_api_models") if isinstance(block, dict) else None
            for impl, body in models.items() if isinstance(models, dict) else ():
                if isinstance(body, dict) and str(body.get("base_url", "")).strip() == POLICY_URL_REF:
                    found.append((str(name), str(impl)))
    return list(dict.fromkeys(found))


def policy_url_config(urls: list[str], servers: list[tuple[str, str]]) -> dict[str, Any]:
    """``policy_base_url`` as Gym's own CLI sets it (``gym env start --model-url``): one string, which any config may
    interpolate, also into string fields (a judge or helper that uses the policy: ``verifif.judge_base_url``,
    ``speed_bench.vllm_base_url``; a list there fails Gym's validation at start). With several replicas the string is
    the first one, and each model server in ``servers`` (:func:`policy_model_servers`) gets the whole list
    (``vllm_model.base_url`` is ``Union[str, List[str]]``: one session pinned per replica)."""
    cfg: dict[str, Any] = {"policy_base_url": urls[0]}
    if len(urls) > 1:
        for name, impl in servers:
            cfg[name] = {"responses_api_models": {impl: {"base_url": list(urls)}}}
    return cfg


def launch_config(
    spec: GymLaunchSpec, head_port: int, run_dir: Path, files: list[Path] | None = None
) -> dict[str, Any]:
    """Everything we set on Gym, as one config file merged after the user's configs (CLI overrides still win).
    ``files``: the user's Gym configs as files (:func:`config_files`), read for the policy's model servers."""
    servers = policy_model_servers(files or [], spec.config_overrides) if len(spec.policy_base_url) > 1 else []
    urls = policy_url_config(list(spec.policy_base_url), servers)
    cfg: dict[str, Any] = {
        "policy_base_url": urls.pop("policy_base_url"),
        "policy_api_key": API_KEY_REF,
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
    # Always set: Gym's default band is the one Ray hands its workers' ports from (ports module docstring).
    low, high = spec.port_range or safe_port_range()
    cfg.update(port_range_low=low, port_range_high=high)
    return _deep_merge(_deep_merge(cfg, spec.config_overrides), urls)  # the list wins over an override's reference


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def launch_command(spec: GymLaunchSpec, config_paths: list[str], launch_yaml: Path) -> list[str]:
    """``gym env start`` with the user's configs, then ours (``launch_yaml``), then the raw hydra overrides."""
    return [
        str(spec.gym_venv / "bin" / "gym"),
        "env",
        "start",
        "+config_paths=[" + ",".join(json.dumps(p) for p in [*config_paths, str(launch_yaml)]) + "]",
        *spec.hydra_overrides,
    ]


def gym_process_env(gym_venv: Path, extra: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every process we start from Gym's venv (Gym, its Ray head): ``base`` (default: ours)
    without trainer-side variables, plus ``extra``, Gym's venv first on PATH, unbuffered output, no Ray usage stats."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if k not in _SCRUBBED_ENV}
    env.update(extra)
    env.update(
        {
            "PATH": f"{gym_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONUNBUFFERED": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
    )
    return env


def launch_env(spec: GymLaunchSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    """Gym's environment for ``spec`` (:func:`gym_env`)."""
    guard = access_env(spec.access_key, spec.host, spec.port_range, spec.head_port)
    return gym_env(
        spec.gym_venv,
        spec.env,
        spec.policy_api_key,
        spec.ray_head_node_address,
        spec.ray_auth_token,
        base,
        guard,
        ray_metrics=spec.ray_metrics,
    )


def access_env(
    key: SecretStr | None, host: str, port_range: tuple[int, int] | None, head_port: int | None
) -> dict[str, str]:
    """What makes Gym's processes require and send ``key`` (``access.gym_guard.launch_env``); empty without a key.
    Gym's ports: its band (``port_range``, else ``ports.safe_port_range()``, as :func:`launch_config`) and a head port
    pinned outside it."""
    if key is None:
        return {}
    from nemo_gym_adapter.access import gym_guard

    band = port_range or safe_port_range()
    extra = [head_port] if head_port is not None and not band[0] <= head_port <= band[1] else []
    return gym_guard.launch_env(key.get_secret_value(), host, band, extra)


def gym_env(
    gym_venv: Path,
    extra: dict[str, str],
    api_key: SecretStr,
    ray_address: str | None,
    ray_token: SecretStr | None,
    base: dict[str, str] | None = None,
    guard: dict[str, str] | None = None,
    ray_metrics: bool = False,
) -> dict[str, str]:
    """Gym's environment (:func:`gym_process_env` with ``extra``), the API key, and the Ray settings that keep Gym on
    a cluster of its own; from the parts of a spec it depends on, so a warm launcher (:mod:`~nemo_gym_adapter.gym.warm`) can be given
    it before the spec exists. ``guard``: :func:`access_env`'s variables (its ``PYTHONPATH`` first, before one of
    ``extra``). A Ray Gym starts itself (no ``ray_address``) is started without Ray's metrics exporters unless
    ``ray_metrics`` (``access.listen.ray_exporters_env``)."""
    env = gym_process_env(gym_venv, extra, base)
    env[API_KEY_ENV] = api_key.get_secret_value()
    if guard:
        user_path = extra.get("PYTHONPATH")
        env.update(guard)
        if user_path:
            env["PYTHONPATH"] = os.pathsep.join([guard["PYTHONPATH"], user_path])
    if not ray_address:
        # Gym calls ray.init() without an address, which joins the cluster named in /tmp/ray/ray_current_cluster
        # (any `ray start` on this machine, even a dead one: it then hangs). "local" always starts a new one, a
        # one-machine Ray on loopback (access.listen) unless nemo_gym.env says otherwise.
        env["RAY_ADDRESS"] = "local"
        env.update({k: v for k, v in LOCAL_ONLY_ENV.items() if k not in extra})
        env.update(ray_exporters_env(extra, ray_metrics))
    elif ray_token is not None:
        # our own head (ray_head.GymRayHead): its token, through the environment only; a one-machine Ray on
        # loopback, which Gym's processes join as loopback nodes (ray_head.head_env)
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=ray_token.get_secret_value())
        env.update({k: v for k, v in LOCAL_ONLY_ENV.items() if k not in extra})
    elif "RAY_AUTH_MODE" not in env and (Path.home() / ".ray" / "auth_token").exists():
        # `ray start` (Ray >= 2.5x) enables token auth and writes this token, but a process that only connects
        # stays in "disabled" mode and is refused; say "token" like the cluster (override via spec.env).
        env["RAY_AUTH_MODE"] = "token"
    return env
