"""The recipe's ``nemo_gym:`` section as the library's own configs: the Gym to launch, how results become
trajectories, the rollout client's knobs, liveness. Pure translation (no I/O): every key is validated already
(``nemo_gym_adapter.config``, ``recipe.nemo_gym.config.load``); the library configs name the same dotted keys in
their own errors (``key_prefix``).
"""

from __future__ import annotations

from typing import Any

from nemo_gym_adapter.config import NemoGymConfig
from nemo_gym_adapter.gym.launch import TRAINING_MODEL_CONFIG, GymLaunchSpec
from nemo_gym_adapter.gym.liveness import LivenessConfig
from nemo_gym_adapter.rollouts.client import RolloutClientConfig
from nemo_gym_adapter.rollouts.retemplate import HFChatRenderer
from nemo_gym_adapter.rollouts.trajectory import TrajectoryConfig
from recipe.nemo_gym.config.load import RecipeConfig


def gym_launch_spec(
    gym: NemoGymConfig, urls: list[str], model_name: str, *, host: str, api_key: Any = None
) -> GymLaunchSpec:
    """The Gym to start for the ``nemo_gym:`` section, listening on ``host`` (``addresses.choose_gym_host``), with
    the replicas at ``urls`` (``http://ip:port/v1``) as its policy; ``api_key``: what Gym's model server sends them
    (the run's rollout key), else ``nemo_gym.policy_api_key``; with ``nemo_gym.access.guard_gym`` Gym's own servers
    require it too."""
    config_paths = list(gym.config_paths)
    if gym.add_training_model_config and TRAINING_MODEL_CONFIG not in config_paths:
        config_paths.append(TRAINING_MODEL_CONFIG)
    optional = {
        "head_port": gym.head_port,
        "port_range": gym.port_range,
        "gym_venv": gym.gym_venv,
        "run_dir": gym.run_dir,
        "ray_head_node_address": gym.external_ray_head,  # a Ray head someone else runs
        "access_key": api_key if gym.guards_gym else None,
    }
    return GymLaunchSpec.parse(
        {
            "config_paths": config_paths,
            "policy_base_url": urls,
            "policy_model_name": model_name,
            "policy_api_key": api_key if api_key is not None else gym.policy_api_key,
            "host": host,
            "config_overrides": gym.config_overrides,
            "hydra_overrides": gym.hydra_overrides,
            "env": gym.env,
            "startup_timeout_s": gym.startup_timeout_s,
            "port_retries": gym.port_retries,
            "ray_metrics": gym.access.ray_dashboard,  # a Ray Gym starts itself (nemo_gym.ray_head: gym)
            **{k: v for k, v in optional.items() if v is not None},
        },
        prefix="nemo_gym",
    )


def trajectory_config(
    recipe: RecipeConfig, max_model_len: int | None, vocab_size: int | None = None, tokenizer: Any = None
) -> TrajectoryConfig:
    """Trajectory lengths and masking policy from the trainer's rollout lengths and ``nemo_gym.trajectory``;
    ``vocab_size``: the model's embedding rows (ids outside are masked); ``tokenizer``: the trainer's, which renders
    the conversation under ``train_tokens: measure_retemplated``."""
    train_tokens = recipe.gym.trajectory.train_tokens
    renderer = HFChatRenderer(tokenizer) if train_tokens == "measure_retemplated" else None
    return TrajectoryConfig(
        prompt_length=recipe.prompt_length,
        response_length=recipe.response_length,
        max_model_len=max_model_len,
        contiguity=recipe.gym.trajectory.contiguity,
        mask_on_failure_kind=recipe.gym.trajectory.mask_on_failure_kind,
        verifier_errors=dict(recipe.gym.trajectory.verifier_errors),
        forced_token_min_logprob=recipe.gym.trajectory.forced_token_min_logprob,
        required_components=recipe.required_reward_components,
        vocab_size=vocab_size,
        key_prefix="nemo_gym.trajectory",
        train_tokens=train_tokens,
        renderer=renderer,
    )


def client_config(gym: NemoGymConfig) -> RolloutClientConfig:
    """The rollout client's knobs from ``nemo_gym.client``."""
    c = gym.client
    return RolloutClientConfig(
        max_concurrency=c.max_concurrency,
        timeout_s=c.timeout_s,
        max_connection_retries=c.max_connection_retries,
        retry_backoff_s=c.retry_backoff_s,
        progress=c.progress,
        max_body_mb=c.max_body_mb,
        key_prefix="nemo_gym.client",
    )


def liveness_config(gym: NemoGymConfig) -> LivenessConfig:
    """``nemo_gym.on_server_down`` and ``nemo_gym.liveness``."""
    return LivenessConfig(on_server_down=gym.on_server_down, **gym.liveness.model_dump())
