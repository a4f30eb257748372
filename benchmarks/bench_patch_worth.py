"""What exact tokens buy a real tool-calling model, offline, from two ``collect --output`` files of the same rows: one
served with the token-ID patch, one without (``collect --no-patch``).

    python benchmarks/bench_patch_worth.py --model DIR --patched on.jsonl --unpatched off.jsonl [--json out.json]

For each run: rollouts, masked rate by reason, multi-turn share, contiguity (every later model call's prompt starts
with the previous call's prompt + generation, token for token), reward.

Where the unpatched later-turn prompts leave the model's own tokens: for every later call whose prompt does not extend
the history, the first differing position and what is there, by class: ``tool_call_wrapper`` (the template re-renders
the model's bare-JSON call inside ``<tool_call>`` tags it never wrote), ``stop_token`` (the model stopped with another
of its stop tokens than the template's turn end), ``whitespace`` (the same text up to whitespace), ``retokenized`` (the
same text, other ids), ``other``.

The rollout-vs-actor gap per turn (turn 1 vs later turns): the actor is the same checkpoint in transformers, float32
(what verl's FSDP actor computes in the CPU configs); per model call, the mean |rollout log-prob - actor log-prob| of
its generated tokens given the prompt the engine saw.

What a naive integration would train: one that re-renders the conversation with the chat template instead of keeping
the model's tokens. For each later call of the patched run, the actor's log-prob of the model's own generated tokens
under the re-rendered context (the template's rendering of the messages before that call: stock vLLM's prompt) vs the
rollout's log-prob under the exact context; and the re-rendered assistant turns themselves: how many of their tokens
the model never produced, and the actor's log-prob of the wrapper tokens it would be trained on.
"""

from __future__ import annotations

import argparse
import difflib
import json
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

# ------------------------------------------------------------------------------------------------ reading results


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def model_calls(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per model call: its prompt/generation ids and log-probs, and the chat messages before it (Gym's Responses
    items turned into chat messages the way Gym's vllm_model does: one assistant message per model call, with its
    text and its tool calls; a function_call_output becomes a tool message)."""
    params = result.get("responses_create_params") or {}
    given = params.get("input")
    messages: list[dict[str, Any]] = (
        [{"role": "user", "content": given}] if isinstance(given, str) else [_chat(m) for m in given or []]
    )
    calls = []
    pending: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": []}
    for item in (result.get("response") or {}).get("output") or []:
        kind = item.get("type")
        if kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": str(item.get("output"))})
            continue
        if kind == "message" and item.get("role") == "assistant":
            pending["content"] += "".join(c.get("text", "") for c in item.get("content") or [] if isinstance(c, dict))
        elif kind == "function_call":
            pending["tool_calls"].append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            )
        if item.get("prompt_token_ids") is not None:
            calls.append(
                {
                    "prompt": list(item["prompt_token_ids"]),
                    "generation": list(item["generation_token_ids"]),
                    "logprobs": list(item.get("generation_log_probs") or []),
                    "messages_before": [dict(m) for m in messages],
                }
            )
            if not pending["tool_calls"]:
                pending.pop("tool_calls")
            messages.append(pending)
            pending = {"role": "assistant", "content": "", "tool_calls": []}
    return calls


def _chat(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
    role = message.get("role")
    return {"role": "system" if role == "developer" else role, "content": content}


def chat_tools(result: dict[str, Any]) -> list[dict[str, Any]]:
    tools = (result.get("responses_create_params") or {}).get("tools") or []
    return [
        {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
        for t in tools
        if isinstance(t, dict)
    ]


# ------------------------------------------------------------------------------------------------ drift classes


def first_difference(history: list[int], prompt: list[int]) -> int:
    n = min(len(history), len(prompt))
    return next((i for i in range(n) if history[i] != prompt[i]), n)


def drift_class(tok: Any, history: list[int], prompt: list[int], at: int, stops: set[int]) -> str:
    """Why ``prompt`` leaves ``history`` at ``at`` (the module docstring's classes)."""
    mine, theirs = history[at:], prompt[at : at + len(history) - at + 16]
    if "<tool_call>" in tok.decode(theirs[:8]) and "<tool_call>" not in tok.decode(mine[:8]):
        return "tool_call_wrapper"
    if mine and mine[0] in stops and mine[-1] in stops and len(mine) == 1:
        return "stop_token"
    a, b = tok.decode(mine), tok.decode(prompt[at : at + len(mine)])
    if a == b:
        return "retokenized"
    if "".join(a.split()) == "".join(b.split()):
        return "whitespace"
    return "other"


# ------------------------------------------------------------------------------------------------ actor log-probs


class Actor:
    """The checkpoint in transformers, float32: log-probs of ``generation`` given ``prompt``."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def logprobs(self, prompt: list[int], generation: list[int]) -> list[float]:
        torch = self.torch
        ids = torch.tensor([prompt + generation])
        with torch.no_grad():
            logits = self.model(ids).logits[0, len(prompt) - 1 : -1].float()
        lp = torch.log_softmax(logits, dim=-1)
        return lp.gather(1, torch.tensor(generation)[:, None])[:, 0].tolist()

    def render(self, messages: list[dict], tools: list[dict]) -> list[int]:
        return list(self.tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=False))


def _mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 6) if xs else None


def run_stats(records: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(records)
    reasons = Counter(r.get("masked_reason") for r in records if r.get("masked_reason"))
    multi = [r for r in records if (r.get("num_turns") or 0) >= 2]
    scored = [r for r in records if r.get("reward") is not None and not r.get("masked_reason")]
    return {
        "rollouts": n,
        "masked_rate": round(sum(reasons.values()) / n, 3) if n else None,
        "masked_by_reason": dict(reasons),
        "multi_turn_share": round(len(multi) / n, 3) if n else None,
        "contiguity_rate": round(sum(not r.get("contiguity_failure") for r in multi) / len(multi), 3)
        if multi
        else None,
        "reward_mean_unmasked": _mean([float(r["reward"]) for r in scored]),
    }


def analyse(actor: Actor, patched: list[dict], unpatched: list[dict], max_calls: int) -> dict[str, Any]:
    tok = actor.tok
    stops = {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")}
    out: dict[str, Any] = {"patched": run_stats(patched), "unpatched": run_stats(unpatched)}

    # where the unpatched later-turn prompts leave the model's own tokens
    classes: Counter[str] = Counter()
    later = differ = 0
    for r in unpatched:
        calls = model_calls(r.get("result") or {})
        for prev, cur in zip(calls, calls[1:], strict=False):
            later += 1
            history = prev["prompt"] + prev["generation"]
            if cur["prompt"][: len(history)] != history:
                differ += 1
                classes[drift_class(tok, history, cur["prompt"], first_difference(history, cur["prompt"]), stops)] += 1
    out["unpatched_later_prompts"] = {"later_calls": later, "differ": differ, "where": dict(classes)}

    # per-turn rollout-vs-actor gap, both runs; the naive integration's view of the patched run's later turns
    gaps: dict[str, dict[str, list[float]]] = {"patched": defaultdict(list), "unpatched": defaultdict(list)}
    naive_gap: list[float] = []
    naive_shift: list[float] = []
    wrapper_tokens = wrapper_new = turns_rerendered = turns_equal = 0
    im_end, tool_call_tag = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<tool_call>")
    wrapper_lp: list[float] = []
    done = 0
    for name, records in (("patched", patched), ("unpatched", unpatched)):
        for r in records:
            result = r.get("result") or {}
            calls = model_calls(result)
            for k, call in enumerate(calls):
                if done >= max_calls or not call["logprobs"]:
                    continue
                done += 1
                actor_lp = actor.logprobs(call["prompt"], call["generation"])
                diff = [abs(a - b) for a, b in zip(actor_lp, call["logprobs"], strict=False)]
                gaps[name]["turn_1" if k == 0 else "later"].extend(diff)
                if name != "patched" or k == 0:
                    continue
                rerendered = actor.render(call["messages_before"], chat_tools(result))
                naive_lp = actor.logprobs(rerendered, call["generation"])
                naive_gap.extend(abs(a - b) for a, b in zip(naive_lp, call["logprobs"], strict=False))
                naive_shift.extend(a - b for a, b in zip(naive_lp, call["logprobs"], strict=False))
                # the re-rendered earlier assistant turn vs what the model generated there
                prev = calls[k - 1]
                if rerendered[: len(prev["prompt"])] != prev["prompt"]:
                    continue  # the history before it was re-rendered too: counted with the earlier turn
                tail = rerendered[len(prev["prompt"]) :]
                end = next((i for i, t in enumerate(tail) if t == im_end), len(tail) - 1)
                span = tail[: end + 1]  # the assistant turn as the template writes it, its turn end included
                turns_rerendered += 1
                turns_equal += span == prev["generation"]
                matcher = difflib.SequenceMatcher(a=prev["generation"], b=span, autojunk=False)
                kept = sum(block.size for block in matcher.get_matching_blocks())
                wrapper_tokens += len(span)
                wrapper_new += len(span) - kept
                if tool_call_tag in span:
                    lp = actor.logprobs(prev["prompt"], span[: span.index(tool_call_tag) + 1])
                    wrapper_lp.append(lp[-1])
    out["gap_abs_mean"] = {
        name: {turn: _mean(v) for turn, v in sorted(per.items())} | {"tokens": {t: len(v) for t, v in per.items()}}
        for name, per in gaps.items()
    }
    out["naive_integration"] = {
        "later_tokens": len(naive_gap),
        "abs_gap_mean": _mean(naive_gap),
        "mean_shift_actor_minus_rollout": _mean(naive_shift),
        "share_tokens_abs_gap_over_0.1": _mean([float(d > 0.1) for d in naive_gap]),
        "earlier_assistant_turns_rerendered": turns_rerendered,
        "of_which_token_identical": turns_equal,
        "rerendered_assistant_tokens": wrapper_tokens,
        "of_which_not_in_the_models_generation": wrapper_new,
        "actor_logprob_of_the_tool_call_tag": _mean(wrapper_lp),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--patched", type=Path, required=True)
    p.add_argument("--unpatched", type=Path, required=True)
    p.add_argument("--max-calls", type=int, default=400, help="model calls to score with the actor (cost bound)")
    p.add_argument("--json", type=Path, help="also write the report here")
    args = p.parse_args(argv)
    report = analyse(Actor(args.model), load(args.patched), load(args.unpatched), args.max_calls)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
