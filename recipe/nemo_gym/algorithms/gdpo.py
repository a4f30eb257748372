"""GDPO on verl 0.9.1's v1 trainer: Gym's reward components travel with each sample through TransferQueue and reach
verl's own ``gdpo`` estimator, which then computes what the legacy trainer computes on the same batch, bit for bit.

Why this is needed: verl's v1 ``trainer_base._compute_advantage`` fetches a fixed field list from TransferQueue (uid,
response_mask, rm_scores, log-probs, values), builds a ``DataProto`` from it and hands GDPO that ``DataProto``'s
``non_tensor_batch`` (``uid`` only) and ``batch`` (no ``prompts``/``attention_mask``); verl's GDPO then asserts on the
first ``algorithm.gdpo_reward_keys`` entry. The legacy trainer passes the batch's own columns
(``outcomes.legacy_extras``).

How, in three pieces:

1. Every training sample carries ``gym_outcome`` and its reward components in ``extra_fields.reward_extra_info`` (a
   masked sample: its group's fill), and its own components as ``extra_fields.gym_reward_components`` (the v1
   manager, ``managers.tq_records.sample_record``).
2. ``task_runner_v1.NemoGymTrainerMixin._compute_advantage`` runs verl's inside :func:`components_for`: with
   ``algorithm.adv_estimator=gdpo`` it fetches ``extra_fields`` and ``response_mask`` for the batch's keys (the order
   verl fetches in), checks the keys the first time an environment's results arrive
   (``outcomes.check_gdpo_components``, as the legacy manager does), adds the metrics the legacy trainer logs for GDPO
   (``gdpo/<key>/{mean,std,max,min}`` over the batch's column) and publishes the columns in :data:`COMPONENTS` for
   that call.
3. :func:`install` wraps the registered ``gdpo`` estimator (already ``masked_estimators.exclude_masked``) with
   :func:`with_components`. While :data:`COMPONENTS` is set, GDPO gets ``non_tensor_batch[<key>]`` columns and a
   ``batch`` whose ``prompts`` is empty and whose ``attention_mask`` covers each response, so verl puts each component
   on the sample's last response token, as on the legacy batch. The per-row tensors are padded to
   ``actor_rollout_ref.rollout.response_length`` (the legacy layout) and the result cut back: GDPO's batch whitening
   sums over the whole (rows, width) tensor, and a float32 sum over another width rounds differently (measured: 140 of
   200 random batches differed in the last bits). Outside :func:`components_for` (the legacy trainer, every other
   estimator) the wrapper calls verl's estimator unchanged.

Same samples in the same order: the same advantages as the legacy trainer, bit for bit
(``tests/unit/recipe/algorithms/test_gdpo.py``, verl's real ``_compute_advantage`` over a fake TransferQueue).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nemo_gym_adapter.errors import AdapterError
from nemo_gym_adapter.rollouts.groups import OUTCOME_KEY
from nemo_gym_adapter.rollouts.trajectory import MaskReason
from recipe.nemo_gym.algorithms import masked_estimators
from recipe.nemo_gym.algorithms.outcomes import check_gdpo_components
from recipe.nemo_gym.config.checks import GDPO

OWN_COMPONENTS = "gym_reward_components"
"""``extra_fields`` key of a sample's own reward components (masked or not; ``managers.tq_records.sample_record``)."""

_WRAPPED = "__ngv_gdpo_components__"
_CHECKED = "_ngv_gdpo_checked_envs"  # attribute of the trainer: environments whose GDPO keys were checked


@dataclass(frozen=True)
class Components:
    """What GDPO needs of one batch that verl's v1 ``_compute_advantage`` does not fetch: each key's column (float32,
    one value per row, in the batch's order), each row's response length and the legacy batch's response width."""

    columns: Mapping[str, np.ndarray]
    lengths: torch.Tensor  # (rows,) int64
    width: int

    @property
    def rows(self) -> int:
        return int(self.lengths.shape[0])


COMPONENTS: ContextVar[Components | None] = ContextVar("ngv_gdpo_components", default=None)
"""Set by :func:`components_for` for the duration of one ``_compute_advantage`` call (the trainer's thread)."""


def response_lengths(response_mask: Any) -> torch.Tensor:
    """Each row's response length from TransferQueue's ``response_mask`` field: a jagged nested tensor, or a plain
    (rows, length) tensor when every row has the same length."""
    if getattr(response_mask, "is_nested", False):
        return response_mask.offsets().diff().to(torch.int64)
    return torch.full((response_mask.shape[0],), response_mask.shape[1], dtype=torch.int64)


def extra_fields_list(value: Any) -> list[dict[str, Any]]:
    """TransferQueue's ``extra_fields`` column as one dict per row (as verl's v1 trainer reads it)."""
    items = value.tolist() if hasattr(value, "tolist") else list(value)
    return [dict(getattr(item, "data", item) or {}) for item in items]


def gdpo_columns(
    keys: Sequence[str], extras: Sequence[Mapping[str, Any]], sample_keys: Sequence[str]
) -> dict[str, np.ndarray]:
    """``{key: column}`` of each GDPO key from each row's ``reward_extra_info``. Every row has every key (a valid
    sample lacking one was masked ``missing_reward_component``; a masked sample carries its group's fill with the
    keys at 0): a row without one is a bug of the adapter, raised naming the sample."""
    columns = {key: np.empty(len(extras), dtype=np.float32) for key in keys}
    for row, extra in enumerate(extras):
        info = extra.get("reward_extra_info") or {}
        for key in keys:
            if key not in info:
                raise AdapterError(
                    f"GDPO on the v1 trainer: sample {sample_keys[row]!r} carries no {key!r} in "
                    f"extra_fields.reward_extra_info (it has {sorted(info)}); every training sample should"
                )
            columns[key][row] = info[key]
    return columns


def results_components(extras: Sequence[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Per environment, the components its results carry (``outcomes.carried_components`` from TransferQueue's
    ``extra_fields``): valid samples and samples masked only for a missing component."""
    carried: dict[str, set[str]] = {}
    for extra in extras:
        reason = extra.get("gym_masked_reason") or ""
        if reason in ("", MaskReason.MISSING_REWARD_COMPONENT.value):
            own = extra.get(OWN_COMPONENTS) or {}
            carried.setdefault(str(extra.get("gym_env")), set()).update(k for k in own if k != OUTCOME_KEY)
    return carried


def column_metrics(columns: Mapping[str, np.ndarray]) -> dict[str, float]:
    """``gdpo/<key>/{mean,std,max,min}`` over each column, as verl's legacy trainer logs them for GDPO."""
    out: dict[str, float] = {}
    for key, values in columns.items():
        if values.size:
            out.update(
                {
                    f"gdpo/{key}/mean": float(np.mean(values)),
                    f"gdpo/{key}/std": float(np.std(values)),
                    f"gdpo/{key}/max": float(np.max(values)),
                    f"gdpo/{key}/min": float(np.min(values)),
                }
            )
    return out


@contextmanager
def components_for(trainer: Any, batch: Any, metrics: dict[str, Any]) -> Iterator[Components | None]:
    """Around verl's v1 ``_compute_advantage(batch, metrics)`` (``batch``: its ``KVBatchMeta``): with
    ``algorithm.adv_estimator=gdpo`` fetch the batch's components and publish them in :data:`COMPONENTS` (module
    docstring, step 2); otherwise nothing."""
    config = trainer.config
    if config.algorithm.adv_estimator != GDPO:
        yield None
        return
    import transfer_queue as tq

    keys = [str(k) for k in (config.algorithm.get("gdpo_reward_keys", None) or [])]
    data = tq.kv_batch_get(
        keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields", "response_mask"]
    )
    extras = extra_fields_list(data["extra_fields"])
    checked = trainer.__dict__.setdefault(_CHECKED, set())
    check_gdpo_components(results_components(extras), keys, checked)
    columns = gdpo_columns(keys, extras, list(batch.keys))
    metrics.update(column_metrics(columns))
    payload = Components(
        columns, response_lengths(data["response_mask"]), int(config.actor_rollout_ref.rollout.response_length)
    )
    token = COMPONENTS.set(payload)
    try:
        yield payload
    finally:
        COMPONENTS.reset(token)


def _padded(value: Any, rows: int, length: int, width: int) -> Any:
    """A per-token tensor (rows, length) right-padded with zeros to (rows, width); anything else unchanged."""
    if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape == (rows, length) and width > length:
        return torch.nn.functional.pad(value, (0, width - length))
    return value


def with_components(fn: Any) -> Any:
    """``fn`` (the registered ``gdpo``) given :data:`COMPONENTS` when it is set (module docstring, step 3).
    Idempotent."""
    if getattr(fn, _WRAPPED, False):
        return fn
    named = masked_estimators.as_keywords(fn)

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        payload = COMPONENTS.get()
        if payload is None:
            return fn(*args, **kwargs)
        kwargs = named(args, kwargs)
        mask = kwargs["response_mask"]
        rows, length = mask.shape
        if rows != payload.rows:
            raise AdapterError(
                f"GDPO on the v1 trainer: the estimator got {rows} rows, the batch's components {payload.rows}"
            )
        width = max(length, payload.width)
        kwargs = {k: _padded(v, rows, length, width) for k, v in kwargs.items()}
        kwargs["non_tensor_batch"] = {**(kwargs.get("non_tensor_batch") or {}), **payload.columns}
        positions = torch.arange(width, device=mask.device)
        attention = (positions[None, :] < payload.lengths.to(mask.device)[:, None]).to(torch.int64)
        kwargs["batch"] = {
            "prompts": torch.zeros((rows, 0), dtype=torch.int64, device=mask.device),
            "attention_mask": attention,
        }
        advantages, returns = fn(**kwargs)
        return advantages[:, :length], returns[:, :length]

    setattr(wrapped, _WRAPPED, True)
    return wrapped


def install() -> bool:
    """Wrap verl's registered ``gdpo`` with :func:`with_components`, after ``masked_estimators.install`` (so the
    columns reach the estimator before its masked rows are sliced off). Once per process; True when it wrapped."""
    from verl.trainer.ppo import core_algos

    masked_estimators.install()
    fn = core_algos.ADV_ESTIMATOR_REGISTRY.get(GDPO)
    if fn is None or getattr(fn, _WRAPPED, False):
        return False
    core_algos.ADV_ESTIMATOR_REGISTRY[GDPO] = with_components(fn)
    return True
