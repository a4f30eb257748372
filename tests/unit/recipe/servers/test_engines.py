"""The engine verl's ``actor_rollout_ref.rollout.name`` selects: vLLM or SGLang, anything else refused naming the key;
an SGLang run stopped, naming the key, where it cannot start; the managers' patch step checks each engine's report."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from nemo_gym_adapter.errors import AdapterConfigError, ServerError, SetupError
from recipe.nemo_gym.config.checks import ROLLOUT_ENGINES
from recipe.nemo_gym.servers import engines
from recipe.nemo_gym.servers.replicas import patch_replicas


def _config(name: str, device: str = "cuda", patch: bool = True):
    return OmegaConf.create(
        {
            "actor_rollout_ref": {"rollout": {"name": name}},
            "trainer": {"device": device},
            "nemo_gym": {"patch_vllm": patch},
        }
    )


def test_each_supported_name_has_its_engine_and_others_are_refused_naming_the_key():
    assert tuple(engines.ENGINES) == ROLLOUT_ENGINES
    assert engines.engine_of(_config("vllm")).actor_prefix == "vllm_server_"
    sglang = engines.engine_of(_config("sglang"))
    assert (sglang.actor_prefix, sglang.label, sglang.probe_api) == ("sglang_server_", "SGLang", "generate")
    assert sglang.patch.__name__ == "nemo_gym_adapter.sglang.patch"
    with pytest.raises(AdapterConfigError, match=r"actor_rollout_ref.rollout.name='trtllm': .* vllm and sglang"):
        engines.engine_of(_config("trtllm"))


def test_an_sglang_run_that_cannot_start_here_is_stopped_naming_the_key(monkeypatch):
    engines.check_engine_available(_config("vllm", "cpu"))  # vLLM: verl's own import says it
    monkeypatch.setattr(engines.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(SetupError) as e:
        engines.check_engine_available(_config("sglang", "cpu"))
    message = str(e.value)
    assert message.startswith("actor_rollout_ref.rollout.name=sglang cannot start here: trainer.device=cpu")
    assert "SGLang is not installed in this Python" in message and "set actor_rollout_ref.rollout.name=vllm" in message
    monkeypatch.setattr(engines.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(engines, "_installed_version", lambda dist: "0.5.9")
    with pytest.raises(SetupError, match="SGLang 0.5.9 is installed; the token-ID patch supports 0.5.12"):
        engines.check_engine_available(_config("sglang"))
    engines.check_engine_available(_config("sglang", patch=False))  # unpatched: any version may serve
    monkeypatch.setattr(engines, "_installed_version", lambda dist: "0.5.12")
    engines.check_engine_available(_config("sglang"))  # a GPU machine with verl's pin


def _report(backend: str, hook: str = "sglang...OpenAIServingChat._apply_jinja_template"):
    return SimpleNamespace(backend=backend, version="0.5.12", hook=hook, pid=7, node_ip="10.0.0.7")


def test_the_patch_step_logs_each_report_and_refuses_another_engines(monkeypatch, caplog):
    engine = engines.ENGINES["sglang"]
    monkeypatch.setattr(
        engine.patch, "apply_patch_to_actors", lambda handles, assistant_edits, partial_rollouts: [_report("sglang")]
    )
    with caplog.at_level(logging.INFO, logger="recipe.nemo_gym.servers.replicas"):
        (report,) = patch_replicas({"sglang_server_0_0": object()}, engine)
    assert report.backend == "sglang"
    assert (
        "token-ID patch in sglang_server_0_0 (pid 7 on 10.0.0.7): sglang...OpenAIServingChat._apply_jinja_template, SGLang 0.5.12"
        in caplog.text
    )
    monkeypatch.setattr(
        engine.patch, "apply_patch_to_actors", lambda handles, assistant_edits, partial_rollouts: [_report("vllm")]
    )
    with pytest.raises(ServerError, match="actor sglang_server_0_0 reported no SGLang hook"):
        patch_replicas({"sglang_server_0_0": object()}, engine)


@pytest.mark.parametrize("runner", ["v1", "legacy"])
def test_both_task_runners_check_the_engine_before_anything_starts(runner, monkeypatch):
    """The TaskRunner is where verl builds the replicas; the check comes first (before Gym's early Ray head, TQ,
    workers): ``tests/e2e/test_recipe_sglang_cpu.py`` runs the whole start on this machine."""
    if runner == "v1":
        from recipe.nemo_gym.trainer import task_runner_v1 as module

        impl = module.NemoGymTaskRunnerV1Impl()
        monkeypatch.setattr(module, "forbid_ray_auto_init", lambda: None)
        monkeypatch.setattr(module, "check_separate_async", lambda config: None)
    else:
        from recipe.nemo_gym.trainer import task_runner as module

        impl = module.NemoGymTaskRunnerImpl()

    def stop(config):
        raise SetupError("stopped here")

    def started(config):
        raise AssertionError("Gym's early servers started before the engine check")

    monkeypatch.setattr(module, "check_engine_available", stop)
    monkeypatch.setattr(module, "early_gym_servers", started)
    config = OmegaConf.create(
        {"trainer": {"v1": {"trainer_mode": "sync"}}, "actor_rollout_ref": {"rollout": {"name": "sglang"}}}
    )
    with pytest.raises(SetupError, match="stopped here"):
        impl.run(config)


@pytest.mark.parametrize("name", ["vllm", "sglang"])
def test_the_engine_class_is_loaded_by_the_registry_entry_of_the_configs_engine(monkeypatch, name):
    """The TaskRunner loads its engine before Gym's warm launcher starts (the import changes the environment the
    launcher takes): the entry of the config's engine is called, and only it. Fake loaders stand in for verl's."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    calls = []

    class FakeReplica:
        pass

    monkeypatch.setattr(
        RolloutReplicaRegistry,
        "_registry",
        {n: (lambda n=n: calls.append(n) or FakeReplica) for n in ("vllm", "sglang")},
    )
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {"name": name}}})
    assert engines.load_engine_class(cfg) is FakeReplica
    assert calls == [name]
