"""Synthetic verl file-logger output for the reporting tests, written the way verl 0.9.1's ``FileLogger.log`` writes it:
one ``orjson.dumps({"step": step, "data": metrics}, option=OPT_SERIALIZE_NUMPY)`` line per ``Tracking.log`` call,
with numpy scalars among the values and validation metrics on their own line with the same step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

ENV_A, ENV_B = "toy_choice_simple_agent", "example_single_tool_call_simple_agent"


def write_log(path: Path, records: list[tuple[int, dict]]) -> Path:
    with open(path, "wb") as f:
        for step, data in records:
            f.write(orjson.dumps({"step": step, "data": data}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
    return path


def training_metrics(step: int, reward: float, prefix: str = "timing_s/gym") -> dict:
    """One step as the recipe logs it: adapter metrics (via meta_info["timing"]) + verl's own."""
    return {
        f"{prefix}/all/reward_mean": np.float64(reward),
        f"{prefix}/all/masked_rate": 0.1 if step % 4 == 0 else 0.0,
        f"{prefix}/{ENV_A}/reward_mean": reward + 0.05,
        f"{prefix}/{ENV_B}/reward_mean": reward - 0.05,
        "critic/score/mean": np.float32(reward * 0.9),
        "timing_s/step": 4.0 + step / 10,
        "training/global_step": step,
        "actor/lr": [1e-4],  # not a number: ignored
    }


def rising_run(tmp_path: Path, steps: int = 20, name: str = "run.jsonl") -> Path:
    records = [(s, training_metrics(s, 0.25 + 0.5 * (s - 1) / (steps - 1))) for s in range(1, steps + 1)]
    records.insert(10, (10, {"val-core/toy/reward/mean@1": 0.5}))  # validation: own line, same step
    return write_log(tmp_path / name, records)


def validated_run(tmp_path: Path, steps: int = 4, every: int = 2, name: str = "val.jsonl") -> Path:
    """``steps`` training steps of two environments, validation before training and every ``every`` steps: success
    per environment and overall under the adapter's names (``val-core/<scope>/gym/success_rate``), verl's own too."""
    records = []
    for s in range(0, steps + 1):
        if s > 0:
            records.append((s, training_metrics(s, 0.2 + 0.1 * s, prefix="gym")))
        if s % every == 0:
            a, b = 0.25 * s / every, 1.0
            records.append(
                (
                    s,
                    {
                        f"val-core/{ENV_A}/gym/success_rate": np.float64(a),
                        f"val-core/{ENV_B}/gym/success_rate": b,
                        "val-core/all/gym/success_rate": (a + b) / 2,
                        f"val-core/{ENV_A}/reward/mean@1": a,
                    },
                )
            )
    return write_log(tmp_path / name, records)
