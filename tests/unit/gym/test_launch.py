"""Unit tests of nemo_gym_adapter.gym.launch: the launch spec's validation, config-path resolution, the launch
config we merge after the user's Gym configs, and Gym's environment."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.gym.launch import API_KEY_ENV, GymLaunchSpec, launch_config, launch_env, resolve_config_paths
from tests.support.fake_gym_venv import GYM_REL_CONFIG, fake_spec


def test_spec_normalises_replica_addresses():
    spec = GymLaunchSpec(
        config_paths=["a.yaml"],
        policy_base_url=["10.0.0.1:8000", "http://h:1/v1/", "https://h:2"],
        policy_model_name="m",
    )
    assert spec.policy_base_url == ["http://10.0.0.1:8000/v1", "http://h:1/v1", "https://h:2/v1"]
    assert "secret" not in repr(
        GymLaunchSpec(config_paths=["a"], policy_base_url=["h:1"], policy_model_name="m", policy_api_key="secret")
    )


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"policy_base_url": ["http://h:1/v2"]}, "policy_base_url"),
        ({"policy_base_url": []}, "policy_base_url"),
        ({"config_paths": []}, "config_paths"),
        ({"head_port": 70000}, "head_port"),
        ({"port_range": (20000, 10000)}, "port_range"),
        ({"startup_timeout_s": 0}, "startup_timeout_s"),
        ({"policy_modle_name": "typo"}, "policy_modle_name"),
    ],
)
def test_spec_errors_name_the_field(bad, field):
    data = {"config_paths": ["a.yaml"], "policy_base_url": ["h:1"], "policy_model_name": "m", **bad}
    with pytest.raises(ValidationError) as e:
        GymLaunchSpec(**data)
    assert field in str(e.value)
    with pytest.raises(AdapterConfigError, match=rf"trainer\.gym\.{field}"):
        GymLaunchSpec.parse(data, prefix="trainer.gym")


def test_config_paths_resolve_like_gym(fake_gym_venv, tmp_path, monkeypatch):
    mine = tmp_path / "cwd" / "configs" / "mine.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("x: 1\n")
    monkeypatch.chdir(tmp_path / "cwd")
    spec = fake_spec(fake_gym_venv, tmp_path, config_paths=["configs/mine.yaml", GYM_REL_CONFIG])
    # cwd-relative becomes absolute (Gym runs in run_dir); Gym-relative stays for Gym's own lookup
    assert resolve_config_paths(spec) == [str(mine.resolve()), GYM_REL_CONFIG]
    with pytest.raises(AdapterConfigError, match=r"gym\.config_paths\[1\]: 'nope/x\.yaml' not found"):
        resolve_config_paths(fake_spec(fake_gym_venv, tmp_path, config_paths=[GYM_REL_CONFIG, "nope/x.yaml"]))
    with pytest.raises(AdapterConfigError, match=r"gym\.config_paths\[0\]"):
        resolve_config_paths(fake_spec(fake_gym_venv, tmp_path, config_paths=[str(tmp_path / "absent.yaml")]))


def test_launch_config_carries_everything_but_the_key(tmp_path):
    spec = GymLaunchSpec(
        config_paths=["a.yaml"],
        policy_base_url=["h:1", "h:2"],
        policy_model_name="m",
        policy_api_key="sk-secret",
        ray_head_node_address="10.0.0.1:6379",
        port_range=(30000, 31000),
        server_venvs_dir=tmp_path / "venvs",
        config_overrides={"head_server": {"host": "0.0.0.0"}, "policy_model": {"x": 1}},
    )
    cfg = launch_config(spec, head_port=1234, run_dir=tmp_path)
    assert cfg["policy_base_url"] == "http://h:1/v1"  # one string, as Gym's CLI sets it (see below)
    assert cfg["head_server"] == {"host": "0.0.0.0", "port": 1234}  # deep-merged override
    assert cfg["ray_head_node_address"] == "10.0.0.1:6379"
    assert (cfg["port_range_low"], cfg["port_range_high"]) == (30000, 31000)
    assert cfg["uv_venv_dir"] == str(tmp_path / "venvs") and cfg["skip_venv_if_present"] is True
    assert cfg["policy_model"] == {"x": 1}
    assert "sk-secret" not in json.dumps(cfg)


def test_launch_env_scrubs_the_trainer_and_carries_the_key_only_in_the_environment(tmp_path):
    spec = GymLaunchSpec(
        config_paths=["a.yaml"], policy_base_url=["h:1"], policy_model_name="m", policy_api_key="sk-secret"
    )
    env = launch_env(spec, base={"PYTHONPATH": "/trainer", "RAY_ADDRESS": "10.0.0.1:6379", "PATH": "/usr/bin"})
    assert "PYTHONPATH" not in env and env["RAY_ADDRESS"] == "local"  # Gym starts its own Ray cluster
    assert env[API_KEY_ENV] == "sk-secret" and env["PATH"].endswith("/usr/bin")


def test_launch_config_gives_gyms_servers_the_safe_band_unless_a_range_is_set(tmp_path):
    from nemo_gym_adapter.gym.ports import safe_port_range

    spec = GymLaunchSpec(config_paths=["a.yaml"], policy_base_url=["127.0.0.1:1"], policy_model_name="m")
    cfg = launch_config(spec, 21000, tmp_path)
    assert (cfg["port_range_low"], cfg["port_range_high"]) == safe_port_range()
    cfg = launch_config(spec.model_copy(update={"port_range": (40000, 40100)}), 21000, tmp_path)
    assert (cfg["port_range_low"], cfg["port_range_high"]) == (40000, 40100)


def test_policy_base_url_is_one_string_and_only_the_policys_model_servers_get_the_replica_list(tmp_path):
    # Gym configs interpolate policy_base_url into string fields too (verifif.judge_base_url, speed_bench)
    (tmp_path / "responses_api_models").mkdir()  # a Gym root: includes resolve against it
    (tmp_path / "shared.yaml").write_text(
        "shared_model:\n  responses_api_models:\n    vllm_model:\n      base_url: ${policy_base_url}\n"
    )
    env = tmp_path / "env.yaml"
    env.write_text(
        "config_paths: [shared.yaml]\n"
        "judge:\n  resources_servers:\n    verifif:\n      judge_base_url: ${policy_base_url}\n"
        "policy_model:\n  responses_api_models:\n    vllm_model:\n      base_url: ${policy_base_url}\n"
        "other_model:\n  responses_api_models:\n    vllm_model:\n      base_url: ${judge_base_url}\n"
    )
    one = GymLaunchSpec(config_paths=["a.yaml"], policy_base_url=["h:1"], policy_model_name="m")
    cfg = launch_config(one, head_port=1, run_dir=tmp_path, files=[env])
    assert cfg["policy_base_url"] == "http://h:1/v1" and "policy_model" not in cfg
    overrides = {"mine": {"responses_api_models": {"vllm_model": {"base_url": "${policy_base_url}"}}}}
    two = GymLaunchSpec(
        config_paths=["a.yaml"], policy_base_url=["h:1", "h:2"], policy_model_name="m", config_overrides=overrides
    )
    cfg = launch_config(two, head_port=1, run_dir=tmp_path, files=[env])
    both = {"responses_api_models": {"vllm_model": {"base_url": ["http://h:1/v1", "http://h:2/v1"]}}}
    assert cfg["policy_base_url"] == "http://h:1/v1"
    assert cfg["policy_model"] == cfg["shared_model"] == cfg["mine"] == both  # the include and the override too
    assert "other_model" not in cfg and "judge" not in cfg
