"""Preprocess latency of vLLM's chat render, unpatched vs patched with the token-ID splice (in-process, no engine).

Builds vLLM's own ``OnlineRenderer`` for a model (the object ``/v1/chat/completions`` and ``/tokenize`` render
through) and times ``render_chat`` on a Gym-shaped conversation of N tool-call turns whose last assistant message
carries ``prompt_token_ids``/``generation_token_ids`` (generations spelled in pieces, as a model produces them).
Rounds interleave the variants so machine-load drift hits all of them alike; medians are reported:

- ``unpatched``: stock vLLM (the original method, re-installed for the sample);
- ``patched``: the splice with the fast prefix render (what runs in production);
- ``slow path``: the splice re-rendering the prefix through the hook (what the fast path avoids).

Goal: patched / unpatched <= 1.3 at 8 turns / ~8k tokens.

    python benchmarks/bench_patch.py [--family qwen25|qwen3|llama3|all] [--turns 8] [--tokens 8000] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: tests/support is shared with tests

from tests.support.conversations import TOOLS, piecewise  # noqa: E402

WORDS = "weather city sunny Skinny rain cold hot temperature the a of Paris Oslo humidity wind".split()


def conversation(tok, family: str, turns: int, target_tokens: int) -> list[dict]:
    """``turns`` tool-call turns with tool results sized so the final prompt has about ``target_tokens`` tokens.

    Each turn's ``prompt_token_ids`` is what the patched server fed the engine (the splice of the turn before), so the
    history is one the in-place edit check accepts, as in a real rollout.
    """
    import random

    from nemo_gym_adapter.tokens.splice import last_tokenized_assistant, splice_prompt
    from nemo_gym_adapter.tokens.turn_template import turn_template_from_tokenizer

    def render(msgs: list[dict], add_generation_prompt: bool) -> list[int]:
        text = tok.apply_chat_template(msgs, tools=TOOLS, tokenize=False, add_generation_prompt=add_generation_prompt)
        return tok.encode(text, add_special_tokens=False)

    template = turn_template_from_tokenizer(
        tok, [tok.convert_tokens_to_ids("<|endoftext|>" if family != "llama3" else "<|end_of_text|>")]
    )
    rng = random.Random(0)
    stop = tok.convert_tokens_to_ids("<|eot_id|>" if family == "llama3" else "<|im_end|>")
    sample = " ".join(rng.choice(WORDS) for _ in range(400))
    tokens_per_word = len(tok.encode(sample, add_special_tokens=False)) / 400
    words_per_result = max(10, int((target_tokens / turns - 70) / tokens_per_word))
    messages: list[dict] = [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "What is the weather in Paris and Oslo, day by day?"},
    ]
    for turn in range(turns):
        prompt = render(messages, True)
        found = last_tokenized_assistant(messages)
        if found is not None:
            k, model_prefix = found
            prompt = splice_prompt(model_prefix, render(messages[: k + 1], False), prompt, template)
        call = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
        spoken = f"<tool_call>\n{call}\n</tool_call>" if family != "llama3" else call
        generation = piecewise(tok, spoken) + [stop]
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": f"call_{turn}",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
                "prompt_token_ids": prompt,
                "generation_token_ids": generation,
                "generation_log_probs": [-0.5] * len(generation),
            }
        )
        result = " ".join(rng.choice(WORDS) for _ in range(words_per_result))
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": result})
    return messages


async def bench(model_path: str, family: str, turns: int, target_tokens: int, rounds: int) -> dict:
    from vllm.engine.arg_utils import EngineArgs
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.renderers import renderer_from_config
    from vllm.renderers.online_renderer import OnlineRenderer

    from nemo_gym_adapter.vllm import hooks as vllm_hooks
    from nemo_gym_adapter.vllm import patch as vllm_patch

    config = EngineArgs(model=model_path, max_model_len=16384, enforce_eager=True).create_engine_config()
    online = OnlineRenderer(
        config.model_config,
        renderer_from_config(config),
        request_logger=None,
        chat_template=None,
        chat_template_content_format="auto",
        # As Gym's servers run it: tool calls parsed, so the parser's adjust_request is part of the render.
        enable_auto_tools=True,
        tool_parser="llama3_json" if family == "llama3" else "hermes",
    )
    messages = conversation(online.renderer.tokenizer, family, turns, target_tokens)

    def request():
        return ChatCompletionRequest.model_validate(
            {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 64, "return_token_ids": True}
        )

    report = vllm_patch.apply_patch()
    patched = OnlineRenderer.preprocess_chat
    original = patched.__ngv_original__
    fast_prefix = vllm_hooks.fast_prefix_ids

    async def no_fast_path(*args, **kwargs):
        return None

    variants = {
        "unpatched": (original, fast_prefix),
        "patched": (patched, fast_prefix),
        "slow path": (patched, no_fast_path),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    lengths: dict[str, int] = {}
    for i in range(rounds + 2):  # two warm-up rounds
        for name, (method, prefix_fn) in variants.items():
            OnlineRenderer.preprocess_chat = method
            vllm_hooks.fast_prefix_ids = prefix_fn
            req = request()
            t0 = time.perf_counter()
            result = await online.render_chat(req)
            if not isinstance(result, tuple):
                raise RuntimeError(f"{name} render failed: {result}")
            _, (engine_input,) = result
            elapsed = time.perf_counter() - t0
            if i >= 2:
                samples[name].append(elapsed)
            lengths[name] = len(engine_input["prompt_token_ids"])
    OnlineRenderer.preprocess_chat = patched
    vllm_hooks.fast_prefix_ids = fast_prefix
    median = {name: statistics.median(v) * 1e3 for name, v in samples.items()}
    return {
        "family": family,
        "vllm": report.vllm_version,
        "turns": turns,
        "prompt_tokens": lengths["patched"],
        "unpatched_ms": median["unpatched"],
        "patched_ms": median["patched"],
        "ratio": median["patched"] / median["unpatched"],
        "slow_path_ms": median["slow path"],
        "slow_ratio": median["slow path"] / median["unpatched"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", default="qwen25", choices=("qwen25", "qwen3", "llama3", "all"))
    parser.add_argument("--model", default=None, help="model directory (default: the tiny model of --family)")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8000, help="approximate final prompt length")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    from nemo_gym_adapter.demo_models import build_tiny_model

    families = ("qwen25", "qwen3", "llama3") if args.family == "all" else (args.family,)
    rows = []
    for family in families:
        path = args.model or str(build_tiny_model(family))
        rows.append(asyncio.run(bench(path, family, args.turns, args.tokens, args.rounds)))
    print(f"\nrender_chat latency, median of {args.rounds} interleaved rounds (in-process, vLLM {rows[0]['vllm']})")
    print(
        f"{'family':8} {'turns':>5} {'tokens':>7} {'unpatched':>10} {'patched':>9} {'ratio':>6} {'slow path':>10} {'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['family']:8} {r['turns']:5d} {r['prompt_tokens']:7d} {r['unpatched_ms']:8.1f}ms {r['patched_ms']:7.1f}ms"
            f" {r['ratio']:5.2f}x {r['slow_path_ms']:8.1f}ms {r['slow_ratio']:5.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
