"""Benchmark: Gym ``/run`` results → trajectories → verl's padded batch, at ~4k and ~8k tokens per rollout.

Synthetic multi-turn tool-calling results in Gym's shape (ids on the last item of each model call, tool outputs
between calls, a contiguous history). Timed stages, each from the previous stage's output:

* ``parse``: validation of the ``/run`` JSON objects (pydantic; the token lists by one C-level pass over their
  element types, :class:`nemo_gym_adapter.wire.payloads.OutputItem`; in training this happens as each result arrives);
* ``build``: :func:`build_trajectory` per row (contiguity check, spans, budget/truncation, numpy arrays);
* ``pad``:   :func:`pad_trajectories` for the whole batch (vectorised);
* ``naive``: a per-token Python loop doing build + pad from the raw dicts, as a baseline;
* ``anchor``: the older verl recipe's postprocess (verl-recipe ``nemo_gym/agent_loop.py``: per-result
  ``_postprocess_nemo_gym_result`` + ``_nemo_gym_result_to_verl`` with the tiny qwen25 tokenizer, then verl 0.9.1's
  own ``AgentLoopWorker._postprocess`` stacking), when its source file is present (``--anchor``, default
  ``<cache>/anchors/verl-recipe-nemo_gym-agent_loop.py``; get it with
  ``git show <commit>:nemo_gym/agent_loop.py`` from a verl-recipe clone). Only those two functions are taken from
  it, read at run time: the source is never part of this repository. Its responses are checked equal to ours.

Prints CPU seconds (``time.process_time``, one torch thread) per stage, size and round, the median and spread over
``--rounds``, the growth ratio (8k / 4k; linear scaling ≈ 2.0), naive / ours and anchor / ours (ours = parse +
build + pad: everything from the JSON object to the padded tensors). CPU time, not wall time: on a shared machine
wall time mostly measures the load of the neighbours.

    .venv/bin/python benchmarks/bench_postprocess.py [--rollouts 1024] [--tokens 4096 8192] [--turns 4] [--rounds 3]
        [--no-naive] [--anchor PATH | --no-anchor]
"""

from __future__ import annotations

import argparse
import ast
import copy
import gc
import random
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # also runs from a checkout that is not installed

from nemo_gym_adapter.rollouts.builder import build_trajectory  # noqa: E402
from nemo_gym_adapter.rollouts.padding import pad_trajectories
from nemo_gym_adapter.rollouts.trajectory import TrajectoryConfig  # noqa: E402
from nemo_gym_adapter.runtime import paths  # noqa: E402
from nemo_gym_adapter.wire.payloads import parse_run_result  # noqa: E402

PAD = 0
ANCHOR_FILE = "verl-recipe-nemo_gym-agent_loop.py"
ANCHOR_FUNCTIONS = ("_postprocess_nemo_gym_result", "_nemo_gym_result_to_verl")


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


class Anchor:
    """The older verl recipe's postprocess, from its source file (module docstring); None-safe loading."""

    def __init__(self, path: Path) -> None:
        from transformers import AutoTokenizer
        from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopWorker, _InternalAgentLoopOutput
        from verl.utils.model import compute_position_id_with_mask

        from nemo_gym_adapter.demo_models import build_tiny_model

        tree = ast.parse(path.read_text(), filename=str(path))
        found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ANCHOR_FUNCTIONS]
        if sorted(n.name for n in found) != sorted(ANCHOR_FUNCTIONS):
            raise SystemExit(f"{path}: expected functions {ANCHOR_FUNCTIONS}, found {[n.name for n in found]}")
        # The names those two functions use, as the recipe's module imports them (verl 0.9.1 still has them all).
        namespace: dict[str, Any] = {
            "torch": torch,
            "Optional": __import__("typing").Optional,
            "compute_position_id_with_mask": compute_position_id_with_mask,
            "_InternalAgentLoopOutput": _InternalAgentLoopOutput,
            "AgentLoopMetrics": AgentLoopMetrics,
        }
        exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)  # noqa: S102
        self.postprocess_result = namespace["_postprocess_nemo_gym_result"]
        self.to_verl = namespace["_nemo_gym_result_to_verl"]
        # verl's own batch stacking, called the way the recipe calls it (an unbound method on its manager).
        self.stack = AgentLoopWorker._postprocess
        self.stand_in = types.SimpleNamespace(reward_loop_worker_handles=None, distillation_enabled=False)
        self.tokenizer = AutoTokenizer.from_pretrained(str(build_tiny_model("qwen25")))

    def run(self, results: list[dict[str, Any]], P: int, R: int) -> Any:
        processed = [self.postprocess_result(r, self.tokenizer) for r in results]
        outputs = [
            self.to_verl(result=r, tokenizer=self.tokenizer, prompt_length=P, response_length=R) for r in processed
        ]
        return self.stack(self.stand_in, outputs, input_non_tensor_batch=None, validate=False)


def run(tokens: int, with_naive: bool, anchor: Anchor | None, results: list[dict[str, Any]]) -> dict[str, float]:
    P, R = tokens // 8, tokens  # the response budget fits every rollout: nothing truncated, nothing masked
    cfg = TrajectoryConfig(prompt_length=P, response_length=R)
    t_parse, parsed = timed(lambda: [parse_run_result(r) for r in results])
    t_build, trajs = timed(lambda: [build_trajectory(r, env_name="bench", config=cfg) for r in parsed])
    t_pad, batch = timed(lambda: pad_trajectories(trajs, prompt_length=P, response_length=R, pad_token_id=PAD))
    assert not any(t.masked or t.truncated for t in trajs)
    out = {"parse": t_parse, "build": t_build, "pad": t_pad, "tokens": float(batch.tensors["attention_mask"].sum())}
    out["ours"] = t_parse + t_build + t_pad
    if with_naive:
        t_naive, ref = timed(lambda: naive(results, P, R))
        assert torch.equal(ref["responses"], batch.tensors["responses"]), "naive and vectorised disagree"
        out["naive"] = t_naive
    if anchor is not None:
        mutable = copy.deepcopy(results)  # the recipe pops ids off the items it reads; copied outside the timing
        t_anchor, data = timed(lambda: anchor.run(mutable, P, R))
        del mutable
        # Same tensors, up to the pad id (the recipe pads with the tokenizer's): compare where attention is 1.
        valid = {"prompts": batch.tensors["attention_mask"][:, :P], "responses": batch.tensors["attention_mask"][:, P:]}
        for key in ("prompts", "responses", "response_mask", "attention_mask", "position_ids", "rollout_log_probs"):
            theirs, ours = data.batch[key], batch.tensors[key]
            if key in valid:
                theirs, ours = theirs * valid[key], ours * valid[key]
            assert torch.equal(theirs, ours), f"anchor and ours disagree on {key}"
        assert torch.equal(data.batch["rm_scores"], batch.tensors["rm_scores"]), "anchor and ours disagree on rm_scores"
        out["anchor"] = t_anchor
    return out


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=1024)
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-naive", action="store_true")
    parser.add_argument("--anchor", type=Path, default=paths.cache_dir() / "anchors" / ANCHOR_FILE)
    parser.add_argument("--no-anchor", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)  # shared CPU: measure one core, reproducibly
    anchor = None
    if not args.no_anchor and args.anchor.is_file():
        anchor = Anchor(args.anchor)
        print(f"anchor: {args.anchor} (the older verl recipe's postprocess + verl's AgentLoopWorker._postprocess)")
    elif not args.no_anchor:
        print(f"anchor: {args.anchor} not present, not timed (see the module docstring)")
    print(f"{args.rollouts} rollouts, {args.turns} model calls each; CPU seconds (1 torch thread)")
    head = f"{'tokens':>7} {'round':>5} {'parse':>7} {'build':>7} {'pad':>7} {'ours':>7} {'naive':>7} {'anchor':>7}"
    print(head + f" {'naive/ours':>10} {'anchor/ours':>11}")
    rows: dict[int, list[dict[str, float]]] = {}
    for tokens in args.tokens:
        rng = random.Random(tokens)
        results = [make_result(rng, tokens, args.turns) for _ in range(args.rollouts)]
        for i in range(args.rounds):
            r = run(tokens, not args.no_naive, anchor, results)
            rows.setdefault(tokens, []).append(r)
            cells = [f"{r[k]:7.2f}" if k in r else "      -" for k in ("naive", "anchor")]
            ratios = [
                f"{r[k] / r['ours']:{w}.1f}" if k in r else " " * (w - 1) + "-"
                for k, w in (("naive", 10), ("anchor", 11))
            ]
            print(
                f"{tokens:>7} {i + 1:>5} {r['parse']:7.2f} {r['build']:7.2f} {r['pad']:7.2f} {r['ours']:7.2f} "
                f"{' '.join(cells)} {' '.join(ratios)}"
            )
        del results
    print(f"\nmedian (min-max) over {args.rounds} round(s):")
    for tokens, rs in rows.items():
        line = f"  {tokens:>5} tokens: ours {spread([r['ours'] for r in rs])} s"
        for k in ("naive", "anchor"):
            if k in rs[0]:
                line += f", {k} {spread([r[k] for r in rs])} s, {k}/ours {spread([r[k] / r['ours'] for r in rs], '{:.1f}')}x"
        print(line + (" (goal anchor/ours >= 10 at 4096)" if tokens == 4096 and "anchor" in rs[0] else ""))
    if len(args.tokens) >= 2:
        a, b = args.tokens[0], args.tokens[-1]
        med = {t: {k: statistics.median(r[k] for r in rows[t]) for k in rows[t][0]} for t in (a, b)}
        for stage in ("parse", "build", "pad", "ours"):
            print(f"growth {stage} {b}/{a}: {med[b][stage] / med[a][stage]:.2f} (token ratio {b / a:.1f})")


if __name__ == "__main__":
    main()
