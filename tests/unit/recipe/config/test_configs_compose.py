"""Every shipped recipe config composes with hydra (verl's ppo_trainer + ours) and passes the recipe's validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from nemo_gym_adapter.errors import AdapterConfigError
from recipe.nemo_gym.config.load import MANAGER_CLASS, MANAGER_CLASS_V1, load_config
from recipe.nemo_gym.config.resolvers import register_resolvers
from recipe.nemo_gym.main import CONFIG_DIR, verl_config_dir, with_verl_searchpath

PRIMARY_CONFIGS = sorted(p.stem for p in Path(CONFIG_DIR).glob("*.yaml"))


@pytest.fixture(autouse=True, scope="module")
def demo_models_named_not_converted(tmp_path_factory):
    """``${ngv_demo_model:<name>}`` resolves to a directory name without converting anything: composing the tool
    model's config converted the 0.5B model (478 MB of wheels, ~65 s; 110 s of a fresh clone's CI in this unit test).
    The name is still checked against the manifests; the real resolver is restored after the module (and converting
    is tested in tests/unit/demo_models/, and by every real-model launch)."""
    from omegaconf import OmegaConf

    from nemo_gym_adapter.demo_models.manifests import MANIFESTS
    from recipe.nemo_gym.config import resolvers

    register_resolvers()
    root = tmp_path_factory.mktemp("demo-models")

    def named_only(name: str) -> str:
        assert name in MANIFESTS, name
        return str(root / name)

    OmegaConf.register_new_resolver("ngv_demo_model", named_only, use_cache=True, replace=True)
    yield
    OmegaConf.register_new_resolver("ngv_demo_model", resolvers.demo_model, use_cache=True, replace=True)


def _compose(name: str, overrides: tuple[str, ...] = ()):
    from hydra import compose, initialize_config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return compose(config_name=name, overrides=with_verl_searchpath(list(overrides)))


def test_the_shipped_configs_are_the_expected_ones():
    assert PRIMARY_CONFIGS == [
        "nemo_gym_cpu",
        "nemo_gym_cpu_latency",
        "nemo_gym_cpu_multi_env",
        "nemo_gym_cpu_qwen_calc",
        "nemo_gym_cpu_qwen_tools",
        "nemo_gym_cpu_qwen_weather",
        "nemo_gym_cpu_smollm2_math",
        "nemo_gym_cpu_toy",
        "nemo_gym_multi_env",
        "nemo_gym_single_env",
    ]


@pytest.mark.parametrize("name", PRIMARY_CONFIGS)
def test_config_composes_and_validates(name):
    cfg = _compose(name)
    recipe = load_config(cfg)  # raises AdapterConfigError naming every bad key
    assert cfg.trainer.use_v1 is True  # verl's v1 (TransferQueue) trainer is the default
    assert cfg.trainer.v1.trainer_mode == "sync"
    assert cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class == MANAGER_CLASS_V1
    assert cfg.algorithm.adv_estimator == "masked_grpo"
    assert cfg.data.custom_cls.path == "pkg://nemo_gym_adapter.data.dataset"
    # verl's own defaults are present underneath ours
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.backend == "naive"
    # verl's rollout_corr/* metrics stay on (decoupled mode): a step with every sample masked is guarded
    assert cfg.algorithm.rollout_correction is not None and not cfg.algorithm.rollout_correction.bypass_mode
    assert recipe.gym.config_paths and recipe.gym.head_url is None
    for f in [cfg.data.train_files] if isinstance(cfg.data.train_files, str) else cfg.data.train_files:
        assert Path(f).is_file(), f


@pytest.mark.parametrize("name", PRIMARY_CONFIGS)
def test_use_v1_false_alone_selects_the_legacy_trainer_and_manager(name):
    from recipe.nemo_gym.main import task_runner_class
    from recipe.nemo_gym.trainer.task_runner import NemoGymTaskRunner
    from recipe.nemo_gym.trainer.task_runner_v1 import NemoGymTaskRunnerV1

    cfg = _compose(name, ("trainer.use_v1=false",))
    load_config(cfg)
    assert cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class == MANAGER_CLASS
    assert task_runner_class(cfg) is NemoGymTaskRunner
    assert task_runner_class(_compose(name)) is NemoGymTaskRunnerV1


def _named_code(node, key: str = "") -> list[str]:
    """Every dotted path a config hands to an importer: each ``_target_``, the manager class, our ``pkg://`` dataset,
    the external modules verl imports in its workers (``VERL_USE_EXTERNAL_MODULES``)."""
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _named_code(v, str(k))]
    if isinstance(node, list):
        return [p for v in node for p in _named_code(v, key)]
    if not isinstance(node, str):
        return []
    if key in ("_target_", "agent_loop_manager_class"):
        return [node]
    if key == "VERL_USE_EXTERNAL_MODULES":
        return node.split(",")
    return [node.removeprefix("pkg://")] if node.startswith("pkg://") else []


@pytest.mark.parametrize("name", PRIMARY_CONFIGS)
def test_every_class_and_module_a_config_names_imports_by_its_own_path(name):
    """Hydra's ``_target_``s, the manager classes of both trainers, our dataset and the CPU backend's modules: each
    imports, by the path the config writes (no moved-module warning: shipped configs name the new rooms)."""
    import warnings

    from hydra._internal.utils import _locate
    from omegaconf import OmegaConf

    named: set[str] = set()
    for overrides in ((), ("trainer.use_v1=false",)):
        named.update(_named_code(OmegaConf.to_container(_compose(name, overrides), resolve=True)))
    assert {MANAGER_CLASS, MANAGER_CLASS_V1, "nemo_gym_adapter.data.dataset"} <= named
    assert any(path.startswith("verl.") for path in named)  # verl's own _target_s are read too
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        for path in sorted(named):
            assert _locate(path) is not None, path


def test_overrides_reach_the_validated_config():
    recipe = load_config(_compose("nemo_gym_cpu", ("actor_rollout_ref.rollout.n=8", "nemo_gym.patch_vllm=false")))
    assert recipe.n == 8 and recipe.gym.patch_vllm is False


def test_a_micro_batch_the_composed_batch_cannot_split_into_is_refused_naming_the_key():
    """The latency config once shipped micro-batches of 64 for 4 rows x 4 samples: verl's engine asserted at step 1's
    first log-prob, minutes into the launch. Now load_config names the key before anything starts."""
    cfg = _compose("nemo_gym_cpu_latency", ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",))
    with pytest.raises(AdapterConfigError, match=r"log_prob_micro_batch_size_per_gpu=64: .* = 16 samples"):
        load_config(cfg)


def test_yaml_section_spells_out_every_key_with_its_default():
    """Every nemo_gym key is in the YAML (overridable without hydra's `+`), with the typed config's default."""
    from omegaconf import OmegaConf

    from nemo_gym_adapter.config import NemoGymConfig

    section = OmegaConf.to_container(_compose("nemo_gym_single_env").nemo_gym, resolve=True)
    defaults = NemoGymConfig.model_validate({"config_paths": section["config_paths"]}).model_dump()
    defaults["policy_api_key"] = "EMPTY"
    assert section == defaults


def test_multi_env_config_mixes_environments():
    from nemo_gym_adapter.data.dataset import load_gym_jsonl

    cfg = _compose("nemo_gym_multi_env")
    rows = load_gym_jsonl(list(cfg.data.train_files), known_agents=set(cfg.data.nemo_gym.known_agents))
    assert {r.env_name for r in rows} == set(cfg.data.nemo_gym.known_agents)
    assert len(cfg.nemo_gym.config_paths) == 2


def test_cpu_config_carries_the_cpu_actor_settings():
    """configs/nemo_gym_cpu.yaml must set exactly what recipe.nemo_gym.cpu.platform measured as needed on CPU."""
    from omegaconf import OmegaConf

    from recipe.nemo_gym.cpu import platform as cpu_platform

    cfg = _compose("nemo_gym_cpu")
    for override in cpu_platform.CPU_ACTOR_OVERRIDES:
        key, value = override.lstrip("+").split("=", 1)
        expected = {"true": True, "false": False}.get(value, value)
        assert OmegaConf.select(cfg, key) == expected, key
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert env.VERL_USE_EXTERNAL_MODULES.split(",")[0] == cpu_platform.__name__
    assert {k: env[k] for k in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE")} == {
        k: cpu_platform.CPU_ENV[k] for k in ("VERL_PLATFORM", "VERL_ENGINE_DEVICE")
    }
    assert cfg.ray_kwargs.ray_init.address == "local"  # never join a colleague's cluster


def test_a_broken_override_is_reported_with_its_key():
    from nemo_gym_adapter.errors import AdapterConfigError

    with pytest.raises(AdapterConfigError, match=r"actor_rollout_ref\.rollout\.name='trtllm'"):
        load_config(_compose("nemo_gym_single_env", ("actor_rollout_ref.rollout.name=trtllm",)))


@pytest.mark.parametrize("name", PRIMARY_CONFIGS)
def test_rollout_name_sglang_composes_and_stops_where_the_engine_is_needed_on_this_machine(name):
    """``actor_rollout_ref.rollout.name=sglang`` alone: every shipped config composes and validates with it (the base
    sets what SGLang needs), the managers' engine is SGLang's, and on a machine without SGLang (or on the CPU backend)
    the TaskRunner's check before verl builds the replicas stops with one message naming the key."""
    import importlib.util

    from nemo_gym_adapter.errors import SetupError
    from recipe.nemo_gym.servers.engines import check_engine_available, engine_of

    cfg = _compose(name, ("actor_rollout_ref.rollout.name=sglang",))
    assert load_config(cfg).rollout_name == "sglang"
    assert cfg.actor_rollout_ref.rollout.skip_tokenizer_init is False
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.sglang.tool_call_parser == "qwen"
    assert engine_of(cfg).actor_prefix == "sglang_server_"
    cpu = cfg.trainer.device == "cpu"
    if not cpu and importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed here: a GPU config may start")
    with pytest.raises(SetupError, match="actor_rollout_ref.rollout.name=sglang cannot start here") as e:
        check_engine_available(cfg)
    assert ("trainer.device=cpu" in str(e.value)) == cpu
    check_engine_available(_compose(name))  # vLLM, as shipped: nothing to stop


def test_verl_config_dir_is_found_without_importing_verl():
    assert (verl_config_dir() / "ppo_trainer.yaml").is_file()
    assert with_verl_searchpath(["hydra.searchpath=[file:///x]"]) == ["hydra.searchpath=[file:///x]"]


def test_toy_demo_config_runs_only_the_toy_environment():
    """The README demo switches environments: the parent's agent override must be gone, every row must route to the
    toy agent, and the run must log to a file (the reward curve is drawn from it)."""
    from nemo_gym_adapter.data.dataset import load_gym_jsonl

    cfg = _compose("nemo_gym_cpu_toy")
    recipe = load_config(cfg)
    assert recipe.gym.config_overrides == {}
    assert [Path(p).name for p in recipe.gym.config_paths] == ["toy_choice.yaml"]
    rows = load_gym_jsonl([cfg.data.train_files], default_agent=cfg.data.nemo_gym.default_agent)
    assert rows and {r.env_name for r in rows} == {"toy_choice_simple_agent"}
    assert "file" in cfg.trainer.logger
    assert cfg.actor_rollout_ref.rollout.logprobs_mode == "raw_logprobs"


def test_null_drops_an_inherited_gym_override():
    recipe = load_config(
        _compose("nemo_gym_cpu", ("nemo_gym.config_overrides.example_single_tool_call_simple_agent=null",))
    )
    assert recipe.gym.config_overrides == {}
    assert load_config(_compose("nemo_gym_cpu")).gym.config_overrides  # and without it, the override is there


def test_cpu_multi_env_config_routes_three_ways_and_samples_half_and_half():
    """configs/nemo_gym_cpu_multi_env.yaml: rows route by agent_ref (dict and string) and task_source, all to the
    two toy agents, and the training sampler gives each environment half of every batch."""
    import json
    from collections import Counter

    from omegaconf import OmegaConf

    from nemo_gym_adapter.data.dataset import GymJsonlDataset
    from recipe.nemo_gym.trainer.task_runner import train_sampler

    cfg = _compose("nemo_gym_cpu_multi_env")
    OmegaConf.resolve(cfg)
    forms = set()
    for f in cfg.data.train_files:
        row = json.loads(Path(f).read_text().splitlines()[0])
        ref = row.get("agent_ref")
        forms.add("task_source" if ref is None else type(ref).__name__)
    assert forms == {"dict", "str", "task_source"}
    dataset = GymJsonlDataset(list(cfg.data.train_files), config=cfg.data)
    assert dataset.env_names == ["toy_choice_simple_agent", "toy_lookup_simple_agent"]
    sampler = train_sampler(cfg, dataset, default=None)
    indices = list(sampler)
    b = cfg.data.train_batch_size
    for start in range(0, len(indices), b):
        envs = Counter(dataset[i]["gym_env"] for i in indices[start : start + b])
        assert envs == {"toy_choice_simple_agent": b // 2, "toy_lookup_simple_agent": b // 2}
    assert train_sampler(_compose("nemo_gym_cpu"), dataset, default=lambda *a: "verl's") == "verl's"


@pytest.mark.parametrize("name", PRIMARY_CONFIGS)
def test_gpu_configs_checkpoint_and_resume_and_cpu_configs_start_fresh(name):
    """The GPU configs save checkpoints a relaunch continues from (docs/LONG_RUNS.md); the CPU ones (the demo, the
    tests) start fresh every time, never from a checkpoint some earlier run left under checkpoints/."""
    trainer = _compose(name).trainer
    if trainer.device == "cpu":
        assert (trainer.save_freq, trainer.resume_mode) == (-1, "disable")
    else:
        assert trainer.save_freq > 0 and trainer.resume_mode == "auto" and trainer.max_actor_ckpt_to_keep >= 1
        assert trainer.default_local_dir == f"checkpoints/{trainer.project_name}/{trainer.experiment_name}"


def test_a_bad_row_stops_the_run_before_anything_starts(tmp_path, capsys):
    from recipe.nemo_gym.main import check_rows, run

    for name in PRIMARY_CONFIGS:  # the shipped rows pass, their paths interpolated (${ngv_configs:...})
        check_rows(_compose(name))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"responses_create_params": {"input": "hi"}}\n{"responses_create_params": {"input": 7}}\n')
    cfg = _compose("nemo_gym_cpu", (f"data.train_files=[{bad}]",))
    assert run(cfg) == 2  # returns before Ray, verl or Gym is touched
    assert f"{bad}:2" in capsys.readouterr().err


def test_the_latency_config_points_gym_at_our_own_server():
    """``nemo_gym_cpu_latency`` starts our toy_latency server (gym_servers/), which Gym finds under
    NEMO_GYM_EXTRA_ROOTS: the root holds the server Gym will look for, with its requirements file (Gym's marker)."""
    cfg = _compose("nemo_gym_cpu_latency")
    root = Path(cfg.nemo_gym.env.NEMO_GYM_EXTRA_ROOTS)
    server = root / "resources_servers" / "toy_latency"
    assert (server / "app.py").is_file() and (server / "requirements.txt").is_file()
    latency = cfg.nemo_gym.config_overrides.toy_latency.resources_servers.toy_latency.tool_latency_s
    assert latency >= 0


@pytest.mark.parametrize(("name", "peak"), [("nemo_gym_cpu_qwen_weather", 19.8), ("nemo_gym_cpu_qwen_calc", 21.4)])
def test_the_tool_model_configs_pick_their_rollout_dtype_from_the_cpu_with_their_measured_peak(name, peak):
    """``dtype: auto`` with the bfloat16 peak each measured (recipe.nemo_gym.cpu.dtype decides; its tests say how);
    the other CPU configs set float32, which auto never overrides."""
    cfg = _compose(name)
    assert cfg.actor_rollout_ref.rollout.dtype == "auto"
    assert load_config(cfg).gym.auto_dtype.bf16_peak_gib == peak
    assert _compose("nemo_gym_cpu_qwen_tools").actor_rollout_ref.rollout.dtype == "float32"
