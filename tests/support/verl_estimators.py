"""verl's advantage-estimator registry put back as it was after a test installs our wrappers
(``masked_estimators.install()``, ``gdpo.install()``): other tests compare with verl's own estimators."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_INSTALLED = "__ngv_exclude_masked_installed__"  # masked_estimators' once-per-process mark on core_algos


@contextmanager
def restored_estimators() -> Iterator[Any]:
    """Yields verl's ``core_algos``; on exit its registry, ``compute_grpo_outcome_advantage`` and our install mark are
    what they were on entry."""
    from verl.trainer.ppo import core_algos

    registry = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    direct = core_algos.compute_grpo_outcome_advantage
    had = core_algos.__dict__.get(_INSTALLED)
    try:
        yield core_algos
    finally:
        core_algos.ADV_ESTIMATOR_REGISTRY.clear()
        core_algos.ADV_ESTIMATOR_REGISTRY.update(registry)
        core_algos.compute_grpo_outcome_advantage = direct
        if had is None:
            core_algos.__dict__.pop(_INSTALLED, None)
