"""The whole recipe config (``recipe.nemo_gym.config.load``): the verl keys the adapter reads, every error naming
its full dotted key, the bad value and a fix, all problems reported together."""

from __future__ import annotations

import copy

import pytest

from recipe.nemo_gym.config.load import DATASET_PATH, MANAGER_CLASS, MANAGER_CLASS_V1, RecipeConfig, load_config
from tests.support.recipe_config import GYM_CONFIG, config_error, minimal_recipe_config


@pytest.fixture
def cfg(tmp_path):
    return minimal_recipe_config(tmp_path)


def test_valid_config_reads_the_verl_keys(cfg):
    rc = load_config(cfg)
    assert isinstance(rc, RecipeConfig)
    assert (rc.prompt_length, rc.response_length, rc.max_model_len, rc.n) == (256, 128, None, 4)
    assert (rc.sampling.temperature, rc.sampling.top_p, rc.sampling.top_k) == (1.0, 1.0, -1)
    assert (rc.val_sampling.temperature, rc.val_sampling.top_p, rc.val_sampling.top_k) == (0.0, 1.0, -1)
    assert rc.gym.config_paths == [GYM_CONFIG]


def test_omegaconf_input_is_accepted(cfg):
    from omegaconf import OmegaConf

    cfg["actor_rollout_ref"]["rollout"]["response_length"] = "${actor_rollout_ref.rollout.prompt_length}"
    rc = load_config(OmegaConf.create(cfg))
    assert rc.response_length == 256


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
    message = config_error(cfg)
    assert key in message and fix in message, message


def test_all_problems_are_reported_together(cfg):
    broken = copy.deepcopy(cfg)
    broken["trainer"]["use_v1"] = "yes"
    broken["nemo_gym"] = {"config_paths": [GYM_CONFIG], "client": {"max_concurrency": -1}}
    broken["actor_rollout_ref"]["rollout"]["n"] = 0
    message = config_error(broken)
    for key in ("trainer.use_v1", "nemo_gym.client.max_concurrency", "actor_rollout_ref.rollout.n"):
        assert key in message


def test_the_manager_class_must_match_the_trainer(cfg):
    cfg["trainer"]["use_v1"] = True  # the legacy manager under the v1 trainer: refused, naming the v1 manager
    message = config_error(cfg)
    assert "agent_loop_manager_class" in message and MANAGER_CLASS_V1 in message, message
    cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] = MANAGER_CLASS_V1
    load_config(cfg)
    cfg["trainer"]["use_v1"] = False
    assert MANAGER_CLASS in config_error(cfg)


def test_rollout_dump_follows_verls_rollout_data_dir_unless_set_or_off(cfg, tmp_path):
    assert load_config(cfg).rollout_dump_dir is None  # off by default
    cfg["trainer"]["rollout_data_dir"] = str(tmp_path / "rollouts")
    assert load_config(cfg).rollout_dump_dir == tmp_path / "rollouts" / "gym"
    cfg["nemo_gym"]["rollout_dump"] = {"dir": str(tmp_path / "mine")}
    assert load_config(cfg).rollout_dump_dir == tmp_path / "mine"
    cfg["nemo_gym"]["rollout_dump"] = {"enable": False}
    assert load_config(cfg).rollout_dump_dir is None
    cfg["nemo_gym"]["rollout_dump"] = {"queue_size": 0}
    assert "nemo_gym.rollout_dump.queue_size" in config_error(cfg)
