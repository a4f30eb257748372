"""The GPU recipes of Gym's integration criteria (``configs/gpu/``, docs/GPU_RECIPES.md) on CPU: each composes, passes
the launch's start-up checks -- ours (``load_config``, every row through ``check_rows``) and verl's own
``validate_config``, what ``recipe.nemo_gym.main.run`` does before Ray, Gym or an engine starts -- with its data files
absent (they come from Gym's dataset tooling on the GPU machine) and with rows in the form Gym's ``gym dataset
collate`` writes, built here from the environment's bundled examples. The sizes are held to what Gym's criteria ask:
its named model, enough epochs of the rows Gym declares for the steps, a context that holds the trajectory budget."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nemo_gym_adapter.errors import AdapterConfigError
from recipe.nemo_gym.config.load import load_config
from recipe.nemo_gym.config.resolvers import gym_example_path, register_resolvers
from recipe.nemo_gym.main import CONFIG_DIR, check_rows, with_verl_searchpath

GPU_RECIPES = sorted(f"gpu/{p.stem}" for p in (Path(CONFIG_DIR) / "gpu").glob("*.yaml"))


@dataclass(frozen=True)
class Criterion:
    """What Gym's integration page asks of a recipe, and the Gym environment it runs."""

    env: str  # resources server (its bundled data/example.jsonl stands in for the downloaded rows)
    gym_config: str  # Gym-relative config the recipe starts and `gym dataset collate` reads
    agent: str  # the agent instance that config declares the datasets on: collate's task_source
    min_steps: int
    val_collated: bool = True  # False: validation reads a prepare script's rows (no task_source) directly


CRITERIA = {
    "gpu/dapo17k_qwen3_4b": Criterion(
        "math_with_judge",
        "resources_servers/math_with_judge/configs/dapo17k.yaml",
        "math_with_judge_simple_agent",
        1000,
        val_collated=False,
    ),
    "gpu/workplace_assistant_qwen3_4b": Criterion(
        "workplace_assistant",
        "resources_servers/workplace_assistant/configs/workplace_assistant.yaml",
        "workplace_assistant_simple_agent",
        100,
    ),
}
GYM_MODEL = "Qwen/Qwen3-4B-Instruct-2507"  # the base model of both criteria


def _compose(name: str, overrides: tuple[str, ...] = ()):
    from hydra import compose, initialize_config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=name, overrides=with_verl_searchpath(list(overrides)))


def _gym_root() -> Path:
    """The installed Gym's package root (where ``resources_servers/`` is), as the recipe finds it."""
    from nemo_gym_adapter.gym.launch import gym_package_root
    from nemo_gym_adapter.runtime import paths

    return gym_package_root(paths.gym_venv())


def _gym_config(criterion: Criterion):
    return OmegaConf.load(_gym_root() / criterion.gym_config)


def _declared(criterion: Criterion, kind: str):
    """The dataset of ``kind`` (train, validation) the Gym config declares on its agent."""
    agent = _gym_config(criterion)[criterion.agent].responses_api_agents.simple_agent
    (dataset,) = [d for d in agent.datasets if d.type == kind]
    return dataset


def _declared_rows(criterion: Criterion, kind: str) -> int:
    """The rows of that dataset as Gym 0.7 records them next to it (``<jsonl stem>_metrics.json``, written by the
    collate step that prepared Gym's own copy)."""
    jsonl = _gym_root() / _declared(criterion, kind).jsonl_fpath
    metrics = json.loads(jsonl.with_name(f"{jsonl.stem}_metrics.json").read_text())
    return int(metrics["Number of examples"])


def _example_rows(criterion: Criterion, path: Path, *, collated: bool = True) -> Path:
    """The environment's bundled example rows, as `gym dataset collate` writes them (each stamped ``task_source`` with
    the declaring agent, any ``agent_ref`` stripped; run on Gym 0.7 here: docs/GPU_RECIPES.md) or, ``collated=False``,
    as they come (Gym's prepare scripts write neither field)."""
    rows = [json.loads(line) for line in Path(gym_example_path(criterion.env)).read_text().splitlines() if line]
    for row in rows:
        row.pop("agent_ref", None)
        if collated:
            row["task_source"] = criterion.agent
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_the_gpu_recipes_are_the_expected_ones():
    assert GPU_RECIPES == sorted(CRITERIA)


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_recipe_composes_at_the_top_level_and_passes_the_start_up_checks_without_its_data(name):
    cfg = _compose(name)
    assert "gpu" not in cfg  # `# @package _global_`: without it hydra nests the file under gpu:
    recipe = load_config(cfg, check_files=False)  # raises AdapterConfigError naming every bad key
    criterion = CRITERIA[name]
    assert recipe.gym.config_paths == [criterion.gym_config]
    assert recipe.model_path == GYM_MODEL
    assert cfg.data.nemo_gym.known_agents == [criterion.agent]
    assert (cfg.trainer.device, cfg.trainer.nnodes, cfg.trainer.n_gpus_per_node) == ("cuda", 1, 8)
    assert cfg.trainer.total_training_steps >= criterion.min_steps
    steps_per_epoch = _declared_rows(criterion, "train") // cfg.data.train_batch_size  # verl: floor, drop_last
    assert steps_per_epoch * cfg.trainer.total_epochs >= cfg.trainer.total_training_steps
    assert recipe.max_model_len == recipe.prompt_length + recipe.response_length
    validation = _declared(criterion, "validation")  # samples per problem: as Gym declares them (AIME24: mean@32)
    assert cfg.actor_rollout_ref.rollout.val_kwargs.n == validation.get("num_repeats", 1)
    if not criterion.val_collated:  # the prepare script's rows, at the path the Gym config declares
        assert cfg.data.val_files == validation.jsonl_fpath
    assert recipe.gym.client.max_concurrency >= cfg.data.train_batch_size * recipe.n  # a whole step in flight
    assert cfg.trainer.save_freq > 0 and cfg.trainer.resume_mode == "auto"
    assert "file" in cfg.trainer.logger  # metrics.jsonl for recipe.nemo_gym.reporting


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_the_launch_names_the_missing_data_files(name):
    with pytest.raises(AdapterConfigError) as e:
        load_config(_compose(name))
    assert "data.train_files[0]=" in str(e.value) and "data.val_files[0]=" in str(e.value)
    assert "no such file" in str(e.value)


@pytest.mark.filterwarnings("ignore:Disabled critic:UserWarning")  # verl's note that GRPO needs no critic
@pytest.mark.parametrize("name", GPU_RECIPES)
def test_rows_as_gyms_tools_write_them_pass_every_check_before_the_engines(name, tmp_path):
    """With data in collate's form the launch's checks all pass: ours, each row routed to the recipe's agent, verl's
    own ``validate_config`` (batch divisibility, micro-batch keys, sampling) on the resolved config."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    criterion = CRITERIA[name]
    train = _example_rows(criterion, tmp_path / "train.jsonl")
    val = _example_rows(criterion, tmp_path / "validation.jsonl", collated=criterion.val_collated)
    cfg = _compose(name, (f"data.train_files={train}", f"data.val_files={val}"))
    load_config(cfg)
    check_rows(cfg)
    OmegaConf.resolve(cfg)
    validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    assert not need_reference_policy(cfg) and not need_critic(cfg)  # no KL, GRPO: the actor and the replicas only


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_control_rows_of_another_environment_are_refused(name, tmp_path):
    from nemo_gym_adapter.errors import DatasetError

    other = Criterion("example_single_tool_call", "", "example_single_tool_call_simple_agent", 0)
    rows = _example_rows(other, tmp_path / "other.jsonl")
    with pytest.raises(DatasetError, match="example_single_tool_call_simple_agent"):
        check_rows(_compose(name, (f"data.train_files={rows}",)))


@pytest.mark.parametrize("name", GPU_RECIPES)
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 3),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 5),
    ],
)
def test_control_a_micro_batch_the_recipes_batch_cannot_split_into_is_refused(name, key, value):
    with pytest.raises(AdapterConfigError, match=rf"{key}={value}: a worker's batch is"):
        load_config(_compose(name, (f"{key}={value}",)), check_files=False)


@pytest.mark.parametrize("name", GPU_RECIPES)
def test_the_gym_config_the_recipe_starts_has_no_value_left_unset(name):
    """Gym refuses a config with a ``???`` left after merging (Gym 0.7's dapo17k.yaml leaves its judge's server
    unset): the recipe's ``config_overrides`` fill every one, and the agent its rows route to is declared there."""
    criterion = CRITERIA[name]
    gym = _gym_config(criterion)
    assert criterion.agent in gym
    merged = OmegaConf.merge(gym, OmegaConf.create(OmegaConf.to_container(_compose(name).nemo_gym.config_overrides)))
    assert OmegaConf.missing_keys(merged) == set()


def test_control_dapo17k_without_the_recipes_override_leaves_the_judge_unset():
    gym = _gym_config(CRITERIA["gpu/dapo17k_qwen3_4b"])
    assert OmegaConf.missing_keys(gym) == {"math_with_judge.resources_servers.math_with_judge.judge_model_server.name"}
