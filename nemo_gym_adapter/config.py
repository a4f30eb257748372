"""Our ``nemo_gym:`` section: every key, its default and its check (the one place a new key goes).

Validated once, at start-up, before any heavy import, together with the verl keys the adapter depends on
(:func:`recipe.nemo_gym.config.load.load_config`); every error names the full dotted key, the bad value and the
fix, and all problems are reported together. Everything else reads attributes of the returned
:class:`NemoGymConfig` -- no ``cfg.get("key", default)`` chains elsewhere (STYLE.md §3). A new key: a field here
(with its default and why), a line below, a row in ``configs/base/nemo_gym_recipe.yaml`` and one in ``docs/CONFIGURATION.md`` (a test holds the two
to each other), and, when it is one of the keys that matter most, a line in the README's table.

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
      access: {require_key: true, local_only: auto,   # the run's rollout key on every replica route; loopback on one host
               guard_gym: null,  # Gym's servers require the key too (null: whenever they can)
               ray_dashboard: false}  # Ray's dashboard and metrics exporters in the Rays the run starts (access.listen)
      env: {}                        # extra environment for Gym's processes
      patch_vllm: true               # apply the token-ID patch inside every rollout server actor (vLLM or SGLang)
      assistant_edits: keep_ids      # a tokenized assistant message edited while its ids were kept: keep_ids | refuse
      partial_rollouts: true         # a turn a weight sync aborted resumes from its tokens (false: 503, regenerated)
      client: {max_concurrency: 64, timeout_s: 900, max_connection_retries: 3, retry_backoff_s: 0.5, progress: null,
               max_body_mb: 128}       # max_body_mb: the largest /run body read (rollouts.transport)
      trajectory: {contiguity: mask, mask_on_failure_kind: false, verifier_errors: {}, forced_token_min_logprob: null,
                   train_tokens: generated}   # measure_retemplated: a measurement mode (rollouts.retemplate)
      metrics: {success_threshold: null, gym_aggregate: true}   # gym_aggregate: Gym's /aggregate_metrics on validation
      env_weights: null              # {<env>: <weight>}: each env's share of every training batch (env_sampling)
      on_server_down: restart        # a dead Gym server / vLLM replica: mask its rows | restart (a Gym we started) | fail
      liveness: {interval_s: 1, probe_timeout_s: 3, busy_grace_s: 120, idle_s: 3, replica_grace_s: 120, max_restarts: 3}
      rollout_dump: {dir: null, enable: true, validation: true, max_text_chars: 4000, queue_size: 4096}
                                     # readable rollouts (rollouts.dump); dir null: <trainer.rollout_data_dir>/gym
      trusted_logprobs: {enable: false, check_every: 10, max_mean_abs_diff: 1.0e-4, max_abs_diff: 1.0e-2,
                         on_exceed: recompute}   # rollout log-probs as the old ones, guarded (recipe logprob_guard)
      auto_dtype: {bf16_peak_gib: null}   # rollout.dtype: auto weighs this measured peak (recipe.nemo_gym.cpu.dtype)

The rules that span our section and verl's keys (estimators, GDPO, group filtering, the engine) are
:mod:`recipe.nemo_gym.config.checks`; the whole config is read by :mod:`recipe.nemo_gym.config.load`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from nemo_gym_adapter.errors import AdapterConfigError

SECTION = "nemo_gym"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClientSection(_Section):
    """``nemo_gym.client``: the rollout client (``client.RolloutClientConfig``)."""

    max_concurrency: int = Field(64, ge=1, description="rollouts in flight at once")
    timeout_s: float = Field(900.0, gt=0, description="per-rollout deadline")
    max_connection_retries: int = Field(3, ge=0)
    retry_backoff_s: float = Field(0.5, ge=0)
    progress: bool | None = Field(None, description="progress bar; null: only on a TTY")
    # The largest /run body read (MiB): a declared Content-Length over it is refused unread, a streamed body cut the
    # moment it passes it (rollouts.transport); the row is masked invalid_result. A result repeats every model call's
    # prompt ids, so long multi-turn rollouts reach tens of MB; what one row may buffer is bounded by this.
    max_body_mb: float = Field(128.0, gt=0, description="largest /run body read, MiB")


class TrajectorySection(_Section):
    """``nemo_gym.trajectory``: how Gym results become token trajectories (``trajectory.TrajectoryConfig``)."""

    # Model calls that do not form one history (rollouts.builder, rollouts.segments): mask the rollout, truncate it to the
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
    # A MEASUREMENT mode, never for real training: measure_retemplated trains every rollout as its re-templated
    # conversation (the final history rendered by the chat template, loss on its assistant spans, old log-probs from the
    # actor), as trainers without exact token ids do (rollouts.retemplate; docs/TOKEN_PATCH.md). generated: the tokens
    # the model generated, in the contexts it saw them in.
    train_tokens: Literal["generated", "measure_retemplated"] = "generated"


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
    # Every server of the Gym the run starts requires the run's key too (header X-NGV-Run-Key, access.gym_guard): Gym
    # 0.7 has no authentication, so on loopback any other user of the host could send rows through Gym's agents to the
    # run's replicas. Needs require_key and a Gym the run starts (not head_url); on by default where both hold.
    guard_gym: bool | None = None
    # Ray's dashboard and its Prometheus metrics exporters (each node's dashboard agent, the dashboard process, the
    # autoscaler monitor) in the Rays the run starts -- the trainer's and Gym's: they answer every user of the host,
    # without Ray's token, with the run's metrics. false: not started (access.listen.ray_exporters_env; the recipe's
    # Ray without the dashboard's web UI); true: Ray's defaults, for your own Prometheus.
    ray_dashboard: bool = False

    @field_validator("local_only", mode="before")
    @classmethod
    def _yaml_bool(cls, value: Any) -> Any:
        return str(value).lower() if isinstance(value, bool) else value


class TrustedLogprobsSection(_Section):
    """``nemo_gym.trusted_logprobs``: the rollout's log-probs as PPO's old ones (verl's ``bypass_mode``, switched per
    step), vouched for by a guard that recomputes on the first step and every ``check_every`` steps and falls back (or
    stops) when the gap passes a bound (``recipe.nemo_gym.algorithms.logprob_guard``)."""

    enable: bool = False
    check_every: int = Field(10, ge=0, description="a recompute every N steps after the first; 0: the first only")
    max_mean_abs_diff: float = Field(1e-4, gt=0, description="bound on mean |rollout - actor| per trained token")
    max_abs_diff: float = Field(1e-2, gt=0, description="bound on the largest |rollout - actor| of a trained token")
    on_exceed: Literal["recompute", "fail"] = "recompute"


class AutoDtypeSection(_Section):
    """``nemo_gym.auto_dtype``: what ``actor_rollout_ref.rollout.dtype: auto`` weighs on a CPU without bfloat16
    instructions, where float32 is faster but bigger (``recipe.nemo_gym.cpu.dtype``)."""

    # This config's peak memory on the node (GiB, as docs/BENCHMARKS.md writes GB), measured with a bfloat16 rollout
    # engine; a config sets it with the measurement's source in a comment. auto picks float32 only when this plus
    # float32's estimated extra stays under Ray's memory line. null: not measured -- auto decides by the CPU alone.
    bf16_peak_gib: float | None = Field(None, gt=0)


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
    # A turn a weight sync aborted (verl's async trainer modes) is resumed inside the patched server from the tokens
    # it had (vllm.resume); false: answered 503 and regenerated whole by Gym's retry, as before.
    partial_rollouts: bool = True
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
    trusted_logprobs: TrustedLogprobsSection = Field(default_factory=TrustedLogprobsSection)
    auto_dtype: AutoDtypeSection = Field(default_factory=AutoDtypeSection)

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
        if self.access.guard_gym is True and not self._can_guard_gym:
            raise ValueError(
                "access.guard_gym needs the run's rollout key (access.require_key: true) and a Gym this run starts "
                "(head_url: null); a Gym you run yourself is yours to protect (docs/CLUSTER.md)"
            )
        if self.trajectory.train_tokens == "measure_retemplated":
            if self.trusted_logprobs.enable:
                raise ValueError(
                    "trajectory.train_tokens=measure_retemplated trains tokens the model never generated: their old "
                    "log-probs must be the actor's; set nemo_gym.trusted_logprobs.enable=false"
                )
            if self.trajectory.contiguity == "split":
                raise ValueError(
                    "trajectory.train_tokens=measure_retemplated makes one sample of the whole conversation; "
                    "contiguity=split makes one per model call: choose one (they are two of docs/TOKEN_PATCH.md's arms)"
                )
        if self.head_url is not None and self.config_paths:
            raise ValueError(
                f"both head_url ({self.head_url}) and config_paths are set: attaching uses the running Gym's own "
                "configs; set nemo_gym.config_paths=[] or nemo_gym.head_url=null"
            )
        return self

    @property
    def _can_guard_gym(self) -> bool:
        return self.access.require_key and self.head_url is None

    @property
    def guards_gym(self) -> bool:
        """Whether Gym's servers require the run's key: ``access.guard_gym``, or by default (None) whenever they can
        (the run's key is on and the run starts its Gym)."""
        return self._can_guard_gym if self.access.guard_gym is None else self.access.guard_gym


def plain(value: Any) -> Any:
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
        return NemoGymConfig.model_validate(dict(plain(section) or {}))
    except ValidationError as e:
        raise AdapterConfigError("invalid recipe config:\n  " + "\n  ".join(_describe(e, SECTION))) from e
