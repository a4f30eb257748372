"""The reward-curve PNG (``recipe.nemo_gym.reporting.plot``): written, and showing the series it is given."""

from __future__ import annotations

from pathlib import Path

from recipe.nemo_gym.reporting.curve import load_reward_curve
from recipe.nemo_gym.reporting.plot import plot_reward_curve
from tests.support.metrics_files import rising_run, training_metrics, validated_run, write_log


def _ink(png: Path) -> tuple[tuple[int, ...], float]:
    """Image shape and the share of pixels that are coloured (lines), not white/grey (background, grid, text)."""
    import matplotlib.image

    img = matplotlib.image.imread(png)[..., :3]
    chroma = img.max(axis=-1) - img.min(axis=-1)
    return img.shape, float((chroma > 0.2).mean())


def test_png_is_written_and_shows_the_series(tmp_path):
    curve = load_reward_curve(rising_run(tmp_path))
    out = plot_reward_curve(curve, tmp_path / "sub" / "curve.png")
    assert out.is_file() and out.stat().st_size > 10_000
    shape, ink = _ink(out)
    assert shape[0] > 400 and shape[1] > 600
    assert ink > 0.003  # coloured curves present
    # A different run gives a different picture (the plot depends on the data, not just on the axes).
    flat = [(s, {"gym/all/reward_mean": 0.5}) for s in range(1, 21)]
    other = plot_reward_curve(load_reward_curve(write_log(tmp_path / "flat.jsonl", flat)), tmp_path / "flat.png")
    assert _ink(other)[1] < ink and other.read_bytes() != out.read_bytes()


def test_the_png_shows_each_environments_validation_success(tmp_path):
    """The same training curves with and without validation: the validated run's PNG has more coloured ink (the
    validation series), and without validation metrics the picture is what it was."""
    validated = load_reward_curve(validated_run(tmp_path))
    with_val = plot_reward_curve(validated, tmp_path / "with.png")
    records = [(s, training_metrics(s, 0.2 + 0.1 * s, prefix="gym")) for s in range(1, 5)]
    without = plot_reward_curve(load_reward_curve(write_log(tmp_path / "t.jsonl", records)), tmp_path / "without.png")
    assert validated.val_success and _ink(with_val)[1] > _ink(without)[1] * 1.1, (_ink(with_val), _ink(without))
