"""Benchmark: Gym ``/run`` results → trajectories → verl's padded batch, at ~4k and ~8k tokens per rollout.

Synthetic multi-turn tool-calling results in Gym's shape (ids on the last item of each model call, tool outputs
between calls, a contiguous history). Timed stages, each from the previous stage's output:

* ``parse``: pydantic validation of the ``/run`` JSON objects (in training this happens as each result arrives);
* ``build``: :func:`build_trajectory` per row (contiguity check, spans, budget/truncation, numpy arrays);
* ``pad``:   :func:`pad_trajectories` for the whole batch (vectorised torch scatter);
* ``naive``: a per-token Python loop doing build + pad from the raw dicts, as a baseline.

Prints CPU seconds (``time.process_time``, one torch thread) per stage and size, the growth ratio (8k / 4k;
linear scaling ≈ 2.0) and naive / ours. CPU time, not wall time: on a shared machine wall time mostly measures
the load of the neighbours.

    .venv/bin/python scripts/bench_postprocess.py [--rollouts 1024] [--tokens 4096 8192] [--turns 4] [--no-naive]
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from typing import Any

import torch

from nemo_gym_adapter.padding import pad_trajectories
from nemo_gym_adapter.trajectory import TrajectoryConfig, build_trajectory
from nemo_gym_adapter.wire import parse_run_result

PAD = 0


def make_result(rng: random.Random, total_tokens: int, turns: int) -> dict[str, Any]:
    """One contiguous result of ~``total_tokens`` tokens: prompt 1/8, the rest split into generations and env."""
    prompt_len = total_tokens // 8
    per_turn = (total_tokens - prompt_len) // turns
    history = [rng.randrange(1000, 150_000) for _ in range(prompt_len)]
    output: list[dict[str, Any]] = []
    for k in range(turns):
        gen = [rng.randrange(1000, 150_000) for _ in range(per_turn * 3 // 4)]
        ids = {
            "prompt_token_ids": list(history),
            "generation_token_ids": gen,
            "generation_log_probs": [-rng.random() for _ in gen],
        }
        output.append({"type": "function_call", "name": "f", "arguments": "{}", "call_id": f"c{k}", **ids})
        if k < turns - 1:
            output.append({"type": "function_call_output", "call_id": f"c{k}", "output": "ok"})
            history = history + gen + [rng.randrange(1000, 150_000) for _ in range(per_turn - len(gen))]
    return {"reward": float(rng.random() > 0.5), "response": {"output": output, "incomplete_details": None}}


def naive(results: list[dict[str, Any]], P: int, R: int) -> dict[str, torch.Tensor]:
    """Per-token loops everywhere: what the vectorised path replaces."""
    rows: dict[str, list[list[Any]]] = {k: [] for k in ("prompts", "responses", "mask", "logprobs", "att", "pos", "rm")}
    for res in results:
        calls = [it for it in res["response"]["output"] if "prompt_token_ids" in it]
        for prev, cur in zip(calls, calls[1:], strict=False):
            expected = prev["prompt_token_ids"] + prev["generation_token_ids"]
            for j in range(len(expected)):
                if cur["prompt_token_ids"][j] != expected[j]:
                    raise ValueError("non-contiguous")
        prompt = calls[0]["prompt_token_ids"]
        resp, mask, lps = [], [], []
        for k, call in enumerate(calls):
            if k > 0:
                for tok in call["prompt_token_ids"][len(prompt) + len(resp) :]:
                    resp.append(tok)
                    mask.append(0)
                    lps.append(0.0)
            for tok, lp in zip(call["generation_token_ids"], call["generation_log_probs"], strict=True):
                resp.append(tok)
                mask.append(1)
                lps.append(lp)
        resp, mask, lps = resp[:R], mask[:R], lps[:R]
        prow = [PAD] * (P - len(prompt)) + list(prompt)
        att = [0] * (P - len(prompt)) + [1] * len(prompt)
        rrow, mrow, lrow, rm = [], [], [], []
        for j in range(R):
            valid = j < len(resp)
            rrow.append(resp[j] if valid else PAD)
            mrow.append(mask[j] if valid else 0)
            lrow.append(lps[j] if valid else 0.0)
            rm.append(res["reward"] if j == len(resp) - 1 else 0.0)
            att.append(1 if valid else 0)
        pos, seen = [], 0
        for a in att:
            seen += a
            pos.append(max(seen - 1, 0))
        for key, row in zip(rows, (prow, rrow, mrow, lrow, att, pos, rm), strict=True):
            rows[key].append(row)
    return {k: torch.tensor(v) for k, v in rows.items()}


def timed(fn: Any) -> tuple[float, Any]:
    """CPU seconds of this process (wall time on a shared, overloaded machine mostly measures the neighbours)."""
    gc.collect()
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def run(n: int, tokens: int, turns: int, with_naive: bool) -> dict[str, float]:
    rng = random.Random(tokens)
    results = [make_result(rng, tokens, turns) for _ in range(n)]
    P, R = tokens // 8, tokens  # the response budget fits every rollout: nothing truncated, nothing masked
    cfg = TrajectoryConfig(prompt_length=P, response_length=R)
    t_parse, parsed = timed(lambda: [parse_run_result(r) for r in results])
    t_build, trajs = timed(lambda: [build_trajectory(r, env_name="bench", config=cfg) for r in parsed])
    t_pad, batch = timed(lambda: pad_trajectories(trajs, prompt_length=P, response_length=R, pad_token_id=PAD))
    assert not any(t.masked or t.truncated for t in trajs)
    out = {"parse": t_parse, "build": t_build, "pad": t_pad, "tokens": float(batch.tensors["attention_mask"].sum())}
    if with_naive:
        t_naive, ref = timed(lambda: naive(results, P, R))
        assert torch.equal(ref["responses"], batch.tensors["responses"]), "naive and vectorised disagree"
        out["naive"] = t_naive
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1024)
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--no-naive", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)  # shared CPU: measure one core, reproducibly
    print(f"{args.rollouts} rollouts, {args.turns} model calls each; CPU seconds (1 torch thread)")
    print(f"{'tokens':>7} {'parse':>7} {'build':>7} {'pad':>7} {'build+pad':>9} {'naive':>7} {'naive/ours':>10}")
    rows = {}
    for tokens in args.tokens:
        r = run(args.rollouts, tokens, args.turns, not args.no_naive)
        ours = r["build"] + r["pad"]
        naive_s = f"{r['naive']:7.2f}" if "naive" in r else "      -"
        ratio = f"{r['naive'] / ours:10.1f}" if "naive" in r else "         -"
        print(f"{tokens:>7} {r['parse']:7.2f} {r['build']:7.2f} {r['pad']:7.2f} {ours:9.2f} {naive_s} {ratio}")
        rows[tokens] = r
    if len(args.tokens) >= 2:
        a, b = args.tokens[0], args.tokens[-1]
        for stage in ("parse", "build", "pad"):
            print(f"growth {stage} {b}/{a}: {rows[b][stage] / rows[a][stage]:.2f} (token ratio {b / a:.1f})")
        ours_a, ours_b = (rows[t]["build"] + rows[t]["pad"] for t in (a, b))
        print(f"growth build+pad {b}/{a}: {ours_b / ours_a:.2f}")


if __name__ == "__main__":
    main()
