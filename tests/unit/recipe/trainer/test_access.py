"""``recipe.nemo_gym.trainer.access.prepare_access``: what a run decides about Ray before ``ray.init`` -- a Ray it starts comes
up without Ray's dashboard web UI and metrics exporters unless ``nemo_gym.access.ray_dashboard`` asks for them
(``access.listen.ray_exporters_env``), a cluster it joins keeps its own; the driver's environment is put back when
the run ends."""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf

from nemo_gym_adapter.access import listen
from recipe.nemo_gym.config.load import load_config
from recipe.nemo_gym.trainer.access import prepare_access
from tests.support.recipe_config import minimal_recipe_config

EXPORTER_VARS = tuple(listen.RAY_EXPORTERS_OFF_ENV)


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*EXPORTER_VARS, *listen.RAY_AUTH_VARS, listen.LOCAL_ONLY_VAR, "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)


def _prepare(tmp_path, address: str = "local", **access):
    raw = minimal_recipe_config(tmp_path)
    raw["ray_kwargs"] = {"ray_init": {"address": address}}
    raw["nemo_gym"]["access"] = access
    cfg = OmegaConf.create(raw)
    return cfg, prepare_access(cfg, load_config(cfg))


def test_a_ray_the_run_starts_has_no_dashboard_and_no_metrics_exporters_by_default(tmp_path, clean_env):
    cfg, access = _prepare(tmp_path)
    try:
        assert cfg.ray_kwargs.ray_init.include_dashboard is False
        assert {name: os.environ.get(name) for name in EXPORTER_VARS} == listen.RAY_EXPORTERS_OFF_ENV
    finally:
        access.restore()
    assert not {name for name in EXPORTER_VARS if name in os.environ}  # the driver's environment as it was


def test_asked_for_they_are_rays_defaults_and_a_joined_cluster_keeps_its_own(tmp_path, clean_env):
    cfg, access = _prepare(tmp_path, ray_dashboard=True)
    access.restore()
    assert OmegaConf.select(cfg, "ray_kwargs.ray_init.include_dashboard") is None
    assert not {name for name in EXPORTER_VARS if name in os.environ}
    cfg, access = _prepare(tmp_path, address="10.0.0.1:6379")  # not the run's Ray: nothing to decide there
    try:
        assert OmegaConf.select(cfg, "ray_kwargs.ray_init.include_dashboard") is None
        assert not {name for name in EXPORTER_VARS if name in os.environ}
    finally:
        access.restore()
