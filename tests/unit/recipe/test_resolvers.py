"""The ``${ngv_...}`` resolvers of the shipped configs: each points at what it names, or says what exists instead."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.recipe_config import MANAGER_CLASS, MANAGER_CLASS_V1
from recipe.nemo_gym.resolvers import gym_example_path, manager_class


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
