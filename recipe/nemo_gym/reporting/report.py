"""Reporting on a training run: its per-step metrics file → reward curve PNG, per-step table (training and validation
side by side), first/last-k summary.

    python -m recipe.nemo_gym.reporting <metrics.jsonl> [-o curve.png] [--table] [--window 5] [--title TEXT]

The recipe's ``main`` writes this report at the end of a run logged to a file, ``benchmarks/bench_grpo_toy.py`` after its
run; the command reports on any finished or running one (default PNG: ``reward_curve.png`` next to the metrics).
What is read and how: :mod:`recipe.nemo_gym.reporting.curve`; the PNG: :mod:`recipe.nemo_gym.reporting.plot`. The report
prints one line per validation pass (each environment's validation success) after the training summary; ``--table``
puts training and validation columns side by side, one row per step (a validation-only step, such as step 0 before
training, has ``-`` in the training columns).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from nemo_gym_adapter.errors import SetupError
from recipe.nemo_gym.reporting.curve import (
    ALL_SCOPE,
    MetricsFileError,
    RewardCurve,
    load_reward_curve,
    window_summary,
)
from recipe.nemo_gym.reporting.plot import plot_reward_curve


def format_table(curve: RewardCurve) -> str:
    """The curve as a fixed-width text table: one line per step, training and validation columns side by side."""
    rows = sorted(set(curve.steps) | set(curve.val_steps))
    train_at = {s: i for i, s in enumerate(curve.steps)}
    val_at = {s: i for i, s in enumerate(curve.val_steps)}

    def column(values: list[float] | None, at: dict[int, int], digits: int = 3) -> list[str]:
        return [_fmt(values[at[s]], digits) if values is not None and s in at else "-" for s in rows]

    cols = [("step", [str(s) for s in rows])]
    cols += [(f"reward[{n}]", column(curve.reward[n], train_at)) for n in curve.reward]
    if curve.masked_rate is not None:
        cols.append(("masked", column(curve.masked_rate, train_at)))
    if curve.step_time_s is not None:
        cols.append(("step_s", column(curve.step_time_s, train_at, 1)))
    cols += [(f"val_success[{n}]", column(curve.val_success[n], val_at)) for n in curve.val_success]
    widths = [max(len(h), *(len(c) for c in cells)) for h, cells in cols]
    lines = ["  ".join(h.rjust(w) for (h, _), w in zip(cols, widths, strict=True))]
    for i in range(len(rows)):
        lines.append("  ".join(cells[i].rjust(w) for (_, cells), w in zip(cols, widths, strict=True)))
    return "\n".join(lines)


def validation_lines(curve: RewardCurve) -> list[str]:
    """One line per validation pass: each scope's validation success (``all`` first), then first -> last per scope."""
    if not curve.val_success:
        return []
    lines = []
    for i, step in enumerate(curve.val_steps):
        at_step = ", ".join(f"{n} {_fmt(v[i])}" for n, v in curve.val_success.items())
        lines.append(f"validation success at step {step}: {at_step}")
    if len(curve.val_steps) > 1:
        for name, series in curve.val_success.items():
            finite = [(s, v) for s, v in zip(curve.val_steps, series, strict=True) if not math.isnan(v)]
            if finite:
                (s0, v0), (s1, v1) = finite[0], finite[-1]
                lines.append(f"  {name}: validation success {_fmt(v0)} (step {s0}) -> {_fmt(v1)} (step {s1})")
    return lines


def _fmt(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


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
    lines += validation_lines(curve)
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
