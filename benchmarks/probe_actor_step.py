#!/usr/bin/env python
"""Where the actor's time goes on CPU: verl's real FSDP2 actor (the CPU worker), one batch shaped like the SmolLM2
step (32 samples, ~90 prompt + 64 response tokens), timed through the trainer's own ``_compute_old_log_prob`` and
``_update_actor`` under several actor settings, side by side.

Each variant spawns the actor worker group afresh with its hydra overrides (verl's ``ppo_trainer`` config plus the
CPU actor overrides, as the recipe composes them), runs ``--rounds`` log-prob passes and updates on the same batch and
prints the median and range of each, the log-probs' largest difference from the first variant's (a setting that only
changes speed must not change them beyond float32 noise) and the load average. The model is SmolLM2-135M-Instruct
(``${ngv_demo_model:smollm2}``) unless ``--model`` says otherwise.

    .venv/bin/python benchmarks/probe_actor_step.py [--rounds 3] [--variants base rmpad micro8 dynbsz ...]

Not a test; it starts Ray and an actor (~1.5-4 GB): run it under the integ lock (a timing ratio: both locks).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# The SmolLM2 config's actor (configs/nemo_gym_cpu_smollm2_math.yaml + nemo_gym_cpu.yaml), then one change each.
BASE = [
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.model.use_remove_padding=false",
    "actor_rollout_ref.actor.optim.lr=1e-5",
]
VARIANTS: dict[str, list[str]] = {
    "base": [],
    "rmpad": ["actor_rollout_ref.model.use_remove_padding=true"],
    "micro8": ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"],
    "micro16": ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"],
    "micro32": ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32"],
    "dynbsz": [
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2560",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=2560",
    ],
    "rmpad_dynbsz": [
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2560",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=2560",
    ],
    "entropy": ["actor_rollout_ref.actor.calculate_entropy=true"],
}
ROWS, N, PROMPT_LEN, RESPONSE_LEN = 4, 8, 128, 64


def compose(model: str, overrides: list[str]):
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from recipe.nemo_gym.cpu import platform as cpu_platform

    base = [
        *cpu_platform.CPU_ACTOR_OVERRIDES,
        f"actor_rollout_ref.model.path={model}",
        "trainer.use_v1=false",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.rollout.temperature=0.7",
        "algorithm.adv_estimator=grpo",
        f"data.max_prompt_length={PROMPT_LEN}",
        f"data.max_response_length={RESPONSE_LEN}",
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=[*base, *BASE, *overrides])


def make_batch(vocab: int, seed: int = 0):
    """32 rows: left-padded prompts of 78-96 tokens, right-padded responses of 40-64 (the SmolLM2 run's shapes)."""
    from verl import DataProto
    from verl.utils.model import compute_position_id_with_mask

    gen = torch.Generator().manual_seed(seed)
    bs = ROWS * N
    prompts = torch.zeros(bs, PROMPT_LEN, dtype=torch.long)
    prompt_mask = torch.zeros(bs, PROMPT_LEN, dtype=torch.long)
    responses = torch.zeros(bs, RESPONSE_LEN, dtype=torch.long)
    response_mask = torch.zeros(bs, RESPONSE_LEN, dtype=torch.long)
    for i in range(bs):
        p = int(torch.randint(78, 97, (1,), generator=gen))
        r = int(torch.randint(40, RESPONSE_LEN + 1, (1,), generator=gen))
        prompts[i, PROMPT_LEN - p :] = torch.randint(0, vocab, (p,), generator=gen)
        prompt_mask[i, PROMPT_LEN - p :] = 1
        responses[i, :r] = torch.randint(0, vocab, (r,), generator=gen)
        response_mask[i, :r] = 1
    attention = torch.cat([prompt_mask, response_mask], dim=1)
    scores = torch.zeros(bs, RESPONSE_LEN)
    lengths = response_mask.sum(-1)
    scores[torch.arange(bs), lengths - 1] = torch.rand(bs, generator=gen).round()
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention,
            "position_ids": compute_position_id_with_mask(attention),
            "token_level_rewards": scores,
        },
        non_tensors={"uid": np.array([f"u{i // N}" for i in range(bs)], dtype=object)},
        meta_info={"temperature": 0.7, "global_token_num": attention.sum(-1).tolist()},
    )


def run_variant(name: str, model: str, rounds: int, reference: torch.Tensor | None) -> dict[str, object]:
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage

    from recipe.nemo_gym.cpu import platform as cpu_platform
    from tests.integration.verl_workers import spawn_cpu_actor_workers

    config = compose(model, VARIANTS[name])
    t0 = time.perf_counter()
    workers = spawn_cpu_actor_workers(config, pool_name=f"probe_{name}", worker_env=dict(cpu_platform.CPU_ENV))
    init_s = time.perf_counter() - t0
    trainer = types.SimpleNamespace(config=config, actor_rollout_wg=workers.actor_wg, distillation_config=None)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model).vocab_size
    logprob_s, update_s = [], []
    first = None
    try:
        for _ in range(rounds):
            batch = make_batch(vocab)
            t = time.perf_counter()
            old, _ = RayPPOTrainer._compute_old_log_prob(trainer, batch)
            logprob_s.append(time.perf_counter() - t)
            if first is None:
                first = old.batch["old_log_probs"].clone()
            batch = batch.union(old)
            batch = compute_advantage(batch, adv_estimator=AdvantageEstimator.GRPO, num_repeat=N)
            t = time.perf_counter()
            RayPPOTrainer._update_actor(trainer, batch)
            update_s.append(time.perf_counter() - t)
    finally:
        workers.kill()
    mask = make_batch(vocab).batch["response_mask"].bool()
    diff = float((first - reference)[mask].abs().max()) if reference is not None and first is not None else 0.0
    return {"init_s": init_s, "logprob_s": logprob_s, "update_s": update_s, "first": first, "diff_vs_first": diff}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the SmolLM2 conversion")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", nargs="+", default=["base", "rmpad", "micro8", "dynbsz"], choices=list(VARIANTS))
    args = p.parse_args(argv)
    import ray

    from nemo_gym_adapter.demo_models.converter import build_demo_model

    model = args.model or str(build_demo_model("smollm2"))
    ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False)
    results = {}
    try:
        reference = None
        for name in args.variants:
            load = os.getloadavg()[0]
            r = run_variant(name, model, args.rounds, reference)
            r["load"] = (load, os.getloadavg()[0])
            if reference is None:
                reference = r["first"]
            results[name] = r
            print(
                f"{name}: init {r['init_s']:.1f}s; log-prob pass {statistics.median(r['logprob_s']):.2f}s "
                f"({min(r['logprob_s']):.2f}-{max(r['logprob_s']):.2f}); update {statistics.median(r['update_s']):.2f}s "
                f"({min(r['update_s']):.2f}-{max(r['update_s']):.2f}); max |log-prob - {args.variants[0]}| "
                f"{r['diff_vs_first']:.1e}; load {r['load'][0]:.1f} -> {r['load'][1]:.1f}",
                flush=True,
            )
    finally:
        ray.shutdown()
    base = results[args.variants[0]]
    for name, r in results.items():
        lp = statistics.median(r["logprob_s"]) / statistics.median(base["logprob_s"])
        up = statistics.median(r["update_s"]) / statistics.median(base["update_s"])
        print(f"ratio {name}/{args.variants[0]}: log-prob pass {lp:.3f}, update {up:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
