"""Rows by how often a policy solves them: keep the ones it sometimes solves (dynamic sampling, done once, offline).

GRPO learns only from groups whose samples disagree: a row every sample fails (or every sample solves) gives each
sample an advantage of zero, and its rollouts cost a step's generation and update for nothing. DAPO drops such groups
online and samples more; on a machine where a step is minutes, measuring the rows once before training is cheaper:

    python -m nemo_gym_adapter.collect --env ENV --data train.jsonl --model M --repeats 4 --temperature 1 \\
        --output measured.jsonl
    python -m nemo_gym_adapter.data.pass_rates --rows train.jsonl --rollouts measured.jsonl --out mixed.jsonl

keeps, in file order and byte for byte, the rows whose pass rate ``p`` (rollouts solved among the unmasked ones:
reward > 0, or reward >= ``--success-threshold`` as the recipe's ``nemo_gym.metrics.success_threshold``) satisfies
``above < p < below`` (default ``0 < p < 1``: mixed outcomes), and says for every row of ``--rows`` which way it
went: kept, never solved, always solved, outside the range, not measured (no rollout of it in the files), only masked.
With a shaped reward (Gym's reward not only 0 or 1) a row can be solved by every sample and still teach GRPO -- its
rewards differ, so its advantages are not zero: ``--by reward`` keeps the rows whose unmasked rewards are not all
equal, what verl's online group filter (``algorithm.filter_groups``, metric ``gym_outcome``) keeps, and by default
such rows are counted in a note. A rollout is matched to its row by what was asked -- the row's input messages and
its tools' names, as Gym echoes them in the rollout's ``responses_create_params`` -- not by a position, so files of
several runs, ``--limit`` and ``--repeats`` all work. A rollout that matches no row is counted, never guessed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_gym_adapter.data.jsonl import read_objects
from nemo_gym_adapter.errors import DatasetError

KEPT, NEVER, ALWAYS, OUTSIDE, UNMEASURED, MASKED = (
    "kept",
    "never_solved",
    "always_solved",
    "outside_range",
    "not_measured",
    "only_masked",
)


def request_key(params: Mapping[str, Any]) -> str:
    """What a row asks, as a rollout echoes it: each input message's role and content, and the tools' names.

    Gym adds fields to the messages it echoes (``type``, ``phase``); role and content are what the row wrote.
    """
    given = params.get("input")
    if isinstance(given, str):  # Responses API: a bare string is one user message
        messages: list[list[Any]] = [["user", given]]
    else:
        messages = [[m.get("role"), m.get("content")] if isinstance(m, Mapping) else [None, m] for m in given or ()]
    tools = sorted(str(t.get("name")) for t in params.get("tools") or () if isinstance(t, Mapping))
    return json.dumps([messages, tools], sort_keys=True, ensure_ascii=False)


@dataclass
class Tally:
    solved: int = 0
    unsolved: int = 0
    masked: int = 0
    rewards: set[float] = field(default_factory=set)  # the distinct rewards of the unmasked rollouts

    @property
    def spread(self) -> bool:
        """The unmasked rollouts' rewards differ: GRPO's advantages are not all zero."""
        return len(self.rewards) > 1

    @property
    def rate(self) -> float | None:
        n = self.solved + self.unsolved
        return self.solved / n if n else None


@dataclass
class Selection:
    kept: list[str]  # the kept rows' lines, as written
    verdicts: list[tuple[int, str, float | None]]  # (line number, verdict, pass rate) for every row of --rows
    unmatched_rollouts: int = 0
    spread_not_kept: int = 0  # rows never or always solved whose rewards differ (a shaped reward's signal)

    @property
    def counts(self) -> Counter[str]:
        """Rows per verdict."""
        return Counter(verdict for _, verdict, _ in self.verdicts)


def is_solved(reward: float, threshold: float | None = None) -> bool:
    """Gym's reward as a success: ``reward > 0``, or ``reward >= threshold`` when one is given (the recipe's rule)."""
    return reward > 0 if threshold is None else reward >= threshold


def tally(rollouts: Iterable[Mapping[str, Any]], threshold: float | None = None) -> tuple[dict[str, Tally], int]:
    """Per request key, the rollouts solved, unsolved and masked; and how many rollouts carried no request."""
    out: dict[str, Tally] = {}
    no_request = 0
    for r in rollouts:
        result = r.get("result")
        params = result.get("responses_create_params") if isinstance(result, Mapping) else None
        if not isinstance(params, Mapping):
            no_request += 1
            continue
        t = out.setdefault(request_key(params), Tally())
        reward = r.get("reward")
        if r.get("masked_reason") or reward is None:
            t.masked += 1
        else:
            t.rewards.add(float(reward))
            if is_solved(float(reward), threshold):
                t.solved += 1
            else:
                t.unsolved += 1
    return out, no_request


def select(
    rows: Sequence[tuple[int, str, Mapping[str, Any]]],
    tallies: Mapping[str, Tally],
    above: float = 0.0,
    below: float = 1.0,
    by: str = "success",
) -> Selection:
    """``rows``: (line number, line as written, parsed row). Keeps ``above < pass rate < below`` (``by="success"``)
    or the rows whose rewards differ (``by="reward"``)."""
    sel = Selection(kept=[], verdicts=[])
    used = set()
    for number, line, row in rows:
        key = request_key(row.get("responses_create_params") or {})
        t = tallies.get(key)
        used.add(key)
        rate = t.rate if t else None
        if t is None:
            verdict = UNMEASURED
        elif rate is None:
            verdict = MASKED
        elif t.spread if by == "reward" else above < rate < below:
            verdict = KEPT
            sel.kept.append(line)
        elif rate == 0.0:
            verdict = NEVER
        elif rate == 1.0:
            verdict = ALWAYS
        else:
            verdict = OUTSIDE
        sel.verdicts.append((number, verdict, rate))
        if verdict in (NEVER, ALWAYS) and t is not None and t.spread:
            sel.spread_not_kept += 1
    sel.unmatched_rollouts = sum(t.solved + t.unsolved + t.masked for k, t in tallies.items() if k not in used)
    return sel


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--rows", type=Path, required=True, help="the Gym JSONL the rollouts were collected from")
    p.add_argument("--rollouts", type=Path, action="append", required=True, help="collect --output files (repeatable)")
    p.add_argument("--out", type=Path, required=True, help="where the kept rows go (JSONL, rows as written)")
    p.add_argument("--above", type=float, default=0.0, help="keep pass rates above this (default 0)")
    p.add_argument("--below", type=float, default=1.0, help="keep pass rates below this (default 1)")
    p.add_argument(
        "--success-threshold",
        type=float,
        default=None,
        help="a rollout is solved when its reward is at least this (default: reward > 0), as nemo_gym.metrics",
    )
    p.add_argument(
        "--by",
        choices=("success", "reward"),
        default="success",
        help="success: keep pass rates in (--above, --below); reward: keep rows whose rewards differ (verl's filter)",
    )
    args = p.parse_args(argv)
    if not 0.0 <= args.above < args.below <= 1.0:
        p.error(f"need 0 <= --above < --below <= 1, got {args.above} and {args.below}")
    try:
        rows = list(read_objects(str(args.rows)))
        for number, _, row in rows:
            if not isinstance(row.get("responses_create_params"), dict):
                raise DatasetError(f"{args.rows}:{number}: no responses_create_params object")
        rollouts = [obj for path in args.rollouts for _, _, obj in read_objects(str(path))]
    except DatasetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    tallies, no_request = tally(rollouts, args.success_threshold)
    sel = select(rows, tallies, args.above, args.below, args.by)
    if no_request or sel.unmatched_rollouts:
        print(
            f"note: of {len(rollouts)} rollouts, {sel.unmatched_rollouts} asked for no row of {args.rows} (rows of "
            f"another file, or the same questions with other tools?) and {no_request} carried no request (not a "
            "collect --output line: a training run's dump has no responses_create_params)",
            file=sys.stderr,
        )
    if sel.spread_not_kept:
        print(
            f"note: {sel.spread_not_kept} rows never or always solved got different rewards (a shaped reward): their "
            "groups carry signal for GRPO; --by reward keeps them, as verl's group filter does",
            file=sys.stderr,
        )
    if not sel.kept:
        wanted = "rewards that differ" if args.by == "reward" else f"a pass rate in ({args.above}, {args.below})"
        print(f"error: no row of {args.rows} has {wanted}; {_summary(sel)}")
        return 1
    args.out.write_text("".join(line + "\n" for line in sel.kept), encoding="utf-8")
    print(f"{len(sel.kept)} of {len(rows)} rows -> {args.out}; {_summary(sel)}")
    return 0


def _summary(sel: Selection) -> str:
    counts = sel.counts
    return ", ".join(f"{k} {counts[k]}" for k in (KEPT, NEVER, ALWAYS, OUTSIDE, UNMEASURED, MASKED) if counts[k])


if __name__ == "__main__":
    raise SystemExit(main())
