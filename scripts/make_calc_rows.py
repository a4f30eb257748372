"""Alternate-universe calculator rows: Gym 0.7.0's stock ``math_advanced_calculations`` task (one tool per operation --
``add``, ``multiply``, ``sin``, ... -- each of which computes something else than its name says: ``add(a, b)`` is
``a + b + 1.2``, ``multiply`` ``1.1 * a * b``, ``sin`` the cosine, ...; the verifier rewards a rollout whose tool
outputs include every value asked for, exactly), with expressions a 0.5B model can chain.

    python scripts/make_calc_rows.py [--out configs/data] [--train 240] [--val 50] [--guided 60] [--seed 2025]

writes ``calc_train.jsonl``, ``calc_val.jsonl`` and ``calc_train_guided.jsonl`` (committed; ``tests/unit/data/test_calc_rows.py`` regenerates them
and compares bytes, so they are never hand-edited). Each row is the environment's own format: the user's request, the
tools it needs among the environment's
eleven tool schemas (copied from Gym's example rows; five per row, the others drawn at random), ``ground_truth`` (a JSON list of the values, one
per requested expression, computed with the environment's own arithmetic), ``depth``/``breadth``/``id`` (which the
environment requires), ``agent_ref`` to ``math_advanced_calculations_simple_agent``, and ``family``.

What is learned: the answer can only come from the tools. No arithmetic the model knows gives ``add(2.0, 3.0)`` =
6.2, and in a nested expression the inner call's *returned* value -- not the true arithmetic -- must be passed on to
the outer call: ``(2.0 * 3.0) + 4.0`` is ``multiply(2.0, 3.0)`` -> 6.6000000000000005, then ``add(6.6000000000000005,
4.0)`` -> 11.8. So a solved depth-2 row is at least two model calls, the second built from what the first returned
(the verifier compares floats exactly: the returned number must be copied as returned). Families by shape: one
operation (depth 1), two values at once (depth 1, breadth 2), an operation on an operation's result (depth 2). The
validation rows (greedy) are held out by numbers (operands training never uses) and by family (chains of three
operations and operations training never asks for: ``log``, ``power``, ``pi``).

``calc_train_guided.jsonl`` (training operands, its own random stream: the two other files do not move with it) is a
curriculum for the chain: depth-2 requests whose text also spells out the two calls -- "First call multiply with
a=3.0, b=2.0; then call cos with radians=the number multiply returned." -- so that sampled rollouts pass a returned
value on often enough for a GRPO group to hold both outcomes (the untrained 0.5B solved 2 of 320 sampled plain
chained rollouts: docs/BENCHMARKS.md). The verifier is the environment's; only the request says more.
"""

from __future__ import annotations

import functools
import json
import math
import random
import re
from collections.abc import Callable

from nemo_gym_adapter.data.row_files import split_parser, write_jsonl

AGENT = "math_advanced_calculations_simple_agent"
TRAIN_FILE, VAL_FILE, GUIDED_FILE = "calc_train.jsonl", "calc_val.jsonl", "calc_train_guided.jsonl"


def _tool(name: str, description: str, params: dict[str, str]) -> dict:
    return {
        "type": "function",
        "name": name,
        "description": description,
        "parameters": {
            "properties": {k: {"type": "number", "description": d} for k, d in params.items()},
            "type": "object",
            "required": list(params),
            "additionalProperties": False,
        },
        "strict": True,
    }


# Gym's example rows' tools, verbatim and in their order
TOOLS = [
    _tool(
        "multiply", "Multiply two numbers; a * b.", {"a": "First number to multiply", "b": "Second number to multiply"}
    ),
    _tool(
        "divide",
        "Divide two numbers; a / b. Division is neither commutative nor associative.",
        {"a": "Numerator", "b": "Denominator"},
    ),
    _tool("add", "Add two numbers; a + b.", {"a": "First number to add", "b": "Second number to add"}),
    _tool("sin", "The sine of an angle in radians.", {"radians": "Angle in radians"}),
    _tool("cos", "The cosine of an angle in radians.", {"radians": "Angle in radians"}),
    _tool("subtract", "Subtract two numbers; a - b.", {"a": "Number to subtract from", "b": "Number to subtract"}),
    _tool("power", "Raise a number to a power; a ** b.", {"a": "Base number", "b": "Exponent"}),
    _tool(
        "log",
        "Take the log of a number; log(a, base). The base is always positive in this alternate universe.",
        {"a": "Number to take the logarithm of", "base": "Base of the logarithm"},
    ),
    _tool("pi", "Returns a precise value of PI for this alternate universe.", {}),
    _tool("negate", "Negate a number; -a.", {"a": "Number to negate"}),
    _tool("return_constant", "Return a constant number: a with no modifications", {"a": "Number to return"}),
]

# The environment's arithmetic (resources_servers/math_advanced_calculations/math_advanced_calculations_tools.py):
# the values its tools return, so the ground truth is what a correct chain of calls produces, bit for bit.
BINARY: dict[str, tuple[str, Callable[[float, float], float]]] = {
    "+": ("({} + {})", lambda a, b: a + b + 1.2),
    "-": ("({} - {})", lambda a, b: a - b - 3),
    "*": ("({} * {})", lambda a, b: 1.1 * a * b),
    "/": ("({} / {})", lambda a, b: 0.5 * a / b),
    "**": ("{} ** {}", lambda a, b: a ** (b + 2)),
    "log": ("log({}, {})", lambda a, b: math.log(a, abs(b + 1.5))),
}
UNARY: dict[str, tuple[str, Callable[[float], float]]] = {
    "sin": ("sin({})", math.cos),
    "cos": ("cos({})", math.sin),
    "neg": ("-({})", lambda a: a),
}
TOOL_OF = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide", "**": "power", "log": "log", "sin": "sin",
           "cos": "cos", "neg": "negate", "pi": "pi"}  # fmt: skip
TOOLS_PER_ROW = 5
TRAIN_OPS = ("+", "-", "*", "/", "sin", "cos", "neg")
HELD_OUT_OPS = ("**", "log", "pi")

Expr = tuple[str, float]  # (text, value)


def _leaf(rng: random.Random, val: bool) -> Expr:
    # whole numbers written as Gym writes them ("7.0"); validation draws from operands training never uses
    n = rng.randint(10, 19) if val else rng.randint(1, 9)
    return f"{float(n)}", float(n)


def _apply(rng: random.Random, op: str, args: list[Expr], val: bool) -> Expr:
    if op == "pi":
        return "pi", math.e
    if op in UNARY:
        form, fn = UNARY[op]
        return form.format(args[0][0]), fn(args[0][1])
    form, bfn = BINARY[op]
    a, b = args[0], args[1] if len(args) > 1 else _leaf(rng, val)
    if op == "**":  # a small power: base 2-4, exponent 0 or 1 (the tool adds 2)
        base, exponent = float(rng.randint(2, 4)), float(rng.randint(0, 1))
        a, b = (f"{base}", base), (f"{exponent}", exponent)
    if op == "log" and a[1] <= 0:  # the tool's log of a non-positive number is an error, not a value
        a = _leaf(rng, val)
    return form.format(a[0], b[0]), bfn(a[1], b[1])


def expression(rng: random.Random, depth: int, ops: tuple[str, ...], val: bool, first: str | None = None) -> Expr:
    """An expression of ``depth`` nested operations (the innermost first: ``first`` when given)."""
    expr = _leaf(rng, val)
    for level in range(depth):
        op = first if (level == 0 and first) else rng.choice([o for o in ops if o != "pi"])
        if op == "pi":
            expr = _apply(rng, op, [], val)
            continue
        args = [expr, _leaf(rng, val)] if op in BINARY else [expr]
        if op in BINARY and rng.random() < 0.5 and level > 0:
            args.reverse()
        expr = _apply(rng, op, args, val)
    return expr


_LITERAL = re.compile(r"\d+\.\d+")


def shortcuts(text: str) -> set[float]:
    """Values one call on the expression's own literals gives (any tool, any two of them, either order): a nested
    expression whose value is among them could be solved without using what an inner call returned (1.1 * 1.5 * 8.0
    is 1.1 * 6.0 * 2.0), so it is never asked."""
    nums = [float(x) for x in _LITERAL.findall(text)]
    out = {fn(a) for a in nums for _, fn in UNARY.values()} | {math.e}
    for a in nums:
        for b in nums:
            for _, fn in BINARY.values():
                try:
                    out.add(fn(a, b))
                except (ValueError, ZeroDivisionError, OverflowError):
                    pass
    return out


def _request(exprs: list[Expr], hint: str = "") -> str:
    if len(exprs) == 1:
        return f"Get me the value for {exprs[0][0]} using only the given tools.{hint}"
    return (
        f"Get me the values for {', '.join(e[0] for e in exprs[:-1])} and {exprs[-1][0]} using only the given "
        f"tools.{hint}"
    )


Family = Callable[[random.Random, bool], tuple[list[Expr], int]]


def one_operation(rng: random.Random, val: bool) -> tuple[list[Expr], int]:
    return [expression(rng, 1, TRAIN_OPS, val)], 1


def two_values(rng: random.Random, val: bool) -> tuple[list[Expr], int]:
    return [expression(rng, 1, TRAIN_OPS, val), expression(rng, 1, TRAIN_OPS, val)], 1


def chained(rng: random.Random, val: bool) -> tuple[list[Expr], int]:
    return [expression(rng, 2, TRAIN_OPS, val)], 2


def chain_of_three(rng: random.Random, val: bool) -> tuple[list[Expr], int]:
    return [expression(rng, 3, TRAIN_OPS, val)], 3


def new_operation(rng: random.Random, val: bool) -> tuple[list[Expr], int]:
    op = rng.choice(HELD_OUT_OPS)
    if op == "pi":
        inner = expression(rng, 1, TRAIN_OPS, val)
        return [("pi", math.e), inner], 1
    return [expression(rng, 1, (op,), val, first=op)], 1


def _params(op: str) -> list[str]:
    """The argument names of ``op``'s tool, in its schema's order."""
    (tool,) = [t for t in TOOLS if t["name"] == TOOL_OF[op]]
    return list(tool["parameters"]["properties"])


def _call(op: str, args: list[str]) -> str:
    return f"call {TOOL_OF[op]} with {', '.join(f'{p}={a}' for p, a in zip(_params(op), args, strict=True))}"


def guided_chain(rng: random.Random, val: bool) -> tuple[list[Expr], int, str]:
    """A depth-2 expression of the training operations and the sentence that spells out its two calls, the outer
    call's returned-value argument named, not given (the model still has to copy what the first call returned)."""
    inner_op, outer_op = rng.choice(TRAIN_OPS), rng.choice(TRAIN_OPS)
    leaf = _leaf(rng, val)
    inner_args = [leaf, _leaf(rng, val)] if inner_op in BINARY else [leaf]
    inner = _apply(rng, inner_op, inner_args, val)
    outer_args = [inner, _leaf(rng, val)] if outer_op in BINARY else [inner]
    if outer_op in BINARY and rng.random() < 0.5:
        outer_args.reverse()
    outer = _apply(rng, outer_op, outer_args, val)
    returned = f"the number {TOOL_OF[inner_op]} returned"
    hint = (
        f" First {_call(inner_op, [a for a, _ in inner_args])}; then "
        f"{_call(outer_op, [returned if x is inner else x[0] for x in outer_args])}."
    )
    return [outer], 2, hint


TRAIN_FAMILIES: dict[str, Family] = {f.__name__: f for f in (one_operation, two_values, chained)}
HELD_OUT_FAMILIES: dict[str, Family] = {f.__name__: f for f in (chain_of_three, new_operation)}


def _needed(text: str) -> set[str]:
    """The tools an expression's text calls for (its operators and functions)."""
    names = {TOOL_OF[f] for f in ("sin", "cos", "log") if f"{f}(" in text}
    names |= {"pi"} if re.search(r"\bpi\b", text) else set()
    names |= {"power"} if "**" in text else set()
    names |= {"negate"} if re.search(r"(^|[\s(,])-\(", text) else set()
    names |= {TOOL_OF[o] for o in ("+", "*", "/") if f" {o} " in text} | ({"subtract"} if " - " in text else set())
    return names


def tools_for(rng: random.Random, exprs: list[Expr]) -> list[dict]:
    """The row's tools: every one its expressions need, then others drawn at random up to :data:`TOOLS_PER_ROW`, in
    Gym's order. Gym's own rows list all eleven (~900 prompt tokens of schemas); five keep the choice between tools
    and a third of the prompt, which is what a 2-core training step pays for."""
    needed = set().union(*(_needed(t) for t, _ in exprs))
    others = [t["name"] for t in TOOLS if t["name"] not in needed and t["name"] != "return_constant"]
    chosen = needed | set(rng.sample(others, max(0, TOOLS_PER_ROW - len(needed))))
    return [t for t in TOOLS if t["name"] in chosen]


def row(family: str, exprs: list[Expr], depth: int, index: int, tools: list[dict], hint: str = "") -> dict:
    return {
        "responses_create_params": {
            "input": [{"role": "user", "content": _request(exprs, hint)}],
            "tools": tools,
            "parallel_tool_calls": False,
        },
        "ground_truth": json.dumps([v for _, v in exprs]),
        "id": index,
        "depth": depth,
        "breadth": len(exprs),
        "agent_ref": {"name": AGENT},
        "family": family,
    }


def _fresh(draw: Callable[[], tuple[list[Expr], int, str]], name: str, seen: set[str]) -> tuple[list[Expr], int, str]:
    """The first of up to 200 draws whose request (without its hint) is not in ``seen`` -- then added --, whose values
    are finite and, nested, none of which one call on the expression's own literals gives (:func:`shortcuts`)."""
    for _attempt in range(200):
        exprs, depth, hint = draw()
        text = _request(exprs)
        nested = [(t, v) for t, v in exprs if depth > 1]
        if (
            text not in seen
            and all(math.isfinite(v) for _, v in exprs)
            and not any(v in shortcuts(t) for t, v in nested)
        ):
            seen.add(text)
            return exprs, depth, hint
    raise ValueError(f"{name}: no new finite expression in 200 draws")


def _unhinted(family: Family, rng: random.Random, val: bool) -> tuple[list[Expr], int, str]:
    exprs, depth = family(rng, val)
    return exprs, depth, ""


def _draw(rng: random.Random, families: dict[str, Family], per_family: int, val: bool, seen: set[str]) -> list[tuple]:
    drawn = []
    for name, family in families.items():
        for _ in range(per_family):
            exprs, depth, _ = _fresh(functools.partial(_unhinted, family, rng, val), name, seen)
            drawn.append((name, exprs, depth, tools_for(rng, exprs)))
    rng.shuffle(drawn)
    return drawn


def make(n_train: int, n_val: int, seed: int) -> tuple[list[dict], list[dict]]:
    """``n_train`` rows over the training families and ``n_val`` validation rows over every family (equal shares,
    validation's operands); validation is drawn first from its own generator, so it does not move with the training
    size."""
    families = len(TRAIN_FAMILIES) + len(HELD_OUT_FAMILIES)
    if n_val % families:
        raise ValueError(f"--val {n_val}: a multiple of {families} (every family, equal shares) is needed")
    if n_train % len(TRAIN_FAMILIES):
        raise ValueError(f"--train {n_train}: a multiple of {len(TRAIN_FAMILIES)} (the training families) is needed")
    seen: set[str] = set()
    val_rng, train_rng = random.Random(seed), random.Random(seed + 1)
    val = _draw(val_rng, {**TRAIN_FAMILIES, **HELD_OUT_FAMILIES}, n_val // families, True, seen)
    train = _draw(train_rng, TRAIN_FAMILIES, n_train // len(TRAIN_FAMILIES), False, seen)
    return (
        [row(f, e, d, i, t) for i, (f, e, d, t) in enumerate(train)],
        [row(f, e, d, i, t) for i, (f, e, d, t) in enumerate(val)],
    )


def make_guided(n: int, seed: int, taken: list[dict]) -> list[dict]:
    """``n`` guided depth-2 training rows (:func:`guided_chain`), family ``guided_chain``, from their own random
    stream; no expression of ``taken``'s rows (the training and validation rows) is asked again, none has a one-call
    shortcut."""
    rng, seen = random.Random(seed + 2), {r["responses_create_params"]["input"][0]["content"] for r in taken}
    rows = []
    for index in range(n):
        exprs, depth, hint = _fresh(functools.partial(guided_chain, rng, False), "guided_chain", seen)
        rows.append(row("guided_chain", exprs, depth, index, tools_for(rng, exprs), hint))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = split_parser(__doc__, train=240, val=50)
    p.add_argument("--guided", type=int, default=60, help="guided depth-2 training rows (calc_train_guided.jsonl)")
    args = p.parse_args(argv)
    try:
        train, val = make(args.train, args.val, args.seed)
        guided = make_guided(args.guided, args.seed, train + val)
    except ValueError as e:
        p.error(str(e))
    args.out.mkdir(parents=True, exist_ok=True)
    write_jsonl(train, args.out / TRAIN_FILE)
    write_jsonl(val, args.out / VAL_FILE)
    write_jsonl(guided, args.out / GUIDED_FILE)
    print(
        f"{len(train)} training rows -> {args.out / TRAIN_FILE}, {len(val)} validation rows -> {args.out / VAL_FILE}, "
        f"{len(guided)} guided rows -> {args.out / GUIDED_FILE}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
