"""verl's rollout-correction step on a batch in which every sample is masked.

verl 0.9.1's ``RayPPOTrainer.fit`` (decoupled mode, i.e. the default ``algorithm.rollout_correction`` block) calls
``verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_and_add_to_batch`` on every step whose batch has
``rollout_log_probs``, and that raises ``ValueError: response_mask must contain at least one valid token (1).`` when
no token of the batch is trained. With NeMo Gym such a step is an outcome, not a bug: every rollout of a step can
fail (an environment down, every trajectory broken or over the length limit) and comes back as a masked row. The rest
of the step takes it: ``masked_grpo`` gives those rows no advantage, verl's data metrics report NaN, and the actor's
token-mean loss is 0/0, whose non-finite gradient verl's FSDP engine skips. Only this call would end the run.

:func:`install` wraps that one function; ``fit`` imports it from the module at call time, so the wrapper is what
runs. A batch with at least one valid token goes to verl unchanged. An all-masked batch is returned as it is, with
verl's own metric keys for the configured IS/RS options (found by running verl's function on the same log-probs with
every token counted) set to NaN, and all-zero IS weights when ``rollout_is`` is on: what verl gives masked tokens.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

_GUARD_MARK = "_nemo_gym_all_masked_guard"


def all_masked_safe(fn: Callable[[Any, Any], tuple[Any, dict]]) -> Callable[[Any, Any], tuple[Any, dict]]:
    """``fn`` (verl's ``compute_rollout_correction_and_add_to_batch``) that accepts a batch with no valid token."""
    if getattr(fn, _GUARD_MARK, False):
        return fn

    @functools.wraps(fn)
    def guarded(batch: Any, rollout_corr_config: Any) -> tuple[Any, dict]:
        if bool(batch.batch["response_mask"].any()):
            return fn(batch, rollout_corr_config)
        from verl import DataProto

        old, rollout = batch.batch["old_log_probs"], batch.batch["rollout_log_probs"]
        probe = DataProto.from_dict(
            tensors={"old_log_probs": old, "rollout_log_probs": rollout, "response_mask": torch.ones_like(old)}
        )
        probe, metrics = fn(probe, rollout_corr_config)
        if "rollout_is_weights" in probe.batch.keys():
            weights = torch.zeros_like(probe.batch["rollout_is_weights"])
            batch = batch.union(DataProto.from_dict(tensors={"rollout_is_weights": weights}))
        return batch, {key: math.nan for key in metrics}

    setattr(guarded, _GUARD_MARK, True)
    return guarded


def install() -> None:
    """Guard verl's rollout-correction step in this process (idempotent). Call it where ``fit`` runs.

    The legacy trainer looks the function up in ``rollout_corr_helper`` at call time; verl's v1 trainer imported it
    into ``verl.trainer.ppo.v1.trainer_base`` (patched too when that module is loaded)."""
    import sys

    from verl.trainer.ppo import rollout_corr_helper

    name = "compute_rollout_correction_and_add_to_batch"
    setattr(rollout_corr_helper, name, all_masked_safe(getattr(rollout_corr_helper, name)))
    v1 = sys.modules.get("verl.trainer.ppo.v1.trainer_base")
    if v1 is not None and hasattr(v1, name):
        setattr(v1, name, all_masked_safe(getattr(v1, name)))
