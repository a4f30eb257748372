"""The recipe's typed configuration: our ``nemo_gym:`` section plus the verl keys the adapter depends on.

Validated once, at start-up, before any heavy import (:func:`load_config`); every error names the full dotted key,
the bad value and the fix, and all problems are reported together. Everything else reads attributes of the returned
:class:`RecipeConfig` -- no ``cfg.get("key", default)`` chains elsewhere (STYLE.md §3).

``nemo_gym:`` keys (defaults in :class:`NemoGymConfig`)::

    nemo_gym:
      head_url: null                 # attach to a running Gym (its head server URL) instead of starting one
      config_paths: [...]            # Gym configs to start (required unless head_url); Gym-relative or local paths
      add_training_model_config: true   # append Gym's vllm_model_for_training.yaml (token ids on every model call)
      config_overrides: {}           # merged into Gym's config last, e.g. {<agent>: {responses_api_agents: ...}}
      hydra_overrides: []            # raw `gym env start` overrides
      host: null                     # a started Gym's bind host; null: 127.0.0.1 (only this host calls it)
      head_port: null                # null: a free port
      port_range: null               # [low, high] of Gym's servers' ports; null: a band Ray and the kernel never hand out
      port_retries: 2                # relaunches with new ports when a Gym server loses its port at start-up
      gym_venv: null                 # null: paths.gym_venv() (NGV_GYM_VENV)
      ray_head: early                # Gym's Ray: early (started before verl's workers, gym_ray) | gym | host:port
      warm_launcher: true            # Gym's launcher pre-imported next to the Ray head (gym.warm); false: cold
      run_dir: null                  # Gym's logs and pid file; null: logs/gym/<time>-<port>
      startup_timeout_s: 600
      attach_timeout_s: 60
      policy_api_key: EMPTY          # what Gym sends the replicas when access.require_key is false
      access: {require_key: true, local_only: auto}   # the run's rollout key on every replica route; loopback on one host
      env: {}                        # extra environment for Gym's processes
      patch_vllm: true               # apply the token-ID patch inside every rollout server actor (vLLM or SGLang)
      assistant_edits: keep_ids      # a tokenized assistant message edited while its ids were kept: keep_ids | refuse
      client: {max_concurrency: 64, timeout_s: 900, max_connection_retries: 3, retry_backoff_s: 0.5, progress: null}
      trajectory: {contiguity: mask, mask_on_failure_kind: false, verifier_errors: {}, forced_token_min_logprob: null}
      metrics: {success_threshold: null, gym_aggregate: true}   # gym_aggregate: Gym's /aggregate_metrics on validation
      env_weights: null              # {<env>: <weight>}: each env's share of every training batch (env_sampling)
      on_server_down: restart        # a dead Gym server / vLLM replica: mask its rows | restart (a Gym we started) | fail
      liveness: {interval_s: 1, probe_timeout_s: 3, idle_s: 3, replica_grace_s: 120, max_restarts: 3}
      rollout_dump: {dir: null, enable: true, validation: true, max_text_chars: 4000, queue_size: 4096}
                                     # readable rollouts (rollouts.dump); dir null: <trainer.rollout_data_dir>/gym

The ``${ngv_...}`` resolvers the shipped configs use live in :mod:`recipe.nemo_gym.resolvers`;
``${ngv_manager:<use_v1>}`` picks :data:`MANAGER_CLASS_V1` or :data:`MANAGER_CLASS`, the managers checked here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from nemo_gym_adapter.errors import AdapterConfigError

SECTION = "nemo_gym"
MANAGER_CLASS = "recipe.nemo_gym.agent_loop.NemoGymAgentLoopManager"  # legacy trainer (trainer.use_v1=False)
MANAGER_CLASS_V1 = "recipe.nemo_gym.agent_loop_tq.NemoGymAgentLoopManagerTQ"  # v1 trainer (the default)
DATASET_PATH = "pkg://nemo_gym_adapter.data.dataset"
DATASET_NAME = "GymJsonlDataset"
MASKED_GRPO = "masked_grpo"  # = recipe.nemo_gym.advantage.MASKED_GRPO (not imported: that module imports verl)
# verl's actor_rollout_ref.rollout.name values the token-ID patch supports (= recipe.nemo_gym.backends.ENGINES).
ROLLOUT_ENGINES = ("vllm", "sglang")
MASKABLE_ESTIMATORS = (
    "grpo",
    "grpo_vectorized",
    "gdpo",
    "grpo_passk",
    "rloo",
    "rloo_vectorized",
    "opo",
    "reinforce_plus_plus_baseline",
    "gpg",
)
"""verl's outcome estimators whose masked samples ``recipe.nemo_gym.masked_estimators`` keeps out of every group
statistic; with ``masked_grpo``, the values ``algorithm.adv_estimator`` may take."""
GDPO = "gdpo"
SESSION_ESTIMATORS = (MASKED_GRPO, "grpo")
"""The estimators that count a rollout split into several samples (``contiguity: split``) once in its group."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClientSection(_Section):
    """``nemo_gym.client``: the rollout client (``client.RolloutClientConfig``)."""

    max_concurrency: int = Field(64, ge=1, description="rollouts in flight at once")
    timeout_s: float = Field(900.0, gt=0, description="per-rollout deadline")
    max_connection_retries: int = Field(3, ge=0)
    retry_backoff_s: float = Field(0.5, ge=0)
    progress: bool | None = Field(None, description="progress bar; null: only on a TTY")


class TrajectorySection(_Section):
    """``nemo_gym.trajectory``: how Gym results become token trajectories (``trajectory.TrajectoryConfig``)."""

    # Model calls that do not form one history (trajectory.build_trajectories): mask the rollout, truncate it to the
    # contiguous calls, split it into prefix-consistent samples (v1 trainer only), or raise.
    contiguity: Literal["mask", "truncate", "split", "raise"] = "mask"
    mask_on_failure_kind: bool = False
    # What a verifier error becomes, per environment (trajectory.MaskReason.VERIFIER_ERROR): mask (default; never a
    # fabricated score) or reward0 (trained with reward 0: for an environment whose verifier cannot score output it
    # cannot parse, so an untrained model can learn the format). "_default" covers every other environment.
    verifier_errors: dict[str, Literal["mask", "reward0"]] = Field(default_factory=dict)
    # Sampled tokens whose rollout log-prob is >= this (e.g. -1e-4) are left out of the loss: tokens constrained
    # decoding forced (grammars, structured outputs, allowed_token_ids), trained off-policy otherwise
    # (rollouts.forced). null: every sampled token is trained.
    forced_token_min_logprob: float | None = Field(default=None, le=0)


class MetricsSection(_Section):
    """``nemo_gym.metrics``: ``metrics.compute_metrics`` options; ``gym_aggregate``: after each validation pass, ask
    every environment's own ``POST /aggregate_metrics`` (Gym 0.7) for its metrics and log them (``validation``)."""

    success_threshold: float | None = None
    gym_aggregate: bool = True


class LivenessSection(_Section):
    """``nemo_gym.liveness``: probing the Gym servers and vLLM replicas (``liveness.LivenessConfig``)."""

    interval_s: float = Field(1.0, gt=0, description="probe period during a step")
    probe_timeout_s: float = Field(3.0, gt=0, description="a server silent this long counts as down (or busy)")
    busy_grace_s: float = Field(
        120.0, ge=0, description="silent but accepting connections: busy, not down, this long; 0: down at once"
    )
    idle_s: float = Field(3.0, gt=0, description="live replicas idle this long: rows on a dead replica are cut")
    replica_grace_s: float = Field(120.0, gt=0, description="the same when vLLM's load gauges cannot be read")
    max_restarts: int = Field(3, ge=0, description="Gym restarts per run under on_server_down=restart")


class RolloutDumpSection(_Section):
    """``nemo_gym.rollout_dump``: readable JSONL rollouts per step (``rollouts.dump``). On when a directory is known:
    ``dir``, else ``<trainer.rollout_data_dir>/gym`` (verl's own switch for its dump; ours goes next to it)."""

    dir: str | None = None
    enable: bool = True
    validation: bool = Field(True, description="also dump validation rollouts (under val/)")
    max_text_chars: int = Field(4000, ge=0, description="longer texts are cut; 0: never")
    queue_size: int = Field(4096, ge=1, description="rows waiting for the writer; a full queue drops rows (counted)")


class AccessSection(_Section):
    """``nemo_gym.access``: who may reach the run (``nemo_gym_adapter.access``; docs/CLUSTER.md)."""

    # Every rollout server requires the run's rollout key (generated by the driver, or NGV_ROLLOUT_API_KEY) on every
    # route, 401 without it; Gym's model server and the adapter's own clients send it. false: no key (your own
    # network policy keeps other clients out; nemo_gym.policy_api_key is then what Gym sends).
    require_key: bool = True
    # Every process of the run on 127.0.0.1 (Ray's one-machine mode): auto -- when the run is on one host (the recipe
    # starts its own Ray, trainer.nnodes=1, no Gym on another host) --, true (an error where it cannot be), false.
    local_only: Literal["auto", "true", "false"] = "auto"

    @field_validator("local_only", mode="before")
    @classmethod
    def _yaml_bool(cls, value: Any) -> Any:
        return str(value).lower() if isinstance(value, bool) else value


RAY_HEAD_MODES = ("early", "gym")  # nemo_gym.ray_head values that are not a host:port


class NemoGymConfig(_Section):
    """The ``nemo_gym:`` section (see the module docstring for every key)."""

    head_url: str | None = None
    config_paths: list[str] = Field(default_factory=list)
    add_training_model_config: bool = True
    config_overrides: dict[str, Any] = Field(default_factory=dict)
    hydra_overrides: list[str] = Field(default_factory=list)
    host: str | None = None
    head_port: int | None = Field(None, ge=1, le=65535)
    # Gym's servers' ports (Gym's port_range_low/high); null: gym.ports.safe_port_range(), outside Ray's CLI worker
    # ports and the kernel's ephemeral range (Gym's own default is Ray's band: a start-up race).
    port_range: tuple[int, int] | None = None
    # A Gym server that still loses its port at start-up (another process took it): relaunch Gym with new ports this
    # many times, logged, then fail.
    port_retries: int = Field(2, ge=0)
    gym_venv: str | None = None
    # The Ray cluster Gym joins (Gym 0.7 always calls ray.init): early -- a head from Gym's venv started while verl
    # starts (nemo_gym_adapter.gym.ray_head) --, gym -- Gym starts its own --, or the host:port of a running one started
    # with Gym's Python version. Ignored when head_url is set.
    ray_head: str = "early"
    # Start Gym's launcher interpreter early with its imports done (nemo_gym_adapter.gym.warm; ~2 s off Gym's
    # spin-up); false: Gym's launcher starts cold when Gym starts. Ignored when head_url is set.
    warm_launcher: bool = True
    run_dir: str | None = None
    startup_timeout_s: float = Field(600.0, gt=0)
    attach_timeout_s: float = Field(60.0, gt=0)
    policy_api_key: SecretStr = SecretStr("EMPTY")
    access: AccessSection = Field(default_factory=AccessSection)
    env: dict[str, str] = Field(default_factory=dict)
    patch_vllm: bool = True
    # What the patch does with an assistant message whose text was changed while its token ids were kept (edits of
    # system/user/tool messages are always refused): keep_ids -- the ids win, as Gym documents message-level ids as
    # the single source of truth -- or refuse (HTTP 400 naming the message; decodes every earlier generation).
    assistant_edits: Literal["keep_ids", "refuse"] = "keep_ids"
    client: ClientSection = Field(default_factory=ClientSection)
    trajectory: TrajectorySection = Field(default_factory=TrajectorySection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    # Share of each training batch per environment (relative weights; every environment of the training data must be
    # listed, 0 leaves one out); null: the data's own mix. env_sampling.EnvWeightedSampler composes the batches.
    env_weights: dict[str, float] | None = None

    @field_validator("env_weights")
    @classmethod
    def _weights(cls, weights: dict[str, float] | None) -> dict[str, float] | None:
        if weights is None:
            return None
        if not weights:
            raise ValueError("is empty: list {<environment>: <weight>} or set null for the data's own mix")
        bad = {env: w for env, w in weights.items() if w is None or not math.isfinite(w) or w < 0}
        if bad:
            raise ValueError(f"weights must be finite numbers >= 0, got {bad}")
        if sum(weights.values()) <= 0:
            raise ValueError(f"every weight is 0 ({weights}): at least one environment must be sampled")
        return weights

    # A dead Gym server or vLLM replica (nemo_gym_adapter.gym.liveness): its rows are masked `server_down` (mask), Gym
    # is restarted before the next step (restart; only a Gym we started, else mask), or the run stops (fail).
    on_server_down: Literal["mask", "restart", "fail"] = "restart"
    liveness: LivenessSection = Field(default_factory=LivenessSection)
    rollout_dump: RolloutDumpSection = Field(default_factory=RolloutDumpSection)

    @field_validator("config_overrides")
    @classmethod
    def _drop_null_overrides(cls, overrides: dict[str, Any]) -> dict[str, Any]:
        # A derived config cannot delete a key it inherits (OmegaConf merges dicts), so `<block>: null` means "no
        # override for this Gym block": e.g. a demo config switching environments drops its parent's agent override.
        return {name: value for name, value in overrides.items() if value is not None}

    @field_validator("port_range")
    @classmethod
    def _port_range(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and not (1024 <= value[0] < value[1] <= 65535):
            raise ValueError(
                "must be [low, high] with 1024 <= low < high <= 65535, e.g. [20000, 32767] (null: a band outside "
                "Ray's worker ports and the kernel's ephemeral range)"
            )
        return value

    @field_validator("ray_head")
    @classmethod
    def _ray_head(cls, value: str) -> str:
        host, _, port = value.rpartition(":")
        if value in RAY_HEAD_MODES or (re.fullmatch(r"[\w.\-]+", host) and port.isdigit() and 0 < int(port) < 65536):
            return value
        raise ValueError(
            "use early (a Ray head from Gym's venv, started while verl starts), gym (Gym starts its own) or the "
            "host:port of a running Ray head started with Gym's Python version"
        )

    @property
    def external_ray_head(self) -> str | None:
        """The ``host:port`` of a Ray head someone else runs (``ray_head: host:port``); None for ``early``/``gym``."""
        return None if self.ray_head in RAY_HEAD_MODES else self.ray_head

    @field_validator("head_url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r} must be an http(s) URL, e.g. http://10.0.0.1:11000")
        return url.rstrip("/") if url else url

    @model_validator(mode="after")
    def _start_or_attach(self) -> NemoGymConfig:
        if self.head_url is None and not self.config_paths:
            raise ValueError(
                "config_paths is empty and head_url is null: set nemo_gym.config_paths to the Gym configs to start "
                "(e.g. [resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml]) or "
                "nemo_gym.head_url to attach to a running Gym"
            )
        if self.access.require_key and self.policy_api_key.get_secret_value() != "EMPTY":
            raise ValueError(
                "policy_api_key is set, but with access.require_key (the default) Gym sends the run's rollout key, "
                "not policy_api_key: choose that key with the environment variable NGV_ROLLOUT_API_KEY instead (verl "
                "prints the whole config: no secret belongs in it), or set nemo_gym.access.require_key=false"
            )
        if self.head_url is not None and self.config_paths:
            raise ValueError(
                f"both head_url ({self.head_url}) and config_paths are set: attaching uses the running Gym's own "
                "configs; set nemo_gym.config_paths=[] or nemo_gym.head_url=null"
            )
        return self


class RecipeConfig(BaseModel):
    """What the manager needs, read once from the whole (verl + ``nemo_gym``) config."""

    model_config = ConfigDict(frozen=True)

    gym: NemoGymConfig
    prompt_length: int
    response_length: int
    max_model_len: int | None
    temperature: float
    top_p: float | None
    val_temperature: float
    val_top_p: float | None
    n: int
    model_path: str
    rollout_data_dir: str | None = None  # verl's trainer.rollout_data_dir
    filter_groups_metric: str | None = None  # algorithm.filter_groups.metric when group filtering is on
    gdpo_reward_keys: list[str] = Field(default_factory=list)  # algorithm.gdpo_reward_keys
    adv_estimator: str = MASKED_GRPO  # algorithm.adv_estimator

    @property
    def rollout_dump_dir(self) -> Path | None:
        """Where readable rollouts go (``nemo_gym.rollout_dump``), or None when they are off."""
        dump = self.gym.rollout_dump
        if not dump.enable:
            return None
        if dump.dir is not None:
            return Path(dump.dir).expanduser()
        return Path(self.rollout_data_dir).expanduser() / "gym" if self.rollout_data_dir else None

    rollout_name: str = "vllm"  # verl's actor_rollout_ref.rollout.name: the engine (ROLLOUT_ENGINES)


# ---------------------------------------------------------------------------------------------------- reading


_MISSING = object()


def _select(cfg: Any, key: str, default: Any = _MISSING, *, resolve: bool = True) -> Any:
    """``cfg.<dotted key>`` for an OmegaConf config or nested mappings; ``default`` (or ``_MISSING``) when absent.

    ``resolve=False`` returns an interpolation's text instead of resolving it (e.g. ``${ngv_tiny_model:qwen25}``
    would build a model, which config validation must not wait for).
    """
    node = cfg
    *parents, leaf = key.split(".")
    for part in parents:
        node = _child(node, part)
        if node is _MISSING or node is None:
            return default
    if not resolve and _is_interpolation(node, leaf):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(node, resolve=False)[leaf]
    node = _child(node, leaf)
    return default if node is _MISSING else node


def _child(node: Any, part: str) -> Any:
    try:
        return node[part] if part in node else _MISSING
    except TypeError:
        return _MISSING


def _is_interpolation(node: Any, leaf: str) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.is_config(node) and leaf in node and OmegaConf.is_interpolation(node, leaf)


def _plain(value: Any) -> Any:
    """OmegaConf containers → plain Python (resolved); anything else unchanged."""
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf ships with hydra, a dependency
        pass
    return value


def _describe(e: ValidationError, prefix: str) -> list[str]:
    out = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        key = f"{prefix}.{loc}" if loc else prefix
        value = err.get("input")
        shown = "" if isinstance(value, dict) or value is None else f"={value!r}"
        msg = err["msg"].removeprefix("Value error, ")
        out.append(f"{key}{shown}: {msg}")
    return out


def parse_section(section: Mapping[str, Any] | None) -> NemoGymConfig:
    """Validate the ``nemo_gym:`` section alone (``None`` counts as empty). Errors name ``nemo_gym.<key>``."""
    try:
        return NemoGymConfig.model_validate(dict(_plain(section) or {}))
    except ValidationError as e:
        raise AdapterConfigError("invalid recipe config:\n  " + "\n  ".join(_describe(e, SECTION))) from e


def load_config(cfg: Any, *, check_files: bool = True) -> RecipeConfig:
    """Validate the whole config once: our section and the verl keys we depend on. Raises ``AdapterConfigError``
    listing every problem (dotted key, bad value, fix). ``check_files``: also check that data files exist."""
    problems: list[str] = []
    try:
        gym = parse_section(_select(cfg, SECTION, None))
    except AdapterConfigError as e:
        problems.extend(line.strip() for line in str(e).splitlines()[1:])
        gym = None

    def need(key: str, ok: bool, value: Any, fix: str) -> None:
        if not ok:
            problems.append(f"{key}={value!r}: {fix}")

    use_v1 = _select(cfg, "trainer.use_v1", True)
    need("trainer.use_v1", isinstance(use_v1, bool), use_v1, "must be true (verl's v1 trainer) or false (legacy)")
    manager = _select(cfg, "actor_rollout_ref.rollout.agent.agent_loop_manager_class", None)
    v1 = use_v1 is not False
    wanted, suffix = (MANAGER_CLASS_V1, "AgentLoopManagerTQ") if v1 else (MANAGER_CLASS, "AgentLoopManager")
    need(
        "actor_rollout_ref.rollout.agent.agent_loop_manager_class",
        isinstance(manager, str) and manager.rsplit(".", 1)[-1].endswith(suffix),
        manager,
        f"with trainer.use_v1={use_v1} set it to {wanted} (or a subclass), or to ${{ngv_manager:${{trainer.use_v1}}}}",
    )
    if gym is not None and not v1 and gym.trajectory.contiguity == "split":
        problems.append(
            "nemo_gym.trajectory.contiguity='split': several samples per rollout need verl's v1 trainer (sessions "
            "keyed {uid}_{session}_{i}); the legacy trainer's batch holds one sample per rollout. Set "
            "trainer.use_v1=true, or nemo_gym.trajectory.contiguity to mask or truncate"
        )
    name = _select(cfg, "actor_rollout_ref.rollout.name", None)
    need(
        "actor_rollout_ref.rollout.name",
        name in ROLLOUT_ENGINES,
        name,
        f"the token-ID patch supports {' and '.join(ROLLOUT_ENGINES)}; set one of them",
    )
    if name == "sglang":
        problems.extend(_sglang_problems(cfg))
    estimator = _select(cfg, "algorithm.adv_estimator", None)
    need(
        "algorithm.adv_estimator",
        estimator == MASKED_GRPO or estimator in MASKABLE_ESTIMATORS,
        estimator,
        f"set {MASKED_GRPO} or one of verl's outcome estimators {', '.join(MASKABLE_ESTIMATORS)}: failed Gym rollouts "
        "are masked rows, which those keep out of every group baseline (recipe.nemo_gym.masked_estimators)",
    )
    gdpo_keys = _gdpo_keys(cfg, estimator, v1, problems)
    if gym is not None and v1 and gym.trajectory.contiguity == "split" and estimator not in SESSION_ESTIMATORS:
        problems.append(
            f"algorithm.adv_estimator={estimator!r} with nemo_gym.trajectory.contiguity='split': only "
            f"{' and '.join(SESSION_ESTIMATORS)} count a rollout split into several samples once in its group (verl's "
            f"v1 trainer hands every other estimator each segment as a group member); set {MASKED_GRPO}"
        )
    filter_metric = _filter_groups(cfg, v1, problems)
    custom_path = _select(cfg, "data.custom_cls.path", None)
    need(
        "data.custom_cls.path",
        bool(custom_path),
        custom_path,
        f"set {DATASET_PATH} (and data.custom_cls.name={DATASET_NAME}): rows must carry gym_row/gym_env",
    )
    ints = {}
    for key in ("prompt_length", "response_length", "n"):
        full = f"actor_rollout_ref.rollout.{key}"
        value = _select(cfg, full, None)
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
        need(full, ok, value, "must be an integer >= 1")
        ints[key] = value if ok else 1
    max_model_len = _select(cfg, "actor_rollout_ref.rollout.max_model_len", None)
    need(
        "actor_rollout_ref.rollout.max_model_len",
        max_model_len is None or (isinstance(max_model_len, int) and max_model_len >= 2),
        max_model_len,
        "must be null (the server's) or an integer >= 2",
    )
    sampling = {}
    for key, full in (
        ("temperature", "actor_rollout_ref.rollout.temperature"),
        ("top_p", "actor_rollout_ref.rollout.top_p"),
        ("val_temperature", "actor_rollout_ref.rollout.val_kwargs.temperature"),
        ("val_top_p", "actor_rollout_ref.rollout.val_kwargs.top_p"),
    ):
        value = _select(cfg, full, None)
        ok = value is None or (isinstance(value, int | float) and not isinstance(value, bool) and value >= 0)
        need(full, ok and (value is not None or "top_p" in key), value, "must be a number >= 0")
        sampling[key] = float(value) if ok and value is not None else (None if "top_p" in key else 1.0)
    model_path = _select(cfg, "actor_rollout_ref.model.path", None, resolve=False)
    need("actor_rollout_ref.model.path", isinstance(model_path, str) and bool(model_path), model_path, "set a model")
    if check_files:
        for key in ("data.train_files", "data.val_files"):
            files = _plain(_select(cfg, key, None))
            files = [files] if isinstance(files, str) else list(files or [])
            need(key, bool(files), files, "set one or more Gym JSONL files")
            for i, f in enumerate(files):
                if not Path(str(f)).expanduser().is_file():
                    problems.append(f"{key}[{i}]={f!r}: no such file; point it at a Gym JSONL file")
    if problems:
        raise AdapterConfigError("invalid recipe config:\n  " + "\n  ".join(problems))
    assert gym is not None  # no problems means the section parsed
    return RecipeConfig(
        gym=gym,
        prompt_length=ints["prompt_length"],
        response_length=ints["response_length"],
        n=ints["n"],
        max_model_len=max_model_len,
        model_path=str(model_path),
        rollout_data_dir=_rollout_data_dir(cfg),
        filter_groups_metric=filter_metric,
        gdpo_reward_keys=gdpo_keys,
        adv_estimator=str(estimator),
        rollout_name=str(name),
        **sampling,
    )


OUTCOME_METRIC = "gym_outcome"  # = nemo_gym_adapter.rollouts.groups.OUTCOME_KEY (config imports no package)


def _filter_groups(cfg: Any, v1: bool, problems: list[str]) -> str | None:
    """``algorithm.filter_groups.metric`` when verl's group filter is on (None when off); problems appended."""
    enabled = _select(cfg, "algorithm.filter_groups.enable", False)
    if not enabled:
        return None
    if not v1:
        problems.append(
            "algorithm.filter_groups.enable=true: verl 0.9.1's legacy trainer has no group filtering (only its v1 "
            "trainer's replay buffer filters groups); set trainer.use_v1=true or algorithm.filter_groups.enable=false"
        )
    metric = _select(cfg, "algorithm.filter_groups.metric", None)
    if metric in (None, "", "reward"):
        problems.append(
            f"algorithm.filter_groups.metric={metric!r}: with Gym set {OUTCOME_METRIC} (Gym's verified reward of each "
            "valid sample; masked samples never decide a group) or a reward component's name; 'reward' reads "
            "rm_scores, where a masked sample counts as a real 0"
        )
    return str(metric) if metric else None


def _gdpo_keys(cfg: Any, estimator: Any, v1: bool, problems: list[str]) -> list[str]:
    """``algorithm.gdpo_reward_keys`` as strings; with ``algorithm.adv_estimator=gdpo`` problems appended: the v1
    trainer (verl 0.9.1's ``trainer_base._compute_advantage`` hands the estimator no reward components) and an empty
    list."""
    raw = _plain(_select(cfg, "algorithm.gdpo_reward_keys", None))
    keys = [raw] if isinstance(raw, str) else list(raw or [])
    if estimator != GDPO:
        return [str(k) for k in keys]
    if v1:
        problems.append(
            f"algorithm.adv_estimator={GDPO!r} (algorithm.gdpo_reward_keys={[str(k) for k in keys]}): verl 0.9.1's v1 "
            "trainer does not pass reward components to the estimator (trainer_base._compute_advantage fetches only "
            "uid, response_mask, rm_scores, log-probs and values), so GDPO would fail or silently train on the summed "
            "reward; set trainer.use_v1=false (the legacy trainer passes them) or use masked_grpo"
        )
    bad = [k for k in keys if not isinstance(k, str) or not k]
    if not keys or bad:
        problems.append(
            f"algorithm.gdpo_reward_keys={keys!r}: GDPO needs a list of the environment's reward component names "
            "(the keys of reward_components in its verify response, e.g. [correctness, format])"
        )
    return [str(k) for k in keys]


def _rollout_data_dir(cfg: Any) -> str | None:
    value = _select(cfg, "trainer.rollout_data_dir", None)
    return str(value) if value else None


def _sglang_problems(cfg: Any) -> list[str]:
    """What ``actor_rollout_ref.rollout.name=sglang`` needs from verl's rollout keys (docs/SGLANG.md)."""
    problems = []
    key = "actor_rollout_ref.rollout.skip_tokenizer_init"
    skip = _select(cfg, key, True)  # verl's default is True
    if skip is not False:
        problems.append(
            f"{key}={skip!r}: must be false with rollout.name=sglang: without a tokenizer SGLang's OpenAI chat "
            "endpoint (which Gym calls) answers 500 to every request"
        )
    key = "actor_rollout_ref.rollout.disaggregation.enabled"
    disaggregated = _select(cfg, key, False)
    if disaggregated:
        problems.append(
            f"{key}={disaggregated!r}: prefill/decode disaggregation is not supported with NeMo Gym (Gym calls each "
            "replica's one OpenAI address; the token-ID patch is not applied to the decode servers); set false"
        )
    return problems
