"""The recipe config: defaults complete, every error names its full dotted key, the bad value and a fix."""

from __future__ import annotations

import copy

import pytest

from nemo_gym_adapter.config import (
    DATASET_PATH,
    MANAGER_CLASS,
    MANAGER_CLASS_V1,
    NemoGymConfig,
    RecipeConfig,
    load_config,
    parse_section,
)
from nemo_gym_adapter.errors import AdapterConfigError
from tests.support.recipe_config import GYM_CONFIG, minimal_recipe_config


@pytest.fixture
def cfg(tmp_path):
    return minimal_recipe_config(tmp_path)


def _error(cfg) -> str:
    with pytest.raises(AdapterConfigError) as e:
        load_config(cfg)
    return str(e.value)


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


def test_valid_config_reads_the_verl_keys(cfg):
    rc = load_config(cfg)
    assert isinstance(rc, RecipeConfig)
    assert (rc.prompt_length, rc.response_length, rc.max_model_len, rc.n) == (256, 128, None, 4)
    assert (rc.temperature, rc.top_p, rc.val_temperature, rc.val_top_p) == (1.0, 1.0, 0.0, 1.0)
    assert rc.gym.config_paths == [GYM_CONFIG]


def test_omegaconf_input_is_accepted(cfg):
    from omegaconf import OmegaConf

    cfg["actor_rollout_ref"]["rollout"]["response_length"] = "${actor_rollout_ref.rollout.prompt_length}"
    rc = load_config(OmegaConf.create(cfg))
    assert rc.response_length == 256


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
    message = _error(cfg)
    assert key in message and fragment in message, message


@pytest.mark.parametrize(
    ("path", "value", "key", "fix"),
    [
        ("trainer.use_v1", "yes", "trainer.use_v1='yes'", "must be true"),
        ("algorithm.adv_estimator", "gae", "algorithm.adv_estimator='gae'", "masked_grpo"),
        ("actor_rollout_ref.rollout.name", "trtllm", "actor_rollout_ref.rollout.name='trtllm'", "vllm and sglang"),
        (
            "actor_rollout_ref.rollout.agent.agent_loop_manager_class",
            None,
            "agent_loop_manager_class=None",
            MANAGER_CLASS,
        ),
        ("actor_rollout_ref.rollout.response_length", 0, "actor_rollout_ref.rollout.response_length=0", ">= 1"),
        ("actor_rollout_ref.rollout.n", "4", "actor_rollout_ref.rollout.n='4'", "integer"),
        ("actor_rollout_ref.rollout.max_model_len", 1, "actor_rollout_ref.rollout.max_model_len=1", ">= 2"),
        ("actor_rollout_ref.rollout.temperature", -1, "actor_rollout_ref.rollout.temperature=-1", ">= 0"),
        ("data.custom_cls.path", None, "data.custom_cls.path=None", DATASET_PATH),
        ("data.val_files", "/nope.jsonl", "data.val_files[0]='/nope.jsonl'", "no such file"),
    ],
)
def test_verl_key_errors_name_the_dotted_key(cfg, path, value, key, fix):
    node = cfg
    *parents, leaf = path.split(".")
    for part in parents:
        node = node[part]
    node[leaf] = value
    message = _error(cfg)
    assert key in message and fix in message, message


def test_all_problems_are_reported_together(cfg):
    broken = copy.deepcopy(cfg)
    broken["trainer"]["use_v1"] = "yes"
    broken["nemo_gym"] = {"config_paths": [GYM_CONFIG], "client": {"max_concurrency": -1}}
    broken["actor_rollout_ref"]["rollout"]["n"] = 0
    message = _error(broken)
    for key in ("trainer.use_v1", "nemo_gym.client.max_concurrency", "actor_rollout_ref.rollout.n"):
        assert key in message


def test_missing_section_is_an_error_not_a_default(cfg):
    del cfg["nemo_gym"]
    assert "nemo_gym: config_paths is empty" in _error(cfg)


def test_secret_is_not_printed(cfg):
    cfg["nemo_gym"]["policy_api_key"] = "sk-very-secret"
    cfg["nemo_gym"]["access"] = {"require_key": False}  # with the run's key Gym would not send it (next test)
    rc = load_config(cfg)
    assert "sk-very-secret" not in repr(rc) and rc.gym.policy_api_key.get_secret_value() == "sk-very-secret"


def test_policy_api_key_with_the_run_key_is_refused_naming_the_variable(cfg):
    cfg["nemo_gym"]["policy_api_key"] = "sk-very-secret"
    message = _error(cfg)
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
    assert "nemo_gym.access.local_only" in _error(cfg)


def test_the_manager_class_must_match_the_trainer(cfg):
    cfg["trainer"]["use_v1"] = True  # the legacy manager under the v1 trainer: refused, naming the v1 manager
    message = _error(cfg)
    assert "agent_loop_manager_class" in message and MANAGER_CLASS_V1 in message, message
    cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] = MANAGER_CLASS_V1
    load_config(cfg)
    cfg["trainer"]["use_v1"] = False
    assert MANAGER_CLASS in _error(cfg)


def test_sglang_is_a_rollout_engine_with_its_tokenizer_on(cfg):
    rollout = cfg["actor_rollout_ref"]["rollout"]
    assert load_config(cfg).rollout_name == "vllm"
    rollout["name"] = "sglang"
    message = _error(cfg)  # verl's default skip_tokenizer_init (true) leaves SGLang's chat endpoint without one
    assert "actor_rollout_ref.rollout.skip_tokenizer_init=True: must be false with rollout.name=sglang" in message
    rollout["skip_tokenizer_init"] = False
    assert load_config(cfg).rollout_name == "sglang"
    rollout["disaggregation"] = {"enabled": True}
    assert "actor_rollout_ref.rollout.disaggregation.enabled=True" in _error(cfg)
    rollout["name"] = "vllm"  # the SGLang rules are SGLang's only
    rollout["skip_tokenizer_init"] = True
    assert load_config(cfg).rollout_name == "vllm"


def test_split_needs_the_v1_trainer(cfg):
    """``contiguity: split`` puts several samples per rollout, which only verl's v1 trainer takes (issue 19)."""
    cfg["nemo_gym"]["trajectory"] = {"contiguity": "split"}
    cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] = MANAGER_CLASS_V1
    cfg["trainer"]["use_v1"] = True
    assert load_config(cfg).gym.trajectory.contiguity == "split"
    cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] = MANAGER_CLASS
    cfg["trainer"]["use_v1"] = False
    message = _error(cfg)
    assert "nemo_gym.trajectory.contiguity='split'" in message and "trainer.use_v1=true" in message, message
    cfg["nemo_gym"]["trajectory"] = {"contiguity": "truncate"}
    load_config(cfg)


def test_group_filtering_is_refused_on_the_legacy_trainer_naming_the_key(cfg):
    cfg["algorithm"]["filter_groups"] = {"enable": True, "metric": "gym_outcome"}
    message = _error(cfg)  # cfg is the legacy trainer's
    assert "algorithm.filter_groups.enable=true" in message and "trainer.use_v1=true" in message, message
    cfg["trainer"]["use_v1"] = True
    cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] = MANAGER_CLASS_V1
    assert load_config(cfg).filter_groups_metric == "gym_outcome"
    cfg["algorithm"]["filter_groups"]["enable"] = False
    assert load_config(cfg).filter_groups_metric is None


@pytest.mark.parametrize("metric", ["reward", None])
def test_group_filtering_on_rm_scores_is_refused_masked_samples_would_decide(cfg, metric):
    cfg["trainer"]["use_v1"] = True
    cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] = MANAGER_CLASS_V1
    cfg["algorithm"]["filter_groups"] = {"enable": True, "metric": metric}
    message = _error(cfg)
    assert f"algorithm.filter_groups.metric={metric!r}" in message and "gym_outcome" in message, message


def test_rollout_dump_follows_verls_rollout_data_dir_unless_set_or_off(cfg, tmp_path):
    assert load_config(cfg).rollout_dump_dir is None  # off by default
    cfg["trainer"]["rollout_data_dir"] = str(tmp_path / "rollouts")
    assert load_config(cfg).rollout_dump_dir == tmp_path / "rollouts" / "gym"
    cfg["nemo_gym"]["rollout_dump"] = {"dir": str(tmp_path / "mine")}
    assert load_config(cfg).rollout_dump_dir == tmp_path / "mine"
    cfg["nemo_gym"]["rollout_dump"] = {"enable": False}
    assert load_config(cfg).rollout_dump_dir is None
    cfg["nemo_gym"]["rollout_dump"] = {"queue_size": 0}
    assert "nemo_gym.rollout_dump.queue_size" in _error(cfg)


@pytest.mark.parametrize("estimator", ["masked_grpo", "grpo", "rloo", "opo"])
def test_masked_grpo_and_verls_outcome_estimators_are_accepted(cfg, estimator):
    cfg["algorithm"]["adv_estimator"] = estimator
    assert load_config(cfg).adv_estimator == estimator


def test_gdpo_on_the_legacy_trainer_reads_its_keys(cfg):
    cfg["algorithm"].update(adv_estimator="gdpo", gdpo_reward_keys=["correctness", "format"])
    rc = load_config(cfg)
    assert rc.adv_estimator == "gdpo" and rc.gdpo_reward_keys == ["correctness", "format"]


def test_gdpo_on_the_v1_trainer_is_a_start_up_error_naming_the_key(cfg):
    cfg["algorithm"].update(adv_estimator="gdpo", gdpo_reward_keys=["correctness"])
    cfg["trainer"]["use_v1"] = True
    cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] = MANAGER_CLASS_V1
    message = _error(cfg)
    assert "algorithm.adv_estimator='gdpo'" in message and "trainer.use_v1=false" in message, message
    assert "_compute_advantage" in message, message


@pytest.mark.parametrize("keys", [None, [], [""]])
def test_gdpo_without_reward_keys_is_a_start_up_error(cfg, keys):
    cfg["algorithm"].update(adv_estimator="gdpo", gdpo_reward_keys=keys)
    message = _error(cfg)
    assert "algorithm.gdpo_reward_keys=" in message and "reward_components" in message, message


def test_split_rollouts_need_an_estimator_that_counts_a_session_once(cfg):
    cfg["nemo_gym"]["trajectory"] = {"contiguity": "split"}
    cfg["trainer"]["use_v1"] = True
    cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] = MANAGER_CLASS_V1
    cfg["algorithm"]["adv_estimator"] = "rloo"
    message = _error(cfg)
    assert "algorithm.adv_estimator='rloo'" in message and "contiguity='split'" in message, message
    for estimator in ("grpo", "masked_grpo"):
        cfg["algorithm"]["adv_estimator"] = estimator
        load_config(cfg)
