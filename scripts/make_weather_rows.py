"""The tool model's weather rows: Gym 0.7.0's stock ``example_single_tool_call`` task (a personal assistant with one
tool, ``get_weather(city)``; the verifier rewards a rollout that called it), with many more rows than the 5 Gym ships.

    python scripts/make_weather_rows.py [--out configs/data] [--train 256] [--val 32] [--seed 2025]

writes ``weather_train.jsonl`` and ``weather_val.jsonl`` (committed; ``tests/unit/data/test_weather_rows.py``
regenerates them and compares bytes, so they are never hand-edited). Each row is the environment's own format: its
developer prompt, a user message and its ``get_weather`` tool schema (copied from Gym's example rows).

What is learned: that a question whose answer depends on the weather -- asked outright ("weather in Oslo?") or not
("do I need an umbrella in Oslo?", "good day for the beach in Nice?") -- is answered by calling the tool first and
then answering from what it returned: two model calls, the second after the tool's output (multi-turn by
construction when solved). The validation rows ask about cities the training rows never name (held out by city), in
the same phrasings.
"""

from __future__ import annotations

import random

from nemo_gym_adapter.data.row_files import split_parser, write_jsonl

AGENT = "example_single_tool_call_simple_agent"
TRAIN_FILE, VAL_FILE = "weather_train.jsonl", "weather_val.jsonl"
# Gym's example rows' developer prompt and tool, verbatim
DEVELOPER = "You are a helpful personal assistant that aims to be helpful and reduce any pain points the user has."
TOOL = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": ""}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
    "type": "function",
    "description": "",
}
CITIES = (
    "Oslo", "Paris", "Tokyo", "Lima", "Cairo", "Denver", "Seattle", "Madrid", "Rome", "Berlin", "Dublin", "Lisbon",
    "Toronto", "Chicago", "Boston", "Miami", "Austin", "Phoenix", "Sydney", "Perth", "Auckland", "Nairobi", "Lagos",
    "Mumbai", "Delhi", "Seoul", "Osaka", "Hanoi", "Manila", "Jakarta", "Bangkok", "Dubai", "Istanbul", "Athens",
    "Vienna", "Prague", "Warsaw", "Helsinki", "Stockholm", "Copenhagen", "Amsterdam", "Brussels", "Zurich", "Geneva",
    "Milan", "Naples", "Nice", "Lyon", "Edinburgh", "Glasgow", "Reykjavik", "Havana", "Bogota", "Quito", "Santiago",
    "Montreal", "Vancouver", "Calgary", "Anchorage", "Honolulu", "Atlanta", "Dallas", "Portland", "Houston",
)  # fmt: skip
# How users ask: outright, or about something that depends on the weather (Gym's own rows mix both: "what's it like
# in sf?", "going out in sf tn", "humidity in sf")
ASKS = (
    "what's the weather in {}?",
    "weather in {} right now?",
    "how's the weather looking in {} today?",
    "is it raining in {}?",
    "how cold is it in {}?",
    "what's it like outside in {}?",
    "do I need an umbrella in {} today?",
    "should I wear a jacket in {} tonight?",
    "going for a run in {} this evening, what's it like out?",
    "is it a good day for a picnic in {}?",
    "heading to {} tomorrow, what should I pack?",
    "can I dry laundry outside in {} today?",
    "humidity in {}",
    "going out in {} tn",
    "is it beach weather in {}?",
    "flying into {} later, will it be windy?",
)


def row(city: str, ask: str) -> dict:
    return {
        "responses_create_params": {
            "input": [
                {"content": DEVELOPER, "role": "developer"},
                {"content": ask.format(city), "role": "user"},
            ],
            "tools": [TOOL],
        },
        "agent_ref": {"name": AGENT},
    }


def make(n_train: int, n_val: int, seed: int, val_cities: int = 12) -> tuple[list[dict], list[dict]]:
    """Training rows over the cities left after ``val_cities`` are held out for validation."""
    rng = random.Random(seed)
    cities = list(CITIES)
    rng.shuffle(cities)
    held, kept = cities[:val_cities], cities[val_cities:]
    pairs = {
        "val": [(c, a) for c in held for a in ASKS],
        "train": [(c, a) for c in kept for a in ASKS],
    }
    for name, want in (("val", n_val), ("train", n_train)):
        if want > len(pairs[name]):
            raise ValueError(f"only {len(pairs[name])} distinct {name} rows; asked for {want}")
        rng.shuffle(pairs[name])
    return [row(*p) for p in pairs["train"][:n_train]], [row(*p) for p in pairs["val"][:n_val]]


def main(argv: list[str] | None = None) -> int:
    p = split_parser(__doc__)
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
