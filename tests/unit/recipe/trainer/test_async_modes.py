"""Unit tests of the async trainer modes' start-up checks (``recipe.nemo_gym.trainer.async_modes``): configs only, verl's
checkpoint-engine registry with a fake engine registered for the test."""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf

from recipe.nemo_gym.trainer.async_modes import (
    check_separate_async,
    quiet_separate_async_info_log,
    warn_unguarded_aborts,
)


@pytest.mark.parametrize(
    ("mode", "patch", "warned"),
    [
        ("colocate_async", False, True),
        ("separate_async", False, True),
        ("colocate_async", True, False),
        ("sync", False, False),
    ],
)
def test_an_async_mode_without_the_patch_warns_that_aborted_turns_go_undetected(mode, patch, warned, caplog):
    config = OmegaConf.create({"trainer": {"v1": {"trainer_mode": mode}}, "nemo_gym": {"patch_vllm": patch}})
    with caplog.at_level("WARNING", logger="recipe.nemo_gym.trainer.async_modes"):
        assert warn_unguarded_aborts(config) is warned
    assert ("nemo_gym.patch_vllm=false" in caplog.text) is warned


def _separate_async(**over: Any) -> Any:
    """A config as ``trainer.v1.trainer_mode=separate_async`` needs it with Gym; ``over`` = dotted key -> value."""
    config = OmegaConf.create(
        {
            "trainer": {"v1": {"trainer_mode": "separate_async"}},
            "actor_rollout_ref": {
                "hybrid_engine": False,
                "rollout": {
                    "nnodes": 1,
                    "n_gpus_per_node": 1,
                    "checkpoint_engine": {"backend": "fake_ce", "custom_backend_module": None},
                },
            },
        }
    )
    for key, value in over.items():
        OmegaConf.update(config, key, value)
    return config


@pytest.fixture
def fake_backend(monkeypatch):
    """A checkpoint engine registered as ``fake_ce`` in verl's registry for the test only."""
    from verl.checkpoint_engine import CheckpointEngineRegistry

    monkeypatch.setitem(CheckpointEngineRegistry._registry, "fake_ce", object)


def test_separate_async_with_what_it_needs_passes_and_other_modes_are_not_checked(fake_backend):
    check_separate_async(_separate_async())
    # sync/colocate_async use the naive backend and the hybrid engine: nothing to check
    check_separate_async(OmegaConf.create({"trainer": {"v1": {"trainer_mode": "colocate_async"}}}))


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        (
            "actor_rollout_ref.rollout.checkpoint_engine.backend",
            "naive",
            "checkpoint_engine.backend other than 'naive'",
        ),
        # verl 0.9.1 on CPU: nccl's module failed to import (no cupy); verl would fail only after starting every worker
        (
            "actor_rollout_ref.rollout.checkpoint_engine.backend",
            "nccl",
            "checkpoint_engine.backend='nccl' is not usable",
        ),
        ("actor_rollout_ref.hybrid_engine", True, "actor_rollout_ref.hybrid_engine=false"),
        ("actor_rollout_ref.rollout.nnodes", 0, "actor_rollout_ref.rollout.nnodes=0 must be > 0"),
        ("actor_rollout_ref.rollout.n_gpus_per_node", 0, "actor_rollout_ref.rollout.n_gpus_per_node=0 must be > 0"),
    ],
)
def test_separate_async_without_what_it_needs_fails_at_start_up_naming_the_key(key, value, named, fake_backend):
    from verl.checkpoint_engine import CheckpointEngineRegistry

    from nemo_gym_adapter.errors import AdapterConfigError

    if value == "nccl" and "nccl" in CheckpointEngineRegistry._registry:
        pytest.skip("nccl imports in this venv (cupy present): nothing to refuse")
    with pytest.raises(AdapterConfigError, match=named.replace("(", r"\(")) as info:
        check_separate_async(_separate_async(**{key: value}))
    assert "trainer.v1.trainer_mode=separate_async" in str(info.value)


@pytest.mark.parametrize(
    ("mode", "hybrid", "quieted"),
    [("separate_async", False, True), ("separate_async", True, False), ("colocate_async", False, False)],
)
def test_separate_async_without_hybrid_replicas_avoids_verls_flush_info_log(mode, hybrid, quieted):
    """verl 0.9.1 logs that case with ``logger.info(..., flush=True)``, a TypeError for the standard logger."""
    import logging

    verl_logger = logging.getLogger("verl.trainer.ppo.v1.trainer_separate_async")
    original = verl_logger.level
    verl_logger.setLevel(logging.INFO)  # setLevel, not the attribute: it clears isEnabledFor's cache
    try:
        with pytest.raises(TypeError, match="flush"):  # what verl's line does at INFO (why the run died in _setup)
            verl_logger.info("hybrid replicas disabled", flush=True)
        config = OmegaConf.create(
            {"trainer": {"v1": {"trainer_mode": mode}}, "actor_rollout_ref": {"hybrid_engine": hybrid}}
        )
        assert quiet_separate_async_info_log(config) is quieted
        assert verl_logger.isEnabledFor(logging.INFO) is not quieted
        if quieted:
            verl_logger.info("hybrid replicas disabled", flush=True)  # now a no-op
    finally:
        verl_logger.setLevel(original)
