"""The ``${ngv_...}`` resolvers of the shipped configs: each points at what it names, or says what exists instead."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.errors import AdapterConfigError
from recipe.nemo_gym.config.load import MANAGER_CLASS, MANAGER_CLASS_V1
from recipe.nemo_gym.config.resolvers import cpu_threads, gym_example_path, manager_class


def test_gym_example_resolver_points_into_the_gym_install(tmp_path, monkeypatch):
    site = tmp_path / "venv" / "lib" / "python3.13" / "site-packages"
    (site / "nemo_gym").mkdir(parents=True)
    example = site / "resources_servers" / "toy" / "data" / "example.jsonl"
    example.parent.mkdir(parents=True)
    example.write_text("{}\n")
    monkeypatch.setenv("NGV_GYM_VENV", str(tmp_path / "venv"))
    assert gym_example_path("toy") == str(example)
    with pytest.raises(AdapterConfigError, match=r"ngv_gym_example:tyo.*\['toy'\]"):
        gym_example_path("tyo")


def test_the_manager_resolver_follows_trainer_use_v1():
    assert [manager_class(v) for v in (True, False, "false", "True")] == [
        MANAGER_CLASS_V1,
        MANAGER_CLASS,
        MANAGER_CLASS,
        MANAGER_CLASS_V1,
    ]


def test_cpu_threads_are_every_core_when_generation_and_update_take_turns_and_half_when_they_overlap(monkeypatch):
    import psutil

    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 8 if logical else 4)
    assert cpu_threads(True, "sync") == "4"
    assert cpu_threads("false", "separate_async") == "4"  # the legacy trainer is sync whatever v1's mode says
    assert cpu_threads(True, "colocate_async") == "2"
    assert cpu_threads(True, "separate_async") == "2"
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 1)
    assert cpu_threads(True, "separate_async") == "1"  # never 0


def test_the_cpu_configs_give_ray_workers_their_threads_from_the_trainer_mode():
    """Ray's default (one thread per worker without a whole CPU) is what the config replaces; the value follows the
    mode the launch selects."""
    from tests.unit.recipe.config.test_configs_compose import _compose

    env = _compose("nemo_gym_cpu").ray_kwargs.ray_init.runtime_env.env_vars
    assert env.OMP_NUM_THREADS == cpu_threads(True, "sync")
    env = _compose("nemo_gym_cpu", ("trainer.v1.trainer_mode=separate_async",)).ray_kwargs.ray_init.runtime_env.env_vars
    assert env.OMP_NUM_THREADS == cpu_threads(True, "separate_async")
