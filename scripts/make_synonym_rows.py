"""The tool model's learning rows: Gym 0.7.0's stock ``example_multi_step`` task, with prompts short enough to train on
two CPU cores (Gym ships 5 example rows whose system prompt lists ~150 synonyms, ~2,300 tokens).

    python scripts/make_synonym_rows.py [--out configs/data] [--train 256] [--val 32] [--seed 2025] [--terms 3] [--target-synonyms 1,2]

writes ``synonyms_train.jsonl`` and ``synonyms_val.jsonl`` (committed; ``tests/unit/data/test_synonym_rows.py``
regenerates them and compares bytes, so they are never hand-edited). Each row is ``example_multi_step``'s own format:
a system prompt listing a few terms' synonyms, a user question about one of the terms, the environment's two tools
(``get_synonym_value``, ``extract_synonym_values``, copied from its example rows' schema), and the verifier fields
(``expected_synonyms``, ``expected_synonym_values`` = the sum of each synonym's character codes, what the tool
returns, ``minefield_label`` = the term itself and its value). The task is Gym's: call ``get_synonym_value`` for each
synonym of the term the question is about, in the listed order, then ``extract_synonym_values`` with the values; the
verifier rewards the exact list. So every rollout that solves it makes at least three model calls (two tool rounds and
an answer): multi-turn by construction.

The validation rows come first from the seeded generator and share no (question, synonym list) with training; the
terms and question templates are the same (the skill, not new words, is what is learned).
"""

from __future__ import annotations

import json
import random

from nemo_gym_adapter.data.row_files import split_parser, write_jsonl

AGENT = "example_multi_step_simple_agent"
PREFIX = "synonyms"  # the committed files; --prefix writes others
TRAIN_FILE, VAL_FILE = f"{PREFIX}_train.jsonl", f"{PREFIX}_val.jsonl"
SYSTEM = (
    "# Instructions\nYou are an extraction agent. Use the tools to find the values of the synonyms of the term the "
    "user's question is about: call get_synonym_value once for each of that term's synonyms, in the order they are "
    "listed below, then call extract_synonym_values with the values in that order. Only that term's synonyms count."
    # A worked example (a term no row uses), without a number: with "(say 400)" in it the model, greedy on 64 held-out
    # rows, began 30 with a runaway report of invented values (400, 500, ...) and 27 with a lookup, then looped on
    # lookups to max_steps: reward 0 everywhere. Without any example it answered in prose (0 of 32 called a tool).
    "\n\n# Example\nIf the question were about something tall and the list said \"The term 'Tall' has a synonym "
    '\'High\'.", you would first call get_synonym_value with {"synonym": "High"}; it answers with that synonym\'s '
    "value, a number. Then you would call extract_synonym_values with a list holding that number, and then answer in "
    "one short sentence. Never answer the question itself, and never report a value the tool has not given you: your "
    "first reply is a get_synonym_value call."
    "\n\n# Available synonyms\n"
)
# Greedy, the model answered the bare question in prose and called no tool (0 of 32 rows with the instructions alone).
ASK = "{} Use the tools: look up the values of the synonyms of the term this question is about."
# `--ask synonyms`: the user turn names the synonyms to look up, so what is left to learn is the multi-turn part (each
# lookup once, then the report with the values the tool gave). Asked about the term only, the model looked up the term
# itself and repeated that lookup to max_steps on 32 of 32 held-out rows, greedy.
ASK_NAMED = "{} Use the tools: look up {}, then report {} with extract_synonym_values."
# term -> (synonyms, questions about it)
TERMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "Hot": (("Blazing", "Warm", "Scorching"), ("Why are deserts so hot at noon?", "How do I cool down on a hot day?")),
    "Cold": (("Chilly", "Frosty", "Icy"), ("Why is the Arctic so cold?", "How do penguins survive the cold?")),
    "Fast": (("Quick", "Rapid", "Brisk"), ("What is the fastest land animal?", "How can I type faster?")),
    "Slow": (("Sluggish", "Leisurely", "Unhurried"), ("Why are snails so slow?", "Why is my laptop slow?")),
    "Happy": (("Joyful", "Cheerful", "Glad"), ("What makes people happy?", "How can I stay happy at work?")),
    "Sad": (("Unhappy", "Gloomy", "Downcast"), ("Why do sad songs feel good?", "How do I comfort a sad friend?")),
    "Big": (("Large", "Huge", "Vast"), ("What is the biggest whale?", "How big is the Pacific Ocean?")),
    "Small": (("Tiny", "Little", "Minute"), ("What is the smallest bird?", "How small can a computer chip be?")),
    "Loud": (("Noisy", "Booming", "Deafening"), ("Why are concerts so loud?", "How loud is a jet engine?")),
    "Quiet": (("Silent", "Hushed", "Calm"), ("Where is the quietest place on Earth?", "How do I keep a room quiet?")),
    "Bright": (("Shiny", "Vivid", "Radiant"), ("Why is the sun so bright?", "What makes a colour bright?")),
    "Dark": (("Dim", "Shadowy", "Murky"), ("Why is the deep sea dark?", "How do owls see in the dark?")),
    "Old": (("Ancient", "Aged", "Elderly"), ("What is the oldest tree alive?", "How old is the universe?")),
    "New": (("Fresh", "Modern", "Novel"), ("What is new in space research?", "How do I break in new shoes?")),
    "Rich": (("Wealthy", "Affluent", "Prosperous"), ("How did old merchants get rich?", "What makes soil rich?")),
    "Strong": (("Powerful", "Sturdy", "Robust"), ("What is the strongest metal?", "How do ants carry strong loads?")),
    "Weak": (("Feeble", "Frail", "Fragile"), ("Why do muscles get weak?", "What makes a password weak?")),
    "Wet": (("Damp", "Soaked", "Moist"), ("Why is the rainforest so wet?", "How do I dry wet shoes?")),
    "Dry": (("Arid", "Parched", "Dehydrated"), ("Why is the Sahara so dry?", "How do cacti survive dry years?")),
    "Angry": (("Furious", "Irate", "Cross"), ("Why do people get angry in traffic?", "How do I calm an angry dog?")),
}


def _value(synonym: str) -> int:
    return sum(map(ord, synonym))  # what example_multi_step's get_synonym_value returns


TOOLS = [
    {
        "type": "function",
        "name": "get_synonym_value",
        "description": "Get the synonym value for a synonym.",
        "parameters": {
            "properties": {"synonym": {"type": "string", "description": "The synonym to get the value for."}},
            "type": "object",
            "required": ["synonym"],
            "additionalProperties": False,
        },
        "strict": True,
    },
    {
        "type": "function",
        "name": "extract_synonym_values",
        "description": "Extract the synonym values you retrieved for the term that is relevant to the user query.",
        "parameters": {
            "properties": {
                "synonym_values": {
                    "items": {"type": "integer"},
                    "type": "array",
                    "description": "The synonym values corresponding to the term for the user query.",
                }
            },
            "type": "object",
            "required": ["synonym_values"],
            "additionalProperties": False,
        },
        "strict": True,
    },
]


def _ask_named(question: str, synonyms: list[str]) -> str:
    quoted = [f"'{s}'" for s in synonyms]
    if len(quoted) == 1:
        return ASK_NAMED.format(question, f"the value of {quoted[0]}", "it")
    listed = ", ".join(quoted[:-1]) + " and " + quoted[-1]
    return ASK_NAMED.format(question, f"the values of {listed}, in that order", "them")


def row(
    rng: random.Random, index: int, n_terms: int, target_synonyms: tuple[int, ...] = (1, 2), ask: str = "term"
) -> dict:
    terms = rng.sample(sorted(TERMS), n_terms)
    target = terms[0]
    question = rng.choice(TERMS[target][1])
    lines = []
    for term in terms:
        # the target keeps `target_synonyms` synonyms (so its calls are few), the others 1-2 as distractors
        for synonym in rng.sample(TERMS[term][0], rng.choice(target_synonyms if term == target else (1, 2))):
            lines.append((term, synonym))
    rng.shuffle(lines)
    expected = [s for t, s in lines if t == target]
    listing = "\n".join(f"The term '{t}' has a synonym '{s}'." for t, s in lines)
    return {
        "id": index,
        "responses_create_params": {
            "input": [
                {"role": "system", "content": SYSTEM + listing},
                {
                    "role": "user",
                    "content": ASK.format(question) if ask == "term" else _ask_named(question, expected),
                },
            ],
            "tools": TOOLS,
            "parallel_tool_calls": False,
        },
        "expected_synonyms": expected,
        "expected_synonym_values": [_value(s) for s in expected],
        "minefield_label": target,
        "minefield_label_value": _value(target),
        "agent_ref": {"name": AGENT},
    }


def make(
    n_train: int, n_val: int, seed: int, n_terms: int, target_synonyms: tuple[int, ...] = (1, 2), ask: str = "term"
) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[dict] = []
    misses = 0  # draws in a row that repeated a row: the settings may not have that many distinct rows
    while len(out) < n_val + n_train:
        r = row(rng, len(out), n_terms, target_synonyms, ask)
        key = json.dumps(r["responses_create_params"]["input"], sort_keys=True)
        if key in seen:
            misses += 1
            if misses > 10_000:
                raise ValueError(
                    f"only {len(out)} distinct rows found for --terms {n_terms} --target-synonyms "
                    f"{','.join(map(str, target_synonyms))}; asked for {n_val} validation + {n_train} training rows"
                )
            continue
        misses = 0
        seen.add(key)
        out.append(r)
    return out[n_val:], out[:n_val]


def main(argv: list[str] | None = None) -> int:
    p = split_parser(__doc__)
    p.add_argument("--terms", type=int, default=3, help="terms listed in each row's prompt (the first is asked)")
    p.add_argument(
        "--target-synonyms",
        default="1,2",
        help="how many synonyms the asked term has, drawn from this comma-separated list per row",
    )
    p.add_argument(
        "--ask",
        choices=("term", "synonyms"),
        default="term",
        help="what the user turn names: the term (the model finds its synonyms in the list) or the synonyms themselves",
    )
    p.add_argument("--prefix", default=PREFIX, help="output files <prefix>_train.jsonl and <prefix>_val.jsonl")
    args = p.parse_args(argv)
    counts = tuple(int(n) for n in args.target_synonyms.split(","))
    if not counts or min(counts) < 1 or max(counts) > 3:
        p.error(f"--target-synonyms {args.target_synonyms!r}: counts between 1 and 3 (each term has 3 synonyms)")
    try:
        train, val = make(args.train, args.val, args.seed, args.terms, counts, args.ask)
    except ValueError as e:
        p.error(str(e))
    args.out.mkdir(parents=True, exist_ok=True)
    train_path, val_path = args.out / f"{args.prefix}_train.jsonl", args.out / f"{args.prefix}_val.jsonl"
    write_jsonl(train, train_path)
    write_jsonl(val, val_path)
    print(f"{len(train)} training rows -> {train_path}, {len(val)} validation rows -> {val_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
