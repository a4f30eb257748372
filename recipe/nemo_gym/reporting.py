"""Reporting on a training run: its per-step metrics file → reward curve PNG, per-step table, first/last-k summary.

    python -m recipe.nemo_gym.reporting <metrics.jsonl> [-o curve.png] [--table] [--window 5] [--title TEXT]

The recipe's ``main`` writes this report at the end of a run logged to a file, ``benchmarks/bench_grpo_toy.py`` after its
run; the command reports on any finished or running one (default PNG: ``reward_curve.png`` next to the metrics).

Source: verl 0.9.1's file logger (``verl.utils.tracking.FileLogger``), switched on with ``trainer.logger=[console,
file]``. It writes one JSON object per ``Tracking.log`` call, ``{"step": N, "data": {metric: value, ...}}``, to
``$VERL_FILE_LOGGER_PATH`` (default ``$VERL_FILE_LOGGER_ROOT/<project_name>/<experiment_name>.jsonl``, root ``.``).
Validation metrics come as separate lines with the same step; lines of one step are merged.

Series read (the first family found wins; all of it is over every step that has it):

* reward: the adapter's per-environment metrics (``nemo_gym_adapter.rollouts.metrics``) ``<prefix>/<scope>/reward_mean``
  (mean Gym reward over *unmasked* samples; scope ``all`` or an environment), one curve per environment. Runs
  before the plain names (``recipe.nemo_gym.task_runner``) logged them as ``timing_s/<prefix>/<scope>/reward_mean``;
  both spellings are read.
  Without them: verl's ``critic/score/mean`` (sequence score; a masked sample counts as 0).
* masked rate: ``[timing_s/]<prefix>/all/masked_rate`` (share of samples masked out of training).
* step time: ``timing_s/step`` (verl's wall time of one training step).

The plot (matplotlib, Agg backend: no display needed) has the reward per step on top -- overall and per
environment -- and the masked rate below.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nemo_gym_adapter.errors import AdapterError, SetupError

ALL_SCOPE = "all"
VERL_SCORE_KEY = "critic/score/mean"
STEP_TIME_KEY = "timing_s/step"
_REWARD_KEY = re.compile(r"^(?:timing_s/)?(?P<prefix>[^/]+)/(?P<scope>[^/]+)/reward_mean$")


class MetricsFileError(AdapterError, ValueError):
    """A metrics file is missing, malformed or holds no reward metric. The message names the file (and line)."""


@dataclass(frozen=True)
class RewardCurve:
    """Per-step series of one run. Lists are aligned with ``steps``; NaN where a step lacks the metric.

    ``reward`` maps a series name (``all`` first, then environments in name order) to its values; ``source``
    names the metric family the reward came from.
    """

    path: str
    steps: list[int]
    reward: dict[str, list[float]]
    source: str
    masked_rate: list[float] | None = None
    step_time_s: list[float] | None = None
    extra: dict[str, list[float]] = field(default_factory=dict)

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
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MetricsFileError(f"{path}: cannot read metrics file ({e})") from e
    steps: dict[int, dict[str, float]] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise MetricsFileError(f"{where}: not JSON ({e.msg} at column {e.colno})") from e
        if not isinstance(record, dict):
            raise MetricsFileError(f'{where}: expected {{"step": N, "data": {{...}}}}, got {type(record).__name__}')
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
            if match and not key.startswith(("val-", "val/")):
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
    trained = {s: m for s, m in steps.items() if not all(k.startswith(("val-", "val/")) for k in m)}
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
    )


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


def format_table(curve: RewardCurve) -> str:
    """The curve as a fixed-width text table: one line per step."""
    names = list(curve.reward)
    cols = [("step", [str(s) for s in curve.steps])]
    cols += [(f"reward[{n}]", [_fmt(v) for v in curve.reward[n]]) for n in names]
    if curve.masked_rate is not None:
        cols.append(("masked", [_fmt(v) for v in curve.masked_rate]))
    if curve.step_time_s is not None:
        cols.append(("step_s", [_fmt(v, 1) for v in curve.step_time_s]))
    widths = [max(len(h), *(len(c) for c in cells)) for h, cells in cols]
    lines = ["  ".join(h.rjust(w) for (h, _), w in zip(cols, widths, strict=True))]
    for i in range(len(curve.steps)):
        lines.append("  ".join(cells[i].rjust(w) for (_, cells), w in zip(cols, widths, strict=True)))
    return "\n".join(lines)


def _fmt(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def plot_reward_curve(curve: RewardCurve, out: str | Path, title: str | None = None) -> Path:
    """Write the PNG (reward per step on top, masked rate below when known) and return its path."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: works without a display, also on CI
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:
        raise SetupError("matplotlib is needed for the reward plot: pip install -e '.[test]'") from e

    out = Path(out)
    panels = 2 if curve.masked_rate is not None else 1
    fig, axes = plt.subplots(
        panels,
        1,
        figsize=(8, 5.5 if panels == 2 else 4),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 1][:panels]},
    )
    ax = axes[0][0]
    for name, values in curve.reward.items():
        overall = name == ALL_SCOPE
        if not overall and len(curve.reward) == 2 and ALL_SCOPE in curve.reward:
            continue  # one environment: its curve is the overall one
        ax.plot(
            curve.steps,
            values,
            marker="o",
            markersize=3,
            linewidth=2.2 if overall else 1.2,
            label="all environments" if overall else name,
            zorder=3 if overall else 2,
        )
    for name, values in curve.extra.items():
        if _same(values, curve.overall):
            continue  # nothing masked: verl's score is the same curve
        ax.plot(curve.steps, values, linestyle=":", linewidth=1, color="grey", label=f"{name} (masked = 0)")
    summary = window_summary(curve)
    ax.set_ylabel("mean reward (unmasked samples)" if curve.source != VERL_SCORE_KEY else "mean score")
    lo, hi = _finite_range([v for s in (*curve.reward.values(), *curve.extra.values()) for v in s])
    if 0.0 <= lo and hi <= 1.0:
        ax.set_ylim(-0.02, 1.02)  # rewards in [0, 1]: a fixed scale shows the size of the change honestly
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    k = int(summary["k"])
    ax.set_title(
        title
        or f"{Path(curve.path).name}: first {k} steps {_fmt(summary['first_mean'])} -> "
        f"last {k} steps {_fmt(summary['last_mean'])}",
        fontsize=10,
    )
    if curve.masked_rate is not None:
        mx = axes[1][0]
        mx.plot(curve.steps, curve.masked_rate, color="tab:red", marker=".", linewidth=1)
        mx.set_ylabel("masked rate")
        mx.set_ylim(-0.02, 1.02)
        mx.grid(alpha=0.3)
    axes[-1][0].set_xlabel("training step")
    axes[-1][0].xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _same(a: Sequence[float], b: Sequence[float]) -> bool:
    if len(a) != len(b):
        return False
    return all((math.isnan(x) and math.isnan(y)) or abs(x - y) < 1e-9 for x, y in zip(a, b, strict=True))


def _finite_range(values: Sequence[float]) -> tuple[float, float]:
    finite = [v for v in values if not math.isnan(v)]
    return (min(finite), max(finite)) if finite else (0.0, 1.0)


def summary_text(curve: RewardCurve, window: int = 5, wall_s: float | None = None) -> str:
    """The run in a few lines: reward source, first/last-``window`` means (difference, ratio), wall time per step
    (verl's ``timing_s/step``; with ``wall_s``, the whole run's start-up share), verl's own score first/last."""
    s = window_summary(curve, k=window)
    k = int(s["k"])
    lines = [
        f"{len(curve.steps)} steps, reward from {curve.source}",
        f"first {k} steps mean reward: {_fmt(s['first_mean'])}",
        f"last  {k} steps mean reward: {_fmt(s['last_mean'])}",
        f"difference: {s['difference']:+.3f}   ratio: {s['ratio']:.2f}x",
    ]
    for env in curve.reward:
        if env != ALL_SCOPE and len(curve.reward) > 2:  # several environments: each one's own first/last k
            e = window_summary(curve, k=window, series=env)
            lines.append(
                f"  {env}: first {k} {_fmt(e['first_mean'])} -> last {k} {_fmt(e['last_mean'])} "
                f"({e['difference']:+.3f})"
            )
    times = [t for t in curve.step_time_s or [] if not math.isnan(t)]
    if times:
        later = times[1:] or times
        lines.append(
            f"wall time per step: mean {sum(times) / len(times):.1f}s (first step {times[0]:.1f}s, later steps "
            f"{min(later):.1f}-{max(later):.1f}s)"
        )
        if wall_s is not None:
            lines.append(f"whole run: {wall_s:.0f}s, of which start-up/shutdown ~{wall_s - sum(times):.0f}s")
    for name, values in curve.extra.items():
        finite = [v for v in values if not math.isnan(v)]
        if finite:
            lines.append(f"{name}: first {finite[0]:.3f}, last {finite[-1]:.3f}")
    return "\n".join(lines)


def write_report(
    metrics: str | Path,
    png: str | Path | None = None,
    *,
    window: int = 5,
    table: bool = False,
    title: str | None = None,
    wall_s: float | None = None,
) -> str:
    """Load the metrics file, write the PNG (default ``reward_curve.png`` next to it) and return the report text
    (the per-step table first with ``table``). Raises ``MetricsFileError``/``SetupError`` (nothing written)."""
    curve = load_reward_curve(metrics)
    out = plot_reward_curve(curve, png or Path(metrics).with_name("reward_curve.png"), title=title)
    parts = [format_table(curve)] if table else []
    parts += [summary_text(curve, window, wall_s), f"reward curve: {out}; metrics: {metrics}"]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m recipe.nemo_gym.reporting", description=__doc__.split("\n\n")[0])
    p.add_argument("metrics", type=Path, help="verl file-logger JSONL (trainer.logger=[console,file])")
    p.add_argument("-o", "--output", type=Path, help="PNG to write (default: reward_curve.png next to the metrics)")
    p.add_argument("--title", help="plot title (default: file name and first/last-k means)")
    p.add_argument("--table", action="store_true", help="also print the per-step table")
    p.add_argument("--window", type=int, default=5, help="steps averaged at each end (default 5)")
    args = p.parse_args(argv)
    if args.window < 1:
        p.error("--window must be >= 1")
    try:
        print(write_report(args.metrics, args.output, window=args.window, table=args.table, title=args.title))
    except (MetricsFileError, SetupError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
