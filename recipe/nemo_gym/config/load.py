"""The recipe's typed configuration: our ``nemo_gym:`` section plus the verl keys the adapter depends on.

Validated once, at start-up, before any heavy import (:func:`load_config`); every error names the full dotted key,
the bad value and the fix, and all problems are reported together: the section's (:mod:`nemo_gym_adapter.config`),
the verl keys read here, and the rules across both (:mod:`recipe.nemo_gym.config.checks`). Everything else reads
attributes of the returned :class:`RecipeConfig` -- no ``cfg.get("key", default)`` chains elsewhere (STYLE.md §3).

The ``${ngv_...}`` resolvers the shipped configs use live in :mod:`recipe.nemo_gym.config.resolvers`;
``${ngv_manager:<use_v1>}`` picks :data:`MANAGER_CLASS_V1` or :data:`MANAGER_CLASS`, the managers checked here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from nemo_gym_adapter.config import SECTION, NemoGymConfig, parse_section, plain
from nemo_gym_adapter.errors import AdapterConfigError
from recipe.nemo_gym.config import checks
from recipe.nemo_gym.config.checks import MASKED_GRPO
from recipe.nemo_gym.config.sampling import SamplingSettings, read_sampling

MANAGER_CLASS = "recipe.nemo_gym.managers.legacy.NemoGymAgentLoopManager"  # legacy trainer (trainer.use_v1=False)
MANAGER_CLASS_V1 = "recipe.nemo_gym.managers.v1.NemoGymAgentLoopManagerTQ"  # v1 trainer (the default)
DATASET_PATH = "pkg://nemo_gym_adapter.data.dataset"
DATASET_NAME = "GymJsonlDataset"


class RecipeConfig(BaseModel):
    """What the manager needs, read once from the whole (verl + ``nemo_gym``) config."""

    model_config = ConfigDict(frozen=True)

    gym: NemoGymConfig
    prompt_length: int
    response_length: int
    max_model_len: int | None
    sampling: SamplingSettings  # actor_rollout_ref.rollout's sampling keys (config.sampling), sent with every request
    val_sampling: SamplingSettings  # the same for validation: rollout.val_kwargs
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

    rollout_name: str = "vllm"  # verl's actor_rollout_ref.rollout.name: the engine (checks.ROLLOUT_ENGINES)

    @property
    def required_reward_components(self) -> tuple[str, ...]:
        """Reward components the trainer reads per sample: GDPO's keys, and the group filter's metric when it names a
        component (``gym_outcome`` is Gym's reward, always there). A valid result without one is masked
        ``missing_reward_component`` (``nemo_gym_adapter.rollouts.reward_components``)."""
        keys = list(self.gdpo_reward_keys) if self.adv_estimator == checks.GDPO else []
        metric = self.filter_groups_metric
        if metric and metric != checks.OUTCOME_METRIC and metric not in keys:
            keys.append(metric)
        return tuple(keys)


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


def _world_size(cfg: Any) -> Any:
    """The actor's world: ``trainer.nnodes x trainer.n_gpus_per_node`` (None when either is not an integer)."""
    nodes, per_node = _select(cfg, "trainer.nnodes", 1), _select(cfg, "trainer.n_gpus_per_node", 1)
    ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (nodes, per_node))
    return nodes * per_node if ok else None


def _is_interpolation(node: Any, leaf: str) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.is_config(node) and leaf in node and OmegaConf.is_interpolation(node, leaf)


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
    contiguity = gym.trajectory.contiguity if gym is not None else None
    if contiguity is not None:
        checks.check_split_trainer(contiguity, v1, problems)
    name = _select(cfg, "actor_rollout_ref.rollout.name", None)
    checks.check_engine(
        name,
        _select(cfg, "actor_rollout_ref.rollout.skip_tokenizer_init", True),  # verl's default is True
        _select(cfg, "actor_rollout_ref.rollout.disaggregation.enabled", False),
        problems,
    )
    estimator = _select(cfg, "algorithm.adv_estimator", None)
    checks.check_estimator(estimator, problems)
    raw_gdpo_keys = plain(_select(cfg, "algorithm.gdpo_reward_keys", None))
    gdpo_keys = checks.gdpo_reward_keys(raw_gdpo_keys, estimator, problems)
    if contiguity is not None:
        checks.check_split_estimator(contiguity, v1, estimator, problems)
    filter_metric = checks.filter_groups_metric(
        _select(cfg, "algorithm.filter_groups.enable", False),
        _select(cfg, "algorithm.filter_groups.metric", None),
        v1,
        problems,
    )
    checks.check_trusted_logprobs(
        gym is not None and gym.trusted_logprobs.enable,
        _select(cfg, "algorithm.rollout_correction.bypass_mode", False),
        problems,
    )
    checks.check_ray_dashboard(
        _select(cfg, "ray_kwargs.ray_init.include_dashboard", None),
        gym is not None and gym.access.ray_dashboard,
        problems,
    )
    checks.check_rollout_dtype(
        _select(cfg, "actor_rollout_ref.rollout.dtype", None),
        _select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars.VERL_PLATFORM", None) or os.environ.get("VERL_PLATFORM"),
        problems,
    )
    actor = "actor_rollout_ref.actor"
    checks.check_micro_batches(
        strategy=_select(cfg, f"{actor}.strategy", None),
        train_batch_size=_select(cfg, "data.train_batch_size", None),
        n=_select(cfg, "actor_rollout_ref.rollout.n", None),
        world_size=_world_size(cfg),
        ulysses_size=_select(cfg, f"{actor}.ulysses_sequence_parallel_size", 1),
        mini_batch=_select(cfg, f"{actor}.ppo_mini_batch_size", None),
        update_micro=_select(cfg, f"{actor}.ppo_micro_batch_size_per_gpu", None),
        update_dynamic=_select(cfg, f"{actor}.use_dynamic_bsz", False),
        logprob_micro=_select(cfg, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", None),
        logprob_dynamic=_select(cfg, "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", False),
        problems=problems,
    )
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
    val_keys = plain(_select(cfg, "actor_rollout_ref.rollout.val_kwargs", None)) or {}
    train_sampling, val_sampling = read_sampling(lambda key, default: _select(cfg, key, default), val_keys, problems)
    model_path = _select(cfg, "actor_rollout_ref.model.path", None, resolve=False)
    need("actor_rollout_ref.model.path", isinstance(model_path, str) and bool(model_path), model_path, "set a model")
    if check_files:
        for key in ("data.train_files", "data.val_files"):
            files = plain(_select(cfg, key, None))
            files = [files] if isinstance(files, str) else list(files or [])
            need(key, bool(files), files, "set one or more Gym JSONL files")
            for i, f in enumerate(files):
                if not Path(str(f)).expanduser().is_file():
                    problems.append(f"{key}[{i}]={f!r}: no such file; point it at a Gym JSONL file")
    if problems:
        raise AdapterConfigError("invalid recipe config:\n  " + "\n  ".join(problems))
    assert gym is not None  # no problems means the section parsed
    rollout_data_dir = _select(cfg, "trainer.rollout_data_dir", None)
    return RecipeConfig(
        gym=gym,
        prompt_length=ints["prompt_length"],
        response_length=ints["response_length"],
        n=ints["n"],
        max_model_len=max_model_len,
        model_path=str(model_path),
        rollout_data_dir=str(rollout_data_dir) if rollout_data_dir else None,
        filter_groups_metric=filter_metric,
        gdpo_reward_keys=gdpo_keys,
        adv_estimator=str(estimator),
        rollout_name=str(name),
        sampling=train_sampling,
        val_sampling=val_sampling,
    )
