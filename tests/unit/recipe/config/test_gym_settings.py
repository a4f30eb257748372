"""The recipe's ``nemo_gym:`` section as the library's configs (``recipe.nemo_gym.config.gym_settings``): the Gym to launch,
trajectories, the rollout client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nemo_gym_adapter.gym.launch import TRAINING_MODEL_CONFIG
from recipe.nemo_gym.config.gym_settings import client_config, gym_launch_spec, trajectory_config
from recipe.nemo_gym.config.load import load_config
from tests.support.recipe_config import GYM_CONFIG, minimal_recipe_config


@pytest.fixture
def cfg(tmp_path: Path) -> dict[str, Any]:
    return minimal_recipe_config(tmp_path)


def test_launch_spec_points_gym_at_the_replicas_with_the_training_model_config(cfg):
    cfg["nemo_gym"].update(host="10.0.0.2", head_port=12000, config_overrides={"x": {"y": 1}})
    gym = load_config(cfg, check_files=False).gym
    spec = gym_launch_spec(gym, ["http://10.0.0.1:8000/v1", "10.0.0.1:8001"], "/models/qwen", host="10.0.0.2")
    assert spec.config_paths == [GYM_CONFIG, TRAINING_MODEL_CONFIG]
    assert spec.policy_base_url == ["http://10.0.0.1:8000/v1", "http://10.0.0.1:8001/v1"]
    assert (spec.policy_model_name, spec.host, spec.head_port) == ("/models/qwen", "10.0.0.2", 12000)
    assert spec.config_overrides == {"x": {"y": 1}}
    assert (spec.port_range, spec.port_retries) == (None, 2)  # the safe band (gym.ports), two relaunches


def test_launch_spec_carries_the_port_band_and_retries(cfg):
    cfg["nemo_gym"].update(port_range=[40000, 41000], port_retries=0)
    spec = gym_launch_spec(load_config(cfg, check_files=False).gym, ["10.0.0.1:8000"], "m", host="127.0.0.1")
    assert (spec.port_range, spec.port_retries) == ((40000, 41000), 0)


def test_trajectory_and_client_configs_come_from_the_recipe(cfg):
    cfg["nemo_gym"].update(trajectory={"contiguity": "truncate"}, client={"max_concurrency": 7, "timeout_s": 5})
    recipe = load_config(cfg, check_files=False)
    traj = trajectory_config(recipe, max_model_len=300)
    assert (traj.prompt_length, traj.response_length, traj.max_model_len) == (256, 128, 300)
    assert traj.contiguity == "truncate"
    client = client_config(recipe.gym)
    assert (client.max_concurrency, client.timeout_s, client.key_prefix) == (7, 5.0, "nemo_gym.client")


def test_a_ray_head_address_goes_to_gym_and_early_or_gym_give_none(cfg):
    for mode, address in (("10.0.0.5:6379", "10.0.0.5:6379"), ("early", None), ("gym", None)):
        cfg["nemo_gym"]["ray_head"] = mode
        spec = gym_launch_spec(load_config(cfg, check_files=False).gym, ["10.0.0.1:8000"], "m", host="127.0.0.1")
        assert spec.ray_head_node_address == address, mode


def test_gyms_servers_get_the_run_key_by_default_and_not_when_turned_off(cfg):
    from pydantic import SecretStr

    key = SecretStr("run-key")
    gym = load_config(cfg, check_files=False).gym
    assert gym.access.guard_gym is None and gym.guards_gym
    attached = {**cfg, "nemo_gym": {**cfg["nemo_gym"], "head_url": "http://10.0.0.9:11000", "config_paths": []}}
    assert not load_config(attached, check_files=False).gym.guards_gym  # an attached Gym is yours to protect
    spec = gym_launch_spec(gym, ["10.0.0.1:8000"], "m", host="127.0.0.1", api_key=key)
    assert spec.access_key is not None and spec.access_key.get_secret_value() == "run-key"
    assert "run-key" not in repr(spec)
    for access in ({"guard_gym": False}, {"require_key": False}):
        cfg["nemo_gym"]["access"] = access
        gym = load_config(cfg, check_files=False).gym
        assert gym_launch_spec(gym, ["10.0.0.1:8000"], "m", host="127.0.0.1", api_key=key).access_key is None, access
