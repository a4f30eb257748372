"""What a training step of the tool model costs on CPU, per way of training it, side by side on the same batch: full
fine-tuning in float32 (the shipped config), bfloat16 compute (autocast, float32 master weights: what FSDP2's
``mixed_precision.param_dtype: bf16`` does), and LoRA (peft, rank 16 on every linear layer: what verl's
``model.lora_rank`` does) in float32. Per variant, in its own process: one forward+backward and an Adam step over
``--batch`` sequences of ``--tokens`` tokens with gradient checkpointing (the recipe's micro batch), wall seconds, peak
RSS, trainable parameters, Adam state.

    python benchmarks/bench_actor_cost.py --model DIR [--batch 4] [--tokens 640] [--repeats 2]

Prints one JSON line per variant and a table; the ratios are against float32 full fine-tuning in the same run, with
the load average beside them. Not a test (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("fp32_full", "bf16_full", "fp32_lora16")


def measure(model_dir: str, variant: str, batch: int, tokens: int, repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.gradient_checkpointing_enable()
    model.config.use_cache = False
    if variant.endswith("lora16"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=1e-6)
    ids = torch.randint(0, min(151643, model.config.vocab_size), (batch, tokens))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=variant.startswith("bf16")):
            logits = model(input_ids=ids).logits
        logp = torch.log_softmax(logits.float(), dim=-1)[:, :-1].gather(-1, ids[:, 1:, None])
        (-logp.mean()).backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        del logits, logp
    trainable = sum(p.numel() for p in params)
    return {
        "variant": variant,
        "batch": batch,
        "tokens": tokens,
        "step_s": [round(t, 1) for t in times],
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "trainable_params_m": round(trainable / 1e6, 1),
        "adam_state_gb": round(2 * 4 * trainable / 2**30, 2),
        "load1": round(os.getloadavg()[0], 1),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--tokens", type=int, default=640)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.variant:
        print(json.dumps(measure(args.model, args.variant, args.batch, args.tokens, args.repeats)), flush=True)
        return 0
    rows = []
    for variant in VARIANTS:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--model", args.model, "--variant", variant]
        cmd += ["--batch", str(args.batch), "--tokens", str(args.tokens), "--repeats", str(args.repeats)]
        out = subprocess.run(cmd, capture_output=True, text=True)
        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
        if out.returncode != 0 or not line.startswith("{"):
            print(json.dumps({"variant": variant, "error": out.stderr.strip()[-600:]}), flush=True)
            continue
        rows.append(json.loads(line))
        print(line, flush=True)
    if not rows:
        return 1
    base = min(rows[0]["step_s"])
    print("\n| variant | step s (best) | vs fp32 full | peak RSS GB | trainable M | Adam state GB | load |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        best = min(r["step_s"])
        print(
            f"| {r['variant']} | {best} | {best / base:.2f} | {r['peak_rss_gb']} | {r['trainable_params_m']} | "
            f"{r['adam_state_gb']} | {r['load1']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
