"""What a model's tool calls are worth per environment, from ``python -m nemo_gym_adapter.collect --output`` files:
rollouts, reward and success, the multi-turn share (two or more model calls), calls per rollout, the share of calls
that fit the tool's schema (``nemo_gym_adapter.wire.tool_calls``) and that name an unknown tool, rollouts without any call,
contiguity and masked rates. Used to choose the tool model's environments by measurement (docs/BENCHMARKS.md).

    python benchmarks/tool_rollouts_report.py rollouts.jsonl [more.jsonl ...] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from nemo_gym_adapter.wire.payloads import parse_run_result


def rollout_fields(record: dict[str, Any]) -> dict[str, Any] | None:
    """One collect record's fields for the table (None for a record without a Gym result)."""
    result = record.get("result")
    if not isinstance(result, dict):
        return None
    numeric = parse_run_result(result).numeric_fields()
    calls = numeric.get("tool_calls/count", 0.0)
    return {
        "env": record.get("env"),
        "reward": record.get("reward"),
        "masked": record.get("masked_reason") is not None,
        "turns": record.get("num_turns") or 0,
        "calls": calls,
        "schema_valid": numeric.get("tool_calls/schema_valid"),
        "unknown_tool": numeric.get("tool_calls/unknown_tool"),
        "contiguous": not record.get("contiguity_failure"),
    }


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 3) if values else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    by_env: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_env[str(r["env"])].append(r)
    out = {}
    for env, rs in sorted(by_env.items()):
        scored = [r for r in rs if not r["masked"] and r["reward"] is not None]
        with_calls = [r for r in rs if r["calls"]]
        out[env] = {
            "rollouts": len(rs),
            "masked_rate": round(sum(r["masked"] for r in rs) / len(rs), 3),
            "reward_mean": _mean([r["reward"] for r in scored]),
            "success_rate": _mean([float(r["reward"] > 0) for r in scored]),
            "multi_turn_share": _mean([float(r["turns"] >= 2) for r in rs]),
            "model_calls_mean": _mean([float(r["turns"]) for r in rs]),
            "tool_calls_mean": _mean([r["calls"] for r in rs]),
            "no_call_share": _mean([float(not r["calls"]) for r in rs]),
            "schema_valid_rate": _mean([r["schema_valid"] for r in with_calls if r["schema_valid"] is not None]),
            "unknown_tool_rate": _mean([r["unknown_tool"] for r in with_calls if r["unknown_tool"] is not None]),
            "contiguity_rate": _mean([float(r["contiguous"]) for r in rs if r["turns"] >= 2]),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    rows = []
    for path in args.files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                fields = rollout_fields(json.loads(line))
                if fields is not None:
                    rows.append(fields)
    table = summarize(rows)
    if args.json:
        print(json.dumps(table, indent=2))
        return 0
    keys = list(next(iter(table.values()), {}))
    print("| env | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for env, values in table.items():
        print(f"| {env} | " + " | ".join("-" if values[k] is None else str(values[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
