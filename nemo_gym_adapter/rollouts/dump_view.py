"""Read a step of the rollout dump (:mod:`nemo_gym_adapter.rollouts.dump`): the worst and best rollouts, and the masked
ones apart, as text a person reads in a terminal.

    python -m nemo_gym_adapter.rollouts.dump_view <dir> [--step N] [--val] [--env E] [--worst 3] [--best 3] [--full]

``<dir>``: the dump directory, or verl's ``trainer.rollout_data_dir`` (its ``gym/`` subdirectory is used). Without
``--step`` the newest step is shown. Rollouts are ranked by ``gym_reward`` (then fewer generated tokens first among
the best); masked rollouts have no measured reward and are listed apart with their reason. Each shown rollout prints
its header (environment, rewards, turns, tokens, where it came from), its Gym result fields, the decoded prompt's
end, and its turns (model text, tool calls with their arguments, tool outputs). ``--full``: no text is shortened.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_gym_adapter.rollouts.dump import PARTITIONS, step_file

_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")


def dump_root(path: Path) -> Path:
    """The dump directory: ``path`` itself when it holds ``train/`` or ``val/``, else ``path/gym``."""
    if any((path / p).is_dir() for p in PARTITIONS):
        return path
    if (path / "gym").is_dir():
        return path / "gym"
    raise FileNotFoundError(f"{path}: no rollout dump here (expected train/ or val/, or gym/ under verl's dir)")


def steps(root: Path, partition: str) -> list[int]:
    """The steps with a file in ``root/partition``, ascending."""
    folder = root / partition
    found = [int(m.group(1)) for f in folder.glob("step_*.jsonl") if (m := _STEP_FILE.match(f.name))]
    return sorted(found)


def load(root: Path, partition: str, step: int) -> list[dict[str, Any]]:
    """The records of one step (raises ``FileNotFoundError`` naming the file)."""
    path = step_file(root, partition, step)
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _short(text: str | None, width: int) -> str:
    text = "" if text is None else str(text)
    if width <= 0 or len(text) <= width:
        return text
    half = max(width // 2 - 3, 1)
    return f"{text[:half]} ... {text[-half:]}"


def format_record(r: dict[str, Any], width: int = 400) -> str:
    """One rollout as indented text."""
    reward = r.get("gym_reward")
    head = (
        f"[{r.get('env')}] gym_reward={reward} reward={r.get('reward')}"
        + (f" MASKED {r['masked_reason']}" if r.get("masked_reason") else "")
        + f" turns={r.get('num_turns')} prompt={r.get('prompt_tokens')} generated={r.get('generated_tokens')}"
        + (" truncated" if r.get("truncated") else "")
        + f"  (row {r.get('row_index')}, uid {r.get('uid')}, session {r.get('session')}, weights {r.get('weight_version')})"
    )
    lines = [head]
    if r.get("detail"):
        lines.append(f"  detail: {_short(r['detail'], width)}")
    fields = {**r.get("result", {}), **{f"components.{k}": v for k, v in r.get("reward_components", {}).items()}}
    if fields:
        lines.append("  result: " + ", ".join(f"{k}={v:g}" for k, v in sorted(fields.items())))
    if r.get("prompt"):
        lines.append(f"  prompt (end): {_short(r['prompt'][-width:] if width > 0 else r['prompt'], width)!r}")
    for turn in r.get("turns", []):
        kind = turn.get("type")
        if kind == "tool_call":
            lines.append(f"  > tool_call {turn.get('name')}({_short(turn.get('arguments'), width)})")
        elif kind == "tool_output":
            lines.append(f"  < tool_output {_short(turn.get('output'), width)!r}")
        else:
            who = turn.get("role") or kind
            lines.append(f"  {who}: {_short(turn.get('text'), width)!r}")
    for k, call in enumerate(r.get("model_calls", [])):
        if "generated" in call:
            lines.append(
                f"  model call {k} generated ({call.get('generated_tokens')} tokens): {_short(call['generated'], width)!r}"
            )
    return "\n".join(lines)


def report(records: Sequence[dict[str, Any]], *, worst: int = 3, best: int = 3, width: int = 400) -> str:
    """Summary per environment, then the worst/best valid rollouts and the masked ones apart."""
    valid = [r for r in records if not r.get("masked_reason")]
    masked = [r for r in records if r.get("masked_reason")]
    by_env: dict[str, list[float]] = defaultdict(list)
    for r in valid:
        by_env[str(r.get("env"))].append(float(r.get("gym_reward") or 0.0))
    out = [f"{len(records)} rollouts, {len(masked)} masked " + str(dict(Counter(r["masked_reason"] for r in masked)))]
    for env, rewards in sorted(by_env.items()):
        out.append(f"  {env}: {len(rewards)} valid, mean gym_reward {sum(rewards) / len(rewards):.3f}")
    ranked = sorted(valid, key=lambda r: (float(r.get("gym_reward") or 0.0), -int(r.get("generated_tokens") or 0)))
    if worst and ranked:
        out.append(f"\n=== worst {min(worst, len(ranked))} ===")
        out.extend(format_record(r, width) for r in ranked[:worst])
    if best and ranked:
        out.append(f"\n=== best {min(best, len(ranked))} ===")
        out.extend(format_record(r, width) for r in ranked[::-1][:best])
    if masked:
        out.append(f"\n=== masked ({len(masked)}; first {min(len(masked), max(worst, 1))}) ===")
        out.extend(format_record(r, width) for r in masked[: max(worst, 1)])
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m nemo_gym_adapter.rollouts.dump_view", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("dir", type=Path, help="the dump directory, or verl's trainer.rollout_data_dir")
    p.add_argument("--step", type=int, default=None, help="the step to show (default: the newest)")
    p.add_argument("--val", action="store_true", help="validation rollouts instead of training ones")
    p.add_argument("--env", default=None, help="only this environment")
    p.add_argument("--worst", type=int, default=3)
    p.add_argument("--best", type=int, default=3)
    p.add_argument("--full", action="store_true", help="do not shorten texts")
    args = p.parse_args(argv)
    partition = "val" if args.val else "train"
    try:
        root = dump_root(args.dir)
        available = steps(root, partition)
        if not available:
            raise FileNotFoundError(f"{root / partition}: no step files")
        step = available[-1] if args.step is None else args.step
        records = load(root, partition, step)
    except (OSError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.env is not None:
        records = [r for r in records if r.get("env") == args.env]
    print(f"{partition} step {step} ({root}); steps available: {available[0]}..{available[-1]}")
    print(report(records, worst=args.worst, best=args.best, width=0 if args.full else 400))
    return 0


if __name__ == "__main__":
    sys.exit(main())
