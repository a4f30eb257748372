"""The ``nemo_gym:`` section (``nemo_gym_adapter.config``): defaults complete, every error names its full dotted key,
the bad value and a fix (read through ``load_config``, as the recipe reads it)."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.config import NemoGymConfig, parse_section
from recipe.nemo_gym.config.load import load_config
from tests.support.recipe_config import GYM_CONFIG, config_error, minimal_recipe_config


@pytest.fixture
def cfg(tmp_path):
    return minimal_recipe_config(tmp_path)


def test_defaults_are_complete():
    section = parse_section({"config_paths": [GYM_CONFIG]})
    assert section.head_url is None and section.add_training_model_config and section.patch_vllm
    assert section.client.max_concurrency == 64 and section.client.timeout_s == 900.0
    assert section.trajectory.contiguity == "mask" and section.trajectory.mask_on_failure_kind is False
    assert section.metrics.success_threshold is None
    assert section.assistant_edits == "keep_ids"
    assert section.ray_head == "early"  # Gym's Ray head starts while verl starts (gym_ray)
    assert section.policy_api_key.get_secret_value() == "EMPTY"
    # every field has a default: only the start-or-attach choice is required
    required = [name for name, f in NemoGymConfig.model_fields.items() if f.is_required()]
    assert required == []


@pytest.mark.parametrize("value", ["early", "gym", "10.0.0.1:6379", "node-1.cluster:40000"])
def test_ray_head_takes_early_gym_or_an_address(value):
    assert parse_section({"config_paths": [GYM_CONFIG], "ray_head": value}).ray_head == value


@pytest.mark.parametrize(
    ("section", "key", "fragment"),
    [
        ({}, "nemo_gym", "config_paths is empty and head_url is null"),
        ({"config_paths": [GYM_CONFIG], "head_url": "http://h:1"}, "nemo_gym", "both head_url"),
        ({"head_url": "h:11000"}, "nemo_gym.head_url='h:11000'", "http(s) URL"),
        (
            {"config_paths": [GYM_CONFIG], "client": {"max_concurrency": 0}},
            "nemo_gym.client.max_concurrency=0",
            "greater than or equal to 1",
        ),
        ({"config_paths": [GYM_CONFIG], "client": {"timout_s": 3}}, "nemo_gym.client.timout_s=3", "Extra inputs"),
        (
            {"config_paths": [GYM_CONFIG], "trajectory": {"contiguity": "drop"}},
            "nemo_gym.trajectory.contiguity",
            "mask",
        ),
        (
            {"config_paths": [GYM_CONFIG], "trajectory": {"verifier_errors": {"grl_sokoban": "zero"}}},
            "nemo_gym.trajectory.verifier_errors.grl_sokoban='zero'",
            "'mask' or 'reward0'",
        ),
        ({"config_paths": [GYM_CONFIG], "head_port": 70000}, "nemo_gym.head_port=70000", "65535"),
        ({"config_paths": [GYM_CONFIG], "port_range": [30000, 20000]}, "nemo_gym.port_range", "low < high"),
        ({"config_paths": [GYM_CONFIG], "port_range": [80, 2000]}, "nemo_gym.port_range", "1024 <= low"),
        ({"config_paths": [GYM_CONFIG], "port_range": [20000]}, "nemo_gym.port_range.1", "Field required"),
        ({"config_paths": [GYM_CONFIG], "port_retries": -1}, "nemo_gym.port_retries=-1", "greater than or equal"),
        (
            {"config_paths": [GYM_CONFIG], "assistant_edits": "keep"},
            "nemo_gym.assistant_edits='keep'",
            "'keep_ids' or 'refuse'",
        ),
        ({"config_paths": [GYM_CONFIG], "ray_head": "later"}, "nemo_gym.ray_head='later'", "use early"),
        ({"config_paths": [GYM_CONFIG], "ray_head": "h:70000"}, "nemo_gym.ray_head='h:70000'", "host:port"),
        ({"config_paths": [GYM_CONFIG], "ray_head": "ray://h:1"}, "nemo_gym.ray_head='ray://h:1'", "host:port"),
    ],
)
def test_section_errors_name_the_dotted_key(cfg, section, key, fragment):
    cfg["nemo_gym"] = section
    message = config_error(cfg)
    assert key in message and fragment in message, message


def test_missing_section_is_an_error_not_a_default(cfg):
    del cfg["nemo_gym"]
    assert "nemo_gym: config_paths is empty" in config_error(cfg)


def test_secret_is_not_printed(cfg):
    cfg["nemo_gym"]["policy_api_key"] = "sk-very-secret"
    cfg["nemo_gym"]["access"] = {"require_key": False}  # with the run's key Gym would not send it (next test)
    rc = load_config(cfg)
    assert "sk-very-secret" not in repr(rc) and rc.gym.policy_api_key.get_secret_value() == "sk-very-secret"


def test_policy_api_key_with_the_run_key_is_refused_naming_the_variable(cfg):
    cfg["nemo_gym"]["policy_api_key"] = "sk-very-secret"
    message = config_error(cfg)
    assert "NGV_ROLLOUT_API_KEY" in message and "access.require_key=false" in message, message
    assert "sk-very-secret" not in message


@pytest.mark.parametrize(
    ("value", "expected"), [("auto", "auto"), (True, "true"), (False, "false"), ("false", "false")]
)
def test_access_section_reads_yaml_booleans(cfg, value, expected):
    cfg["nemo_gym"]["access"] = {"local_only": value}
    access = load_config(cfg).gym.access
    assert (access.require_key, access.local_only) == (True, expected)


def test_access_local_only_names_the_key(cfg):
    cfg["nemo_gym"]["access"] = {"local_only": "sometimes"}
    assert "nemo_gym.access.local_only" in config_error(cfg)


@pytest.mark.parametrize(
    ("access", "head_url"), [({"guard_gym": True, "require_key": False}, None), ({"guard_gym": True}, "http://h:1")]
)
def test_guard_gym_needs_the_run_key_and_a_gym_the_run_starts(cfg, access, head_url):
    cfg["nemo_gym"]["access"] = access
    if head_url:
        cfg["nemo_gym"].update(head_url=head_url, config_paths=[])
    message = config_error(cfg)
    assert "access.guard_gym needs the run's rollout key" in message and "head_url: null" in message, message
