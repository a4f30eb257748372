"""Math-with-tools rows: Gym 0.7.0's stock ``math_with_code`` task (a math assistant with one tool, ``execute_python``,
a stateful Python session per rollout; the verifier compares the last ``\\boxed{}`` of the final answer -- or one the
code printed -- with the row's ``expected_result``), on problems a short program answers exactly and a 0.5B model
cannot do in its head.

    python scripts/make_math_rows.py [--out configs/data] [--train 240] [--val 48] [--seed 2025]

writes ``math_code_train.jsonl`` and ``math_code_val.jsonl`` (committed; ``tests/unit/data/test_math_rows.py``
regenerates them and compares bytes, so they are never hand-edited). Each row is the environment's own format: its
README's system prompt and ``execute_python`` schema, verbatim (Gym ships them in its README, not as a file), one
question, the expected answer as a string, ``agent_ref`` to ``math_with_code_simple_agent``, and the problem's
``family`` (Gym ignores the extra field; reports group by it).

What is learned: to run the program instead of writing it in prose, then to answer from what it printed -- at least
two model calls, the second after the tool's output. The families span one-line programs (a product, a gcd) to
multi-step ones (primes in a range, dates, compound interest to the cent). Validation (greedy) is held out twice: its
numbers are drawn from ranges training never uses, and a quarter of its rows come from families training never sees.
Answers must survive the verifier: integers, a decimal with two places, digits in a base below 10, a weekday's name
(exact string match, else a float comparison at relative 1e-6). The executor's builtins are cut down (no ``pow``,
``round``, ``sorted``, ``all``...; ``import`` works): the questions never need them, but a program may.
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Callable

from nemo_gym_adapter.data.row_files import split_parser, write_jsonl

AGENT = "math_with_code_simple_agent"
TRAIN_FILE, VAL_FILE = "math_code_train.jsonl", "math_code_val.jsonl"
# math_with_code's README: the system prompt and the tool, verbatim
SYSTEM = (
    "# Instructions\nYou are a math assistant. When you need to perform calculations, use the execute_python tool to "
    "write and run Python code. Any result that can be used should be in a print statement so it can be captured by "
    "stdout. If there are multiple calculations and they depend on each other, you should use the execute_python tool "
    "to perform the calculations step by step. You have access to numpy, scipy, and pandas libraries. After "
    "completing all calculations, provide your final answer in the format: \\boxed{your_answer} \n\n# Available "
    'Tools\n- execute_python: Execute Python code to perform mathematical calculations\n\n# Example\nIf asked "What '
    'is 5 factorial?", you would use execute_python with code like:\n```python\nimport math\nresult = '
    'math.factorial(5)\nprint(f"5! = {result}")\n```'
)
TOOL = {
    "type": "function",
    "name": "execute_python",
    "description": "Execute Python code to perform calculations. You have access to numpy, scipy, pandas and basic math "
    "operations.",
    "parameters": {
        "properties": {
            "code": {
                "type": "string",
                "title": "Python Code",
                "description": "The Python code to execute for the calculation.",
            }
        },
        "type": "object",
        "required": ["code"],
        "additionalProperties": False,
    },
    "strict": True,
}
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")

Rng = random.Random
# A family draws (question, answer) from a generator and a scale: 0 = training's numbers, 1 = validation's (a range
# training never draws from, so no validation question is a training one with the same numbers).
Family = Callable[[Rng, int], tuple[str, str]]


def _span(rng: Rng, scale: int, train: tuple[int, int], val: tuple[int, int]) -> int:
    lo, hi = val if scale else train
    return rng.randint(lo, hi)


def product(rng: Rng, s: int) -> tuple[str, str]:
    a, b = _span(rng, s, (10_000, 69_999), (70_000, 99_999)), _span(rng, s, (1_000, 6_999), (7_000, 9_999))
    return f"What is {a} multiplied by {b}?", str(a * b)


def sum_of_multiples(rng: Rng, s: int) -> tuple[str, str]:
    k, n = rng.randint(3, 19), _span(rng, s, (1_000, 9_999), (10_000, 30_000))
    return f"What is the sum of all positive multiples of {k} that are at most {n}?", str(
        k * (n // k) * (n // k + 1) // 2
    )


def sum_of_squares(rng: Rng, s: int) -> tuple[str, str]:
    a = _span(rng, s, (10, 300), (301, 600))
    b = a + _span(rng, s, (50, 700), (701, 1_500))
    return f"What is the sum of the squares of all integers from {a} to {b} inclusive?", str(
        sum(i * i for i in range(a, b + 1))
    )


def modular_power(rng: Rng, s: int) -> tuple[str, str]:
    a, e, m = rng.randint(3, 97), _span(rng, s, (50, 400), (401, 900)), rng.choice((997, 1_009, 10_007, 65_537, 1_000))
    return f"What is the remainder when {a} raised to the power {e} is divided by {m}?", str(pow(a, e, m))


def gcd_of_two(rng: Rng, s: int) -> tuple[str, str]:
    g = rng.randint(7, 400)
    a, b = g * _span(rng, s, (100, 3_000), (3_001, 9_000)), g * _span(rng, s, (100, 3_000), (3_001, 9_000))
    return f"What is the greatest common divisor of {a} and {b}?", str(math.gcd(a, b))


def lcm_of_three(rng: Rng, s: int) -> tuple[str, str]:
    hi = 400 if s else 200
    a, b, c = (rng.randint(12, hi) for _ in range(3))
    return f"What is the least common multiple of {a}, {b} and {c}?", str(math.lcm(a, b, c))


def divisor_count(rng: Rng, s: int) -> tuple[str, str]:
    n = _span(rng, s, (1_000, 99_999), (100_000, 999_999))
    count = sum(2 if d * d != n else 1 for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return f"How many positive divisors does {n} have?", str(count)


def _date(rng: Rng, s: int) -> dt.date:
    year = _span(rng, s, (1950, 2010), (1900, 1949))
    return dt.date(year, 1, 1) + dt.timedelta(days=rng.randint(0, 364))


def days_between(rng: Rng, s: int) -> tuple[str, str]:
    a = _date(rng, s)
    b = a + dt.timedelta(days=rng.randint(400, 12_000))
    return f"How many days are there from {a.isoformat()} to {b.isoformat()}?", str((b - a).days)


def compound_interest(rng: Rng, s: int) -> tuple[str, str]:
    principal = rng.randint(10, 200) * 100 if not s else rng.randint(201, 500) * 100
    rate = rng.randint(150, 900) / 100
    years = rng.randint(3, 25)
    value = principal * (1 + rate / 100 / 12) ** (12 * years)
    return (
        f"${principal} is invested at {rate}% annual interest, compounded monthly, for {years} years. What is the "
        "final balance in dollars, rounded to the cent? Give the number only, with two decimals.",
        f"{value:.2f}",
    )


def base_conversion(rng: Rng, s: int) -> tuple[str, str]:
    base, n = rng.choice((2, 3, 5, 7, 8)), _span(rng, s, (500, 60_000), (60_001, 500_000))
    digits = ""
    m = n
    while m:
        m, d = divmod(m, base)
        digits = str(d) + digits
    return f"Write the decimal number {n} in base {base}. Give the digits only.", digits


def primes_count(rng: Rng, s: int) -> tuple[str, str]:
    a = _span(rng, s, (100, 5_000), (5_001, 20_000))
    b = a + rng.randint(500, 5_000)
    return f"How many prime numbers are there between {a} and {b} inclusive?", str(
        sum(1 for n in range(a, b + 1) if _is_prime(n))
    )


def fibonacci(rng: Rng, s: int) -> tuple[str, str]:
    n = _span(rng, s, (40, 120), (121, 200))
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return f"Let F(1) = F(2) = 1 and F(n) = F(n-1) + F(n-2). What is F({n})?", str(a)


# Families only validation asks: the habit (run it, read it, box it) carried to problems training never showed
def weekday(rng: Rng, s: int) -> tuple[str, str]:
    d = _date(rng, s)
    return f"On which day of the week did {d.isoformat()} fall? Answer with the day's name.", WEEKDAYS[d.weekday()]


def digit_sum_of_power(rng: Rng, s: int) -> tuple[str, str]:
    a, e = rng.randint(2, 9), rng.randint(50, 400)
    return f"What is the sum of the decimal digits of {a} to the power {e}?", str(sum(map(int, str(a**e))))


def collatz_steps(rng: Rng, s: int) -> tuple[str, str]:
    n, steps = rng.randint(100, 99_999), 0
    m = n
    while m != 1:
        m, steps = (m // 2 if m % 2 == 0 else 3 * m + 1), steps + 1
    return (
        f"Starting from {n}, repeatedly halve the number if it is even or replace it with 3 times it plus 1 if it is "
        "odd. How many steps does it take to reach 1?",
        str(steps),
    )


def sum_of_primes(rng: Rng, s: int) -> tuple[str, str]:
    n = rng.randint(1_000, 20_000)
    return f"What is the sum of all prime numbers below {n}?", str(sum(p for p in range(n) if _is_prime(p)))


def _is_prime(n: int) -> bool:
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


TRAIN_FAMILIES: dict[str, Family] = {
    f.__name__: f
    for f in (
        product,
        sum_of_multiples,
        sum_of_squares,
        modular_power,
        gcd_of_two,
        lcm_of_three,
        divisor_count,
        days_between,
        compound_interest,
        base_conversion,
        primes_count,
        fibonacci,
    )
}
HELD_OUT_FAMILIES: dict[str, Family] = {
    f.__name__: f for f in (weekday, digit_sum_of_power, collatz_steps, sum_of_primes)
}


def row(family: str, question: str, answer: str) -> dict:
    return {
        "responses_create_params": {
            "input": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "tools": [TOOL],
            "parallel_tool_calls": False,
        },
        "expected_result": answer,
        "agent_ref": {"name": AGENT},
        "family": family,
    }


def _draw(rng: Rng, families: dict[str, Family], per_family: int, scale: int, seen: set[str]) -> list[dict]:
    rows = []
    for name, family in families.items():
        for _ in range(per_family):
            for _attempt in range(100):
                question, answer = family(rng, scale)
                if question not in seen:
                    break
            else:
                raise ValueError(f"{name}: no new question in 100 draws")
            seen.add(question)
            rows.append(row(name, question, answer))
    rng.shuffle(rows)
    return rows


def make(n_train: int, n_val: int, seed: int) -> tuple[list[dict], list[dict]]:
    """``n_train`` rows over the training families (equal shares, training's number ranges) and ``n_val`` validation
    rows over every family, held-out ones included (equal shares, validation's ranges). Validation is drawn first
    from its own generator, so it does not move with the training size."""
    families = len(TRAIN_FAMILIES) + len(HELD_OUT_FAMILIES)
    if n_val % families:
        raise ValueError(f"--val {n_val}: a multiple of {families} (every family, equal shares) is needed")
    if n_train % len(TRAIN_FAMILIES):
        raise ValueError(f"--train {n_train}: a multiple of {len(TRAIN_FAMILIES)} (the training families) is needed")
    seen: set[str] = set()
    val_rng, train_rng = Rng(seed), Rng(seed + 1)
    val = _draw(val_rng, {**TRAIN_FAMILIES, **HELD_OUT_FAMILIES}, n_val // families, 1, seen)
    train = _draw(train_rng, TRAIN_FAMILIES, n_train // len(TRAIN_FAMILIES), 0, seen)
    return train, val


def main(argv: list[str] | None = None) -> int:
    p = split_parser(__doc__, train=240, val=48)
    args = p.parse_args(argv)
    try:
        train, val = make(args.train, args.val, args.seed)
    except ValueError as e:
        p.error(str(e))
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(train, args.out / TRAIN_FILE)
    write_jsonl(val, args.out / VAL_FILE)
    print(f"{len(train)} training rows -> {args.out / TRAIN_FILE}, {len(val)} validation rows -> {args.out / VAL_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
