"""The token-ID patch's cost at agentic length: vLLM's chat render unpatched vs patched (in-process, no engine).

Builds vLLM's own ``OnlineRenderer`` for a tiny model (the object ``/v1/chat/completions`` and ``/tokenize`` render
through) and times ``render_chat`` on long agentic conversations (``tests/support/agentic.py``: tool calls with JSON
arguments, tool outputs of varied length, every assistant message carrying the ``prompt_token_ids`` /
``generation_token_ids`` the patched server produced, as Gym sends them back). Rounds interleave the variants so
machine-load drift hits all of them alike; medians are reported, with the load average before and after.

1. Sizes (``--sizes``, default 8, 32 and 64 turns up to ~32k tokens): the last request of each conversation,
   ``unpatched`` (stock vLLM: the original method re-installed for the sample), ``patched`` (the splice with the fast
   prefix render, what runs in production) and, with ``--slow-path``, the splice re-rendering the prefix through the
   hook. Each patched prompt is checked against the token math's own splice of the same conversation.
2. Cost along one conversation (``--curve``, on the largest size): every few turns of the rollout, that request's
   unpatched and patched render and the patch's own cost (the difference), with a least-squares fit ``a + b*N`` (N =
   prompt tokens) and the exponent ``k`` of ``c*N**k`` (log-log fit): ``k`` near 1 is a cost linear in the
   conversation. Also timed, outside the render and the same for both: parsing the request body as Gym sends it
   (``json.loads`` + vLLM's request model), once with every assistant message's ids and once with only the last
   one's (what a client that does not re-send earlier ids would cost; Gym #2663; the patched prompt is checked to
   be the same for both).

Goal (issue 26): patched / unpatched <= 1.3 at 64 turns / 32k tokens, the per-request cost linear in length.

    python benchmarks/bench_patch.py [--family qwen25|qwen3|llama3|all] [--sizes 8x8000,32x16000,64x32000]
        [--rounds 15] [--curve] [--slow-path]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: tests/support is shared with tests

from tests.support.agentic import agentic_conversation, render_ids  # noqa: E402

DEFAULT_SIZES = "8x8000,32x16000,64x32000"
CURVE_POINTS = 12  # requests timed along the curve's conversation


def _load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


class Bench:
    """One family's vLLM renderer, patched and unpatched, and the token math that built its conversations."""

    def __init__(self, model_path: str, family: str) -> None:
        os.environ.setdefault("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")  # the tiny models say 16k; nothing runs them
        from vllm.engine.arg_utils import EngineArgs
        from vllm.renderers import renderer_from_config
        from vllm.renderers.online_renderer import OnlineRenderer

        from nemo_gym_adapter.tokens.anchor import find_anchor, splice_request
        from nemo_gym_adapter.vllm import hooks as vllm_hooks
        from nemo_gym_adapter.vllm import patch as vllm_patch

        config = EngineArgs(model=model_path, max_model_len=65536, enforce_eager=True).create_engine_config()
        self.family = family
        self.online = OnlineRenderer(
            config.model_config,
            renderer_from_config(config),
            request_logger=None,
            chat_template=None,
            chat_template_content_format="auto",
            # As Gym's servers run it: tool calls parsed, so the parser's adjust_request is part of the render.
            enable_auto_tools=True,
            tool_parser="llama3_json" if family == "llama3" else "hermes",
        )
        self.tok = self.online.renderer.tokenizer
        self.report = vllm_patch.apply_patch()
        self.cls = OnlineRenderer
        self.patched = OnlineRenderer.preprocess_chat
        self.original = self.patched.__ngv_original__
        self.hooks = vllm_hooks
        self.fast_prefix = vllm_hooks.fast_prefix_ids
        template, same_text = vllm_hooks._turn_template(self.online, None)

        def splice(messages: list[dict], full: list[int]) -> list[int]:
            """The token math's splice of a request (what the patched server builds), on the HF render."""
            anchor = find_anchor(messages, None)
            prefix = render_ids(self.tok, messages[: anchor.index + 1], False)
            return splice_request(
                anchor, messages, prefix, full, template, decode=None, assistant_edits="keep_ids", same_text=same_text
            )

        self.splice = splice

    def conversation(self, turns: int, tokens: int):
        return agentic_conversation(self.tok, self.family, turns, tokens, splice=self.splice)

    def request(self, messages: list[dict], tools: list[dict]):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        body = {"model": "m", "messages": messages, "tools": tools, "max_tokens": 64, "return_token_ids": True}
        return ChatCompletionRequest.model_validate(body)

    async def time_variants(self, messages: list[dict], tools: list[dict], rounds: int, slow: bool) -> dict:
        """Median render_chat time (ms) per variant over ``rounds`` interleaved rounds (2 warm-up rounds first), and
        each variant's prompt length."""

        async def no_fast_path(*args, **kwargs):
            return None

        variants = {"unpatched": (self.original, self.fast_prefix), "patched": (self.patched, self.fast_prefix)}
        if slow:
            variants["slow path"] = (self.patched, no_fast_path)
        samples: dict[str, list[float]] = {name: [] for name in variants}
        prompts: dict[str, list[int]] = {}
        try:
            for i in range(rounds + 2):
                for name, (method, prefix_fn) in variants.items():
                    self.cls.preprocess_chat = method
                    self.hooks.fast_prefix_ids = prefix_fn
                    req = self.request(messages, tools)
                    t0 = time.perf_counter()
                    result = await self.online.render_chat(req)
                    elapsed = time.perf_counter() - t0
                    if not isinstance(result, tuple):
                        raise RuntimeError(f"{name} render failed: {result}")
                    if i >= 2:
                        samples[name].append(elapsed)
                    prompts[name] = result[1][0]["prompt_token_ids"]
        finally:
            self.cls.preprocess_chat = self.patched
            self.hooks.fast_prefix_ids = self.fast_prefix
        out = {name: statistics.median(v) * 1e3 if v else math.nan for name, v in samples.items()}
        out["prompts"] = prompts
        return out

    def time_parse(self, messages: list[dict], tools: list[dict], rounds: int) -> tuple[float, float]:
        """Median ms to parse the request body (json.loads + vLLM's request model): as Gym sends it (every assistant
        message with its ids), and with only the last assistant message's ids (:func:`lean`)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        times = []
        for msgs in (messages, lean(messages)):
            raw = json.dumps({"model": "m", "messages": msgs, "tools": tools, "max_tokens": 64})
            runs = []
            for _ in range(max(3, rounds // 3)):
                t0 = time.perf_counter()
                ChatCompletionRequest.model_validate(json.loads(raw))
                runs.append(time.perf_counter() - t0)
            times.append(statistics.median(runs) * 1e3)
        return times[0], times[1]


def lean(messages: list[dict]) -> list[dict]:
    """``messages`` with token ids on the last assistant message only (earlier ones without ids and log-probs)."""
    last = max((i for i, m in enumerate(messages) if "prompt_token_ids" in m), default=-1)
    id_keys = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
    return [
        m if i == last or "prompt_token_ids" not in m else {k: v for k, v in m.items() if k not in id_keys}
        for i, m in enumerate(messages)
    ]


async def sizes(bench: Bench, plan: list[tuple[int, int]], rounds: int, slow: bool) -> list[dict]:
    rows = []
    for turns, tokens in plan:
        conv = bench.conversation(turns, tokens)
        load_before = _load()
        timed = await bench.time_variants(conv.messages, conv.tools, rounds, slow)
        expected = bench.splice(conv.messages, render_ids(bench.tok, conv.messages, True))
        if timed["prompts"]["patched"] != expected:
            raise RuntimeError(f"{bench.family} {turns} turns: the patched prompt is not the token math's splice")
        rows.append(
            {
                "turns": turns,
                "messages": len(conv.messages),
                "tokens": len(timed["prompts"]["patched"]),
                **{k: v for k, v in timed.items() if k != "prompts"},
                "load": f"{load_before} -> {_load()}",
            }
        )
        print_size_row(bench.family, rows[-1], slow, header=len(rows) == 1)
    return rows


async def curve(bench: Bench, turns: int, tokens: int, rounds: int) -> list[dict]:
    """Per-request cost along one ``turns``-call conversation: requests spread over the rollout."""
    conv = bench.conversation(turns, tokens)
    requests = conv.requests[1:]  # the first request carries no ids: nothing to splice
    picks = sorted({round(i * (len(requests) - 1) / (CURVE_POINTS - 1)) for i in range(CURVE_POINTS)})
    points = []
    print(f"\n{bench.family}: cost per request along one {turns}-call conversation (load {_load()})")
    print(
        f"{'call':>5} {'msgs':>5} {'tokens':>7} {'unpatched':>10} {'patched':>9} {'ratio':>6} {'patch':>8}"
        f" {'parse, all ids':>15} {'last ids only':>14}"
    )
    for pick in picks:
        messages = requests[pick]
        timed = await bench.time_variants(messages, conv.tools, rounds, slow=False)
        parse_all, parse_last = bench.time_parse(messages, conv.tools, rounds)
        # The patch reads earlier calls' ids only for their lengths: ids on the last call alone give the same prompt.
        alone = await bench.time_variants(lean(messages), conv.tools, 0, slow=False)
        if alone["prompts"]["patched"] != timed["prompts"]["patched"]:
            raise RuntimeError(f"call {pick + 2}: ids on the last call alone give another prompt")
        p = {
            "call": pick + 2,
            "messages": len(messages),
            "tokens": len(timed["prompts"]["patched"]),
            "unpatched": timed["unpatched"],
            "patched": timed["patched"],
            "patch": timed["patched"] - timed["unpatched"],
            "parse_all": parse_all,
            "parse_last": parse_last,
        }
        points.append(p)
        print(
            f"{p['call']:5d} {p['messages']:5d} {p['tokens']:7d} {p['unpatched']:8.1f}ms {p['patched']:7.1f}ms"
            f" {p['patched'] / p['unpatched']:5.2f}x {p['patch']:6.1f}ms {parse_all:13.1f}ms {parse_last:12.1f}ms"
        )
    print(f"load after: {_load()}")
    print("\nfit over the curve (N = prompt tokens): t = a + b*N (R^2), and k of t = c*N**k (log-log, N >= 2k)")
    for key in ("unpatched", "patched", "patch", "parse_all", "parse_last"):
        xs = [p["tokens"] for p in points]
        ys = [p[key] for p in points]
        a, b, r2 = linear_fit(xs, ys)
        k = loglog_slope([(x, y) for x, y in zip(xs, ys, strict=True) if x >= 2000 and y > 0])
        print(f"  {key:10} a={a:7.2f}ms  b={b * 1e3:7.3f}ms/1k tokens  R^2={r2:.3f}  k={k:.2f}")
    return points


async def run_family(bench: Bench, plan: list[tuple[int, int]], args: argparse.Namespace) -> None:
    await sizes(bench, plan, args.rounds, args.slow_path)
    if args.curve:
        await curve(bench, *max(plan), args.rounds)


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least squares ``y = a + b*x``: (a, b, R^2)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    a = my - b * mx
    ss_res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return a, b, 1 - ss_res / ss_tot if ss_tot else 1.0


def loglog_slope(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return float("nan")
    return linear_fit([math.log(x) for x, _ in points], [math.log(y) for _, y in points])[1]


def print_size_row(family: str, r: dict, slow: bool, header: bool) -> None:
    if header:
        extra = f" {'slow path':>10} {'ratio':>6}" if slow else ""
        print(
            f"\n{'family':8} {'turns':>5} {'msgs':>5} {'tokens':>7} {'unpatched':>10} {'patched':>9} {'ratio':>6}{extra}  load"
        )
    extra = f" {r['slow path']:8.1f}ms {r['slow path'] / r['unpatched']:5.2f}x" if slow else ""
    print(
        f"{family:8} {r['turns']:5d} {r['messages']:5d} {r['tokens']:7d} {r['unpatched']:8.1f}ms {r['patched']:7.1f}ms"
        f" {r['patched'] / r['unpatched']:5.2f}x{extra}  {r['load']}"
    )


def parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        turns, _, tokens = item.partition("x")
        out.append((int(turns), int(tokens)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="qwen25", choices=("qwen25", "qwen3", "llama3", "all"))
    parser.add_argument("--model", default=None, help="model directory (default: the tiny model of --family)")
    parser.add_argument("--sizes", default=DEFAULT_SIZES, help="TURNSxTOKENS,...: conversations to time")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--curve", action="store_true", help="also time requests along the largest conversation")
    parser.add_argument("--slow-path", action="store_true", help="also time the splice without the fast prefix")
    args = parser.parse_args(argv)
    from nemo_gym_adapter.demo_models import build_tiny_model

    plan = parse_sizes(args.sizes)
    families = ("qwen25", "qwen3", "llama3") if args.family == "all" else (args.family,)
    print(f"load before: {_load()}; {args.rounds} interleaved rounds per figure, medians")
    for family in families:
        bench = Bench(args.model or str(build_tiny_model(family)), family)
        print(f"render_chat, in-process, vLLM {bench.report.vllm_version}")
        asyncio.run(run_family(bench, plan, args))
    print(f"load after: {_load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
