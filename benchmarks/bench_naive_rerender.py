"""What a naive integration would train the tool model on, offline (no vLLM, no Gym): conversations of the held-out
synonym rows played with the checkpoint in transformers (float32, greedy), the tool answered as Gym's
``example_multi_step`` answers it, and every later turn's prompt built both ways:

- spliced: the model's exact tokens so far, then the template's rendering of what came after its last turn (the
  patch's rule, ``nemo_gym_adapter/tokens/splice.py``: the n-th turn end, n = turn ends in the history render);
- re-rendered: the chat template over the messages (what stock vLLM serves, and what an integration that re-renders
  the conversation trains on).

The model generates from the spliced prompt (what it does with the patch on). Per later turn: does the re-rendered
prompt still begin with the model's own tokens, and where not, why (``bench_patch_worth.drift_class``); the log-prob of
the model's own next-turn tokens under the re-rendered context vs under the exact one (the same weights: the gap is
what re-rendering alone does to the training signal); the earlier assistant turn as the template re-writes it, and
the log-prob the actor gives its ``<tool_call>`` tag (a token the model never produced).

    python benchmarks/bench_naive_rerender.py --model DIR [--rows 6] [--turns 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import difflib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_patch_worth import Actor, drift_class, first_difference  # noqa: E402
from nemo_gym_adapter.vllm.json_calls import parse_json_calls  # noqa: E402


def tool_answer(name: str, arguments: str) -> str:
    """example_multi_step's tools (its app.py): a synonym's value is the sum of its character codes."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return json.dumps({"error": "Invalid tool call arguments"})
    if name == "get_synonym_value" and isinstance(args, dict) and isinstance(args.get("synonym"), str):
        return json.dumps({"synonym_value": sum(map(ord, args["synonym"]))})
    if name == "extract_synonym_values":
        return json.dumps({"success": True})
    return json.dumps({"detail": "Not Found"})


def generate(actor: Actor, prompt: list[int], max_new: int, stops: set[int]) -> list[int]:
    torch = actor.torch
    with torch.no_grad():
        out = actor.model.generate(
            input_ids=torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=sorted(stops),
            pad_token_id=actor.tok.pad_token_id,
        )
    return out[0, len(prompt) :].tolist()


def spliced(actor: Actor, history: list[int], messages: list[dict], tools: list[dict], stops: set[int]) -> list[int]:
    """The patch's rule for a generation that ended with a stop id (kept): history + the render after the n-th turn end."""
    prefix = actor.tok.apply_chat_template(messages[: _last_assistant(messages) + 1], tools=tools, return_dict=False)
    full = actor.render(messages, tools)
    n = sum(t in stops for t in prefix)
    ends = [i for i, t in enumerate(full) if t in stops]
    return history + full[ends[n - 1] + 1 :]


def _last_assistant(messages: list[dict]) -> int:
    return max(i for i, m in enumerate(messages) if m["role"] == "assistant")


def play(actor: Actor, row: dict, turns: int, max_new: int) -> list[dict[str, Any]]:
    tok = actor.tok
    stops = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    tools = [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}}
        for t in row["responses_create_params"]["tools"]
    ]
    messages = [dict(m) for m in row["responses_create_params"]["input"]]
    history: list[int] = []
    out = []
    for k in range(turns):
        exact = actor.render(messages, tools) if k == 0 else spliced(actor, history, messages, tools, stops)
        rendered = actor.render(messages, tools)
        gen = generate(actor, exact, max_new, stops)
        entry: dict[str, Any] = {"turn": k + 1, "generated": tok.decode(gen)}
        if k > 0:
            at = first_difference(history, rendered)
            entry["rerender_keeps_history"] = rendered[: len(history)] == history
            if not entry["rerender_keeps_history"]:
                entry["where"] = drift_class(tok, history, rendered, at, stops)
                entry["model_wrote"] = tok.decode(history[at : at + 12])
                entry["template_wrote"] = tok.decode(rendered[at : at + 12])
            exact_lp = actor.logprobs(exact, gen)
            naive_lp = actor.logprobs(rendered, gen)
            entry["abs_gap"] = [abs(a - b) for a, b in zip(naive_lp, exact_lp, strict=True)]
            entry["shift"] = [a - b for a, b in zip(naive_lp, exact_lp, strict=True)]
            # the previous assistant turn as the template re-writes it vs what the model generated
            prev_prompt_len = len(history) - len(out[-1]["gen_ids"])
            if rendered[:prev_prompt_len] == history[:prev_prompt_len]:
                tail = rendered[prev_prompt_len:]
                end = next((i for i, t in enumerate(tail) if t in stops), len(tail) - 1)
                span = tail[: end + 1]
                m = difflib.SequenceMatcher(a=out[-1]["gen_ids"], b=span, autojunk=False)
                entry["rerendered_turn_tokens"] = len(span)
                entry["rerendered_turn_not_generated"] = len(span) - sum(b.size for b in m.get_matching_blocks())
                tag = tok.convert_tokens_to_ids("<tool_call>")
                if tag in span:
                    lp = actor.logprobs(history[:prev_prompt_len], span[: span.index(tag) + 1])
                    entry["tool_call_tag_logprob"] = lp[-1]
        entry["gen_ids"] = gen
        out.append(entry)
        history = exact + gen
        if not gen or gen[-1] not in stops:
            break
        content, calls = parse_json_calls(tok.decode(gen[:-1]))
        if not calls:
            break
        ids = [f"call_{k}_{i}" for i in range(len(calls))]
        messages.append(
            {
                "role": "assistant",
                "content": content or "",
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for i, c in zip(ids, calls, strict=True)
                ],
            }
        )
        for i, c in zip(ids, calls, strict=True):
            messages.append({"role": "tool", "tool_call_id": i, "content": tool_answer(c.name, c.arguments)})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--rows", type=int, default=6)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-new", type=int, default=40)
    p.add_argument("--data", type=Path, default=REPO / "configs" / "data" / "synonyms_val.jsonl")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    actor = Actor(args.model)
    rows = [json.loads(line) for line in args.data.read_text().splitlines()[: args.rows]]
    t0 = time.monotonic()
    played = []
    for row in rows:
        turns = play(actor, row, args.turns, args.max_new)
        played.append([{k: v for k, v in t.items() if k != "gen_ids"} for t in turns])
        print(json.dumps(played[-1])[:600], flush=True)
    later = [t for conv in played for t in conv if t["turn"] > 1]
    gaps = [g for t in later for g in t["abs_gap"]]
    shifts = [s for t in later for s in t["shift"]]
    report = {
        "rows": len(rows),
        "later_turns": len(later),
        "rerender_differs": sum(not t["rerender_keeps_history"] for t in later),
        "where": {w: sum(t.get("where") == w for t in later) for w in {t.get("where") for t in later} if w},
        "naive_abs_gap_mean": round(statistics.fmean(gaps), 4) if gaps else None,
        "naive_shift_mean": round(statistics.fmean(shifts), 4) if shifts else None,
        "naive_tokens": len(gaps),
        "naive_share_over_0.1": round(sum(g > 0.1 for g in gaps) / len(gaps), 3) if gaps else None,
        "rerendered_turn_tokens": sum(t.get("rerendered_turn_tokens", 0) for t in later),
        "rerendered_turn_not_generated": sum(t.get("rerendered_turn_not_generated", 0) for t in later),
        "tool_call_tag_logprob_mean": round(statistics.fmean(v), 2)
        if (v := [t["tool_call_tag_logprob"] for t in later if "tool_call_tag_logprob" in t])
        else None,
        "wall_s": round(time.monotonic() - t0),
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps({"report": report, "conversations": played}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
