"""The SmolLM2 learning run's rows: deterministic arithmetic in Gym 0.7.0's ``math_with_judge`` row format.

    python scripts/make_arith_data.py [--out configs/data] [--train 512] [--val 96] [--seed 2025]

writes ``smollm2_arith_train.jsonl`` and ``smollm2_arith_val.jsonl`` (committed; ``tests/unit/data/test_arith_data.py``
regenerates them and compares bytes, so they are never hand-edited). Each row is math_with_judge's own format
(``responses_create_params.input``, ``question``, ``expected_answer``) plus its ``agent_ref``; the server scores with
math-verify when ``should_use_judge: false``. The prompt is a system line, one worked example as an earlier turn (the
answer format "... The answer is \\boxed{N}.": zero-shot the 135M model never writes ``\\boxed{}``) and the question;
the model answers in free text. Families, mixed evenly: two-digit addition, two-digit subtraction, one-step word
problems. The validation rows come first from the seeded generator and no validation question occurs in training.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

AGENT = "math_with_judge_simple_agent"
SYSTEM = "You are a helpful math assistant. Finish with the final answer in \\boxed{}."
DEMO = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "2 + 3 = 5. The answer is \\boxed{5}."},
]
NAMES = ["Tom", "Anna", "Ben", "Mia", "Sam", "Lily", "Max", "Emma", "Leo", "Zoe"]
THINGS = ["apples", "pencils", "marbles", "cookies", "stickers", "books", "cards", "balloons"]
FAMILIES = ("add2", "sub2", "word1")
TRAIN_FILE, VAL_FILE = "smollm2_arith_train.jsonl", "smollm2_arith_val.jsonl"


def question(family: str, rng: random.Random) -> tuple[str, int]:
    if family == "add2":
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return f"What is {a} + {b}?", a + b
    if family == "sub2":
        a, b = sorted((rng.randint(10, 99), rng.randint(10, 99)), reverse=True)
        return f"What is {a} - {b}?", a - b
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    if rng.random() < 0.5:
        return f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?", a + b
    return f"{name} has {a + b} {thing} and gives away {b}. How many {thing} does {name} have left?", a


def row(family: str, text: str, answer: int) -> dict:
    messages = [{"role": "system", "content": SYSTEM}, *DEMO, {"role": "user", "content": text}]
    return {
        "responses_create_params": {"input": messages},
        "question": text,
        "expected_answer": str(answer),
        "agent_ref": {"type": "responses_api_agents", "name": AGENT},
        "family": family,
    }


def make(n_train: int, n_val: int, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, validation) rows; the validation rows do not depend on ``n_train``."""
    rng = random.Random(seed)
    seen = {DEMO[0]["content"]}
    train: list[dict] = []
    val: list[dict] = []
    for target, out in ((n_val, val), (n_train, train)):
        while len(out) < target:
            family = FAMILIES[len(out) % len(FAMILIES)]
            text, answer = question(family, rng)
            if text not in seen:
                seen.add(text)
                out.append(row(family, text, answer))
    return train, val


def write(out: Path, train: list[dict], val: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in ((TRAIN_FILE, train), (VAL_FILE, val)):
        (out / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "configs" / "data")
    parser.add_argument("--train", type=int, default=512)
    parser.add_argument("--val", type=int, default=96)
    parser.add_argument("--seed", type=int, default=2025)
    args = parser.parse_args(argv)
    train, val = make(args.train, args.val, args.seed)
    write(args.out, train, val)
    print(f"{len(train)} training and {len(val)} validation rows -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
