"""A training run's per-step metrics file → its curves: reward per environment, masked rate, step time, and each
environment's validation success.

Source: verl 0.9.1's file logger (``verl.utils.tracking.FileLogger``), switched on with ``trainer.logger=[console,
file]``. It writes one JSON object per ``Tracking.log`` call, ``{"step": N, "data": {metric: value, ...}}``, to
``$VERL_FILE_LOGGER_PATH`` (default ``$VERL_FILE_LOGGER_ROOT/<project_name>/<experiment_name>.jsonl``, root ``.``).
Validation metrics come as separate lines with the same step; lines of one step are merged.

Series read (the first family found wins; all of it is over every step that has it):

* reward: the adapter's per-environment metrics (``nemo_gym_adapter.rollouts.metrics``) ``<prefix>/<scope>/reward_mean``
  (mean Gym reward over *unmasked* samples; scope ``all`` or an environment), one curve per environment. Runs
  before the plain names (``recipe.nemo_gym.trainer.task_runner``) logged them as ``timing_s/<prefix>/<scope>/reward_mean``;
  both spellings are read.
  Without them: verl's ``critic/score/mean`` (sequence score; a masked sample counts as 0).
* masked rate: ``[timing_s/]<prefix>/all/masked_rate`` (share of samples masked out of training).
* step time: ``timing_s/step`` (verl's wall time of one training step).
* validation success: ``val-core/<scope>/<prefix>/success_rate`` (``nemo_gym_adapter.rollouts.validation``: the
  share of unmasked validation samples that succeeded, per environment and ``all``), at the steps validation ran
  (``trainer.val_before_train`` logs step 0, then every ``trainer.test_freq``).

The plot is :mod:`recipe.nemo_gym.reporting.plot`'s, the command :mod:`recipe.nemo_gym.reporting.report`'s.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nemo_gym_adapter.data.jsonl import read_objects
from nemo_gym_adapter.errors import AdapterError, DatasetError

ALL_SCOPE = "all"
VERL_SCORE_KEY = "critic/score/mean"
STEP_TIME_KEY = "timing_s/step"
_REWARD_KEY = re.compile(r"^(?:timing_s/)?(?P<prefix>[^/]+)/(?P<scope>[^/]+)/reward_mean$")
_VAL_SUCCESS_KEY = re.compile(r"^val-core/(?P<scope>[^/]+)/(?P<prefix>[^/]+)/success_rate$")
_VALIDATION = ("val-", "val/")


class MetricsFileError(AdapterError, ValueError):
    """A metrics file is missing, malformed or holds no reward metric. The message names the file (and line)."""


@dataclass(frozen=True)
class RewardCurve:
    """Per-step series of one run. Lists are aligned with ``steps``; NaN where a step lacks the metric.

    ``reward`` maps a series name (``all`` first, then environments in name order) to its values; ``source``
    names the metric family the reward came from. ``val_success`` is aligned with ``val_steps`` instead.
    """

    path: str
    steps: list[int]
    reward: dict[str, list[float]]
    source: str
    masked_rate: list[float] | None = None
    step_time_s: list[float] | None = None
    extra: dict[str, list[float]] = field(default_factory=dict)
    # Validation success per scope (``all`` first, then environments), aligned with ``val_steps``; empty without
    # validation. A validation step need not be a training step (step 0: before training).
    val_steps: list[int] = field(default_factory=list)
    val_success: dict[str, list[float]] = field(default_factory=dict)

    @property
    def overall(self) -> list[float]:
        """The overall reward series (``all``), or the only series there is."""
        return self.reward.get(ALL_SCOPE) or next(iter(self.reward.values()))


def load_step_metrics(path: str | Path) -> dict[int, dict[str, float]]:
    """Read a verl file-logger JSONL: step -> {metric: value} (numeric values only; lines of a step merged).

    Raises:
        MetricsFileError: unreadable file, a line that is not ``{"step": <int>, "data": {...}}`` (names
            ``file:line``), or no line at all.
    """
    path = Path(path)
    if not path.is_file():
        raise MetricsFileError(
            f"{path}: cannot read metrics file ({'a directory' if path.is_dir() else 'no such file'})"
        )
    steps: dict[int, dict[str, float]] = {}
    try:  # lines as the rows' reader takes them (BOM, CRLF, blank lines; file:line in every error)
        for lineno, _, record in read_objects(str(path)):
            where = f"{path}:{lineno}"
            step, data = record.get("step"), record.get("data")
            if not isinstance(step, int) or isinstance(step, bool):
                raise MetricsFileError(f"{where}: 'step' must be an integer, got {step!r}")
            if not isinstance(data, dict):
                raise MetricsFileError(f"{where}: 'data' must be an object of metrics, got {type(data).__name__}")
            merged = steps.setdefault(step, {})
            for key, value in data.items():
                # verl logs numbers (numpy scalars serialised as numbers); anything else is not a curve point.
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    merged[key] = float(value)
    except DatasetError as e:
        raise MetricsFileError(str(e)) from e
    except OSError as e:  # unreadable (permissions): named as before
        raise MetricsFileError(f"{path}: cannot read metrics file ({e})") from e
    if not steps:
        raise MetricsFileError(f"{path}: no metrics (empty file; was trainer.logger=[console,file] set?)")
    return dict(sorted(steps.items()))


def _series(steps: Mapping[int, Mapping[str, float]], key: str) -> list[float]:
    return [m.get(key, math.nan) for m in steps.values()]


def _reward_keys(steps: Mapping[int, Mapping[str, float]]) -> tuple[str, dict[str, str]]:
    """(prefix, {scope: logged key}) of the adapter's reward metrics; the un-prefixed spelling wins a tie."""
    found: dict[str, dict[str, str]] = {}
    for metrics in steps.values():
        for key in metrics:
            match = _REWARD_KEY.match(key)
            if match and not key.startswith(_VALIDATION):
                scopes = found.setdefault(match["prefix"], {})
                scope = match["scope"]
                if scope not in scopes or not key.startswith("timing_s/"):
                    scopes[scope] = key
    if not found:
        return "", {}
    # Several prefixes (unlikely): the one with an overall scope and the most scopes.
    prefix = max(found, key=lambda p: (ALL_SCOPE in found[p], len(found[p]), p))
    return prefix, found[prefix]


def reward_curve(steps: Mapping[int, Mapping[str, float]], path: str = "<metrics>") -> RewardCurve:
    """Pick the reward, masked-rate and step-time series out of per-step metrics (see the module docstring).

    Raises:
        MetricsFileError: no step carries a reward metric (names ``path`` and the keys looked for).
    """
    prefix, scopes = _reward_keys(steps)
    # Training steps only: a step with validation metrics alone (val_before_train logs step 0) is not one.
    val_steps, val_success = _validation_success(steps, prefix)
    trained = {s: m for s, m in steps.items() if not all(k.startswith(_VALIDATION) for k in m)}
    steps = trained or steps
    if scopes:
        order = sorted(scopes, key=lambda s: (s != ALL_SCOPE, s))
        reward = {scope: _series(steps, scopes[scope]) for scope in order}
        source = scopes.get(ALL_SCOPE, scopes[order[0]])
        masked_key = next(
            (
                k
                for k in (f"{prefix}/{ALL_SCOPE}/masked_rate", f"timing_s/{prefix}/{ALL_SCOPE}/masked_rate")
                if any(k in m for m in steps.values())
            ),
            None,
        )
    elif any(VERL_SCORE_KEY in m for m in steps.values()):
        reward, source, masked_key = {ALL_SCOPE: _series(steps, VERL_SCORE_KEY)}, VERL_SCORE_KEY, None
    else:
        raise MetricsFileError(
            f"{path}: no reward metric in any of {len(steps)} steps (looked for '[timing_s/]<prefix>/<scope>/"
            f"reward_mean' and '{VERL_SCORE_KEY}')"
        )
    extra = {}
    if source != VERL_SCORE_KEY and any(VERL_SCORE_KEY in m for m in steps.values()):
        extra[VERL_SCORE_KEY] = _series(steps, VERL_SCORE_KEY)
    has_time = any(STEP_TIME_KEY in m for m in steps.values())
    return RewardCurve(
        path=str(path),
        steps=list(steps),
        reward=reward,
        source=source,
        masked_rate=_series(steps, masked_key) if masked_key else None,
        step_time_s=_series(steps, STEP_TIME_KEY) if has_time else None,
        extra=extra,
        val_steps=val_steps,
        val_success=val_success,
    )


def _validation_success(
    steps: Mapping[int, Mapping[str, float]], prefix: str
) -> tuple[list[int], dict[str, list[float]]]:
    """(steps with validation success, {scope: values}) from ``val-core/<scope>/<prefix>/success_rate``; the training
    metrics' prefix wins when several are logged."""
    found: dict[str, dict[str, str]] = {}
    for metrics in steps.values():
        for key in metrics:
            match = _VAL_SUCCESS_KEY.match(key)
            if match:
                found.setdefault(match["prefix"], {})[match["scope"]] = key
    if not found:
        return [], {}
    keys = found.get(prefix) or found[max(found, key=lambda p: (len(found[p]), p))]
    at = [s for s, m in steps.items() if any(k in m for k in keys.values())]
    order = sorted(keys, key=lambda s: (s != ALL_SCOPE, s))
    return at, {scope: [steps[s].get(keys[scope], math.nan) for s in at] for scope in order}


def load_reward_curve(path: str | Path) -> RewardCurve:
    """:func:`load_step_metrics` + :func:`reward_curve`."""
    return reward_curve(load_step_metrics(path), path=str(path))


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def window_summary(curve: RewardCurve, k: int = 5, series: str | None = None) -> dict[str, float]:
    """Mean reward (overall, or of environment ``series``) of the first and last ``k`` steps, their difference and
    ratio (NaN when undefined).

    ``k`` shrinks to half the run when the run is shorter than ``2k`` steps, so the two windows never overlap.
    """
    values = curve.overall if series is None else curve.reward[series]
    k = max(1, min(k, len(values) // 2))
    first, last = _mean(values[:k]), _mean(values[-k:])
    return {
        "first_mean": first,
        "last_mean": last,
        "difference": last - first,
        "ratio": last / first if first and not math.isnan(first) else math.nan,
        "k": float(k),
    }
