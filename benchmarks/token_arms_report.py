"""The three-arm table of docs/TOKEN_PATCH.md from the runs' metrics files: the same config, rows, seed and steps with
the token-ID patch on (exact tokens), off with every rollout trained as its re-templated conversation
(``nemo_gym.trajectory.train_tokens=measure_retemplated``), and off with every model call its own sample
(``nemo_gym.trajectory.contiguity=split``).

    python benchmarks/bench_long_run.py --out RUNS/A --config nemo_gym_cpu_qwen_calc --steps 12 --save-freq -1
    python benchmarks/bench_long_run.py --out RUNS/B ... -- actor_rollout_ref.rollout.max_model_len=1664 \\
        nemo_gym.patch_vllm=false nemo_gym.trajectory.train_tokens=measure_retemplated
    python benchmarks/bench_long_run.py --out RUNS/C ... -- actor_rollout_ref.rollout.max_model_len=1664 \\
        nemo_gym.patch_vllm=false nemo_gym.trajectory.contiguity=split

(The patch-off arms need vLLM's ``max_model_len`` to hold the longest prompt plus a call's ``max_tokens``: stock vLLM
rejects a later call that would pass it, which Gym records as an empty, unfinished answer; the patch clamps the call's
budget to the room left instead.)
    python benchmarks/token_arms_report.py "patch on=RUNS/A" "re-templated=RUNS/B" "split=RUNS/C" [--rows VAL.jsonl]

Per arm: greedy validation success at each validation step (Gym's reward > 0 over every validation rollout, from the
rollout dump when there is one: what the policy achieved, whether or not the trainer could keep the rollout -- else
verl's logged ``val-core/all/gym/success_rate``, which leaves masked samples out; both are printed); the training reward (Gym's, over the valid samples)
of the first and last three steps; the rollout-vs-actor log-prob gap over first turns and over later turns (mean
|Δ| per trained token, mean over steps); the share of trained tokens the model never generated; the masked rate;
samples per step; step time (mean, and steps 2+). ``--rows``: the validation rows, for the answer-from-tool columns of
the last validation (benchmarks/answer_from_tool_report.py).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from recipe.nemo_gym.reporting.curve import load_step_metrics  # noqa: E402


def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(values) if values else float("nan")


def _series(metrics: dict[int, dict[str, float]], key: str) -> dict[int, float]:
    return {s: m[key] for s, m in sorted(metrics.items()) if key in m}


def dump_success(run: Path, rows: list[Path], upto: int | None = None) -> dict[int, dict]:
    """Validation per step from the rollout dump: {step: answer_from_tool_report's summary}."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import answer_from_tool_report as report

    by_question = report.load_rows(rows) if rows else {}
    out = {}
    for f in sorted((run / "dumps" / "gym" / "val").glob("step_*.jsonl")):
        recs = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        step = int(f.stem.split("_")[1])
        if upto is not None and step > upto:
            continue
        out[step] = report.summarize([report.rollout(r, by_question) for r in recs])
    return out


def arm(run: Path, rows: list[Path], upto: int | None = None) -> dict:
    metrics = load_step_metrics(run / "run" / "metrics.jsonl")
    if upto is not None:  # the first steps of a longer run, against a shorter arm
        metrics = {s: m for s, m in metrics.items() if s <= upto}
    train = {s: m for s, m in metrics.items() if "timing_s/step" in m}
    steps = sorted(train)
    reward = _series(train, "gym/all/reward_mean")
    step_s = _series(train, "timing_s/step")
    dumped = dump_success(run, rows, upto)
    val = {s: d["success"] for s, d in dumped.items()} or _series(metrics, "val-core/all/gym/success_rate")
    last = dumped[max(dumped)] if dumped else {}
    return {
        "validation": val,
        "val_logged": _series(metrics, "val-core/all/gym/success_rate"),
        "reward_first3": _mean([reward.get(s) for s in steps[:3]]),
        "reward_last3": _mean([reward.get(s) for s in steps[-3:]]),
        "gap_first_turn": _mean(list(_series(train, "onpolicy/first_turn/logprob_abs_diff_mean").values())),
        "gap_later_turns": _mean(list(_series(train, "onpolicy/later_turns/logprob_abs_diff_mean").values())),
        "never_generated": _mean(list(_series(train, "onpolicy/never_generated_rate").values())),
        "masked_rate": _mean(list(_series(train, "gym/all/masked_rate").values())),
        "samples_per_step": _mean(list(_series(train, "gym/all/num_samples").values())),
        "step_s": _mean(list(step_s.values())),
        "step_s_2plus": _mean([v for s, v in step_s.items() if s >= 2]),
        "steps": len(steps),
        "last_val": {k: last.get(k) for k in ("from_tool", "from_tool_of", "no_answer", "by_family")},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("arms", nargs="+", help="NAME=RUN_DIR (bench_long_run.py --out)")
    p.add_argument("--rows", nargs="*", type=Path, default=[], help="the validation rows (answer-from-tool columns)")
    p.add_argument("--steps", type=int, help="only the first N training steps (and validations up to step N)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    table = {}
    for spec in args.arms:
        name, _, path = spec.partition("=")
        table[name] = arm(Path(path), args.rows, args.steps)
    if args.json:
        print(json.dumps(table, indent=1, default=str))
        return 0
    print(
        "| arm | greedy validation, Gym's reward (step: success) | verl's validation (masked left out) | training "
        "reward, steps 1-3 -> last 3 | gap first turn | gap later turns | never generated | masked | samples/step | "
        "step s (2+) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, a in table.items():
        val = ", ".join(f"{s}: {v:.2f}" for s, v in sorted(a["validation"].items()))
        logged = ", ".join(f"{s}: {v:.2f}" for s, v in sorted(a["val_logged"].items()))
        print(
            f"| {name} | {val} | {logged} | {a['reward_first3']:.2f} -> {a['reward_last3']:.2f} | {a['gap_first_turn']:.4f} | "
            f"{a['gap_later_turns']:.4f} | {a['never_generated']:.3f} | {a['masked_rate']:.3f} | "
            f"{a['samples_per_step']:.1f} | {a['step_s']:.0f} ({a['step_s_2plus']:.0f}) |"
        )
    for name, a in table.items():
        print(f"{name}: last validation {a['last_val']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
