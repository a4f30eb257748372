"""The reward-curve PNG of a run (matplotlib, Agg backend: no display needed): the figure users look at first.

Top panel: the mean reward per training step, overall (bold) and per environment, verl's own score where it differs
(masked samples count as 0 there), and each environment's validation success at the steps validation ran (dashed,
square markers, in its environment's colour). Bottom panel, when known: the masked rate per step. The curves come
from :mod:`recipe.nemo_gym.reporting.curve`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from nemo_gym_adapter.errors import SetupError
from recipe.nemo_gym.reporting.curve import ALL_SCOPE, VERL_SCORE_KEY, RewardCurve, window_summary


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
    colours = _colours(curve)
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
            color=colours[name],
        )
    for name, values in _validation_series(curve).items():
        ax.plot(
            curve.val_steps,
            values,
            marker="s",
            markersize=5,
            linestyle="--",
            linewidth=1.2,
            color=colours.get(name, colours[ALL_SCOPE] if ALL_SCOPE in colours else "black"),
            label=f"{'all environments' if name == ALL_SCOPE else name}: validation success",
            zorder=4,
        )
    for name, values in curve.extra.items():
        if _same(values, curve.overall):
            continue  # nothing masked: verl's score is the same curve
        ax.plot(curve.steps, values, linestyle=":", linewidth=1, color="grey", label=f"{name} (masked = 0)")
    summary = window_summary(curve)
    ylabel = "mean reward (unmasked samples)" if curve.source != VERL_SCORE_KEY else "mean score"
    ax.set_ylabel(ylabel + (" / validation success" if curve.val_success else ""))
    shown = (*curve.reward.values(), *curve.extra.values(), *curve.val_success.values())
    lo, hi = _finite_range([v for s in shown for v in s])
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


def _colours(curve: RewardCurve) -> dict[str, str]:
    """One colour per series name, shared by its training reward and its validation success; with one environment
    its curves are the overall ones, so they share the overall colour."""
    names = list(curve.reward)
    names += [n for n in curve.val_success if n not in names]
    colours = {name: f"C{i}" for i, name in enumerate(names)}
    environments = [n for n in names if n != ALL_SCOPE]
    if ALL_SCOPE in colours and len(environments) == 1:
        colours[environments[0]] = colours[ALL_SCOPE]
    return colours


def _validation_series(curve: RewardCurve) -> dict[str, list[float]]:
    """The validation curves to draw: each environment's (``all`` too only when it is the only one, or when there
    are several environments and no single one stands for the whole run)."""
    environments = {n: v for n, v in curve.val_success.items() if n != ALL_SCOPE}
    if len(environments) == 1:
        return environments
    return environments or dict(curve.val_success)


def _fmt(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"
