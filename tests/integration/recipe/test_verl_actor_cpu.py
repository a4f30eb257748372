"""verl's real FSDP2 actor on CPU: compute_log_prob matches Hugging Face, update_actor trains.

Built the way the legacy trainer (``RayPPOTrainer.init_workers``, ``trainer.use_v1=False``) builds it:
``ResourcePoolManager`` → ``RayClassWithInitArgs(ActorRolloutRefWorker subclass, config.actor_rollout_ref,
role="actor_rollout")`` → ``create_colocated_worker_cls`` → ``RayWorkerGroup.spawn`` → ``init_model``; and
driven through the trainer's own ``_compute_old_log_prob`` / ``_update_actor`` (padded DataProto →
no-padding TensorDict). The only CPU pieces are ``recipe.nemo_gym.cpu.platform`` (platform "cpu",
gloo process group) and the hydra overrides it lists. The rollout half of "actor_rollout" is verl's
vLLM ``ServerAdapter``, which only talks to a server that is never started here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch

from tests.integration.verl_workers import actor_weights, spawn_cpu_actor_workers

pytestmark = pytest.mark.integration

PROMPT_LEN = 16
RESPONSE_LEN = 12
N = 4  # rollout.n: rows per prompt, sharing a uid
PROMPTS = ["What is the weather in Paris?", "Say something short."]
LOGPROB_TOL = 1e-4  # fp32 end to end


def _compose_config(model_path: str):
    """verl's ppo_trainer config with the CPU overrides, as a hydra command line would produce it."""
    import verl
    from hydra import compose, initialize_config_dir

    from recipe.nemo_gym.cpu import platform as cpu_platform

    overrides = [
        *cpu_platform.CPU_ACTOR_OVERRIDES,
        f"actor_rollout_ref.model.path={model_path}",
        "trainer.use_v1=false",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.n={N}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # prompts; the trainer multiplies by rollout.n
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "algorithm.adv_estimator=masked_grpo",
        f"data.max_prompt_length={PROMPT_LEN}",
        f"data.max_response_length={RESPONSE_LEN}",
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


@pytest.fixture(scope="module")
def cpu_actor(tiny_model_qwen25):
    """(config, worker group) of one CPU FSDP2 ActorRolloutRefWorker.

    Starts its own Ray cluster with one *logical* GPU slot (the legacy ``ResourcePoolManager`` insists on
    Ray "GPU" resources) unless this process already runs one with a free slot. The platform reaches the
    worker through ``worker_env`` (verl's per-worker env), so this process's environment stays untouched.
    """
    import ray

    from recipe.nemo_gym.cpu import platform as cpu_platform

    started_ray = not ray.is_initialized()
    if started_ray:
        # address="local": never join another cluster on this machine (``ray start`` leaves
        # /tmp/ray/ray_current_cluster, which a bare ray.init() would connect to).
        ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False)
    elif ray.available_resources().get("GPU", 0) < 1:
        pytest.fail("this process already runs a Ray cluster without a free (logical) GPU slot; start it with num_gpus")
    try:
        config = _compose_config(str(tiny_model_qwen25))
        started = time.perf_counter()
        workers = spawn_cpu_actor_workers(config, pool_name="cpu_actor_pool", worker_env=dict(cpu_platform.CPU_ENV))
        worker_group = workers.actor_wg
        print(f"init_model: {time.perf_counter() - started:.2f}s")
        yield config, worker_group
        workers.kill()
    finally:
        if started_ray:
            ray.shutdown()


def _trainer_view(config, worker_group):
    """What RayPPOTrainer's _compute_old_log_prob/_update_actor read from ``self`` (no distillation)."""
    return types.SimpleNamespace(config=config, actor_rollout_wg=worker_group, distillation_config=None)


def _batch(tokenizer, temperature: float):
    """8 rows (2 prompts × n=4), legacy agent-loop layout: left-padded prompts, right-padded responses.

    Row 5 is a failed rollout: its response tokens exist but its response_mask is all zero. Row 2 has a
    "tool" span (response_mask 0 inside the response) like a multi-turn trajectory.
    """
    from verl import DataProto
    from verl.utils.model import compute_position_id_with_mask

    gen = torch.Generator().manual_seed(1234)
    pad = tokenizer.pad_token_id
    rows = []
    for p, text in enumerate(PROMPTS):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        ids = list(ids)[-PROMPT_LEN:]
        for _ in range(N):
            length = int(torch.randint(3, RESPONSE_LEN + 1, (1,), generator=gen))
            resp = torch.randint(0, 1600, (length,), generator=gen).tolist()
            rows.append((f"prompt-{p}", ids, resp))

    bs = len(rows)
    prompts = torch.full((bs, PROMPT_LEN), pad, dtype=torch.long)
    prompt_mask = torch.zeros(bs, PROMPT_LEN, dtype=torch.long)
    responses = torch.full((bs, RESPONSE_LEN), pad, dtype=torch.long)
    response_attn = torch.zeros(bs, RESPONSE_LEN, dtype=torch.long)
    for i, (_, ids, resp) in enumerate(rows):
        prompts[i, PROMPT_LEN - len(ids) :] = torch.tensor(ids)
        prompt_mask[i, PROMPT_LEN - len(ids) :] = 1
        responses[i, : len(resp)] = torch.tensor(resp)
        response_attn[i, : len(resp)] = 1
    response_mask = response_attn.clone()
    response_mask[2, 1:3] = 0  # tool output inside a trajectory
    response_mask[5] = 0  # failed rollout
    attention_mask = torch.cat([prompt_mask, response_attn], dim=1)
    batch = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": compute_position_id_with_mask(attention_mask),
        },
        non_tensors={"uid": np.array([uid for uid, _, _ in rows], dtype=object)},
        # As RayPPOTrainer.fit sets them before the old-log-prob step.
        meta_info={"temperature": temperature, "global_token_num": attention_mask.sum(-1).tolist()},
    )
    return batch, rows


def _hf_logprobs(model, rows) -> torch.Tensor:
    """Independent reference: each row unpadded, eager attention, log p(response token | prefix)."""
    out = torch.zeros(len(rows), RESPONSE_LEN)
    with torch.no_grad():
        for i, (_, ids, resp) in enumerate(rows):
            tokens = torch.tensor([ids + resp])
            logits = model(input_ids=tokens).logits[0].float()
            logp = torch.log_softmax(logits[len(ids) - 1 : -1], dim=-1)
            out[i, : len(resp)] = logp.gather(-1, torch.tensor(resp).unsqueeze(-1)).squeeze(-1)
    return out


def test_compute_log_prob_matches_hf_and_update_actor_trains(cpu_actor, tiny_model_qwen25):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage

    config, worker_group = cpu_actor
    trainer = _trainer_view(config, worker_group)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_qwen25)
    batch, rows = _batch(tokenizer, temperature=config.actor_rollout_ref.rollout.temperature)
    lengths = torch.tensor([len(resp) for _, _, resp in rows])
    valid = torch.arange(RESPONSE_LEN)[None, :] < lengths[:, None]

    # 1. compute_log_prob (the trainer's "old_log_prob" step).
    started = time.perf_counter()
    old, _mfu = RayPPOTrainer._compute_old_log_prob(trainer, batch)
    t_logprob = time.perf_counter() - started
    old_lp = old.batch["old_log_probs"]
    assert old_lp.shape == (len(rows), RESPONSE_LEN) and old_lp.dtype == torch.float32
    assert old.batch["entropys"].shape == (len(rows), RESPONSE_LEN)

    hf = AutoModelForCausalLM.from_pretrained(tiny_model_qwen25, dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    reference = _hf_logprobs(hf, rows)
    gap = (old_lp - reference)[valid].abs().max().item()
    print(f"compute_log_prob: {t_logprob:.3f}s, max |verl - HF| = {gap:.2e}")
    assert gap < LOGPROB_TOL
    assert torch.all(old_lp[~valid] == 0)  # padding positions stay zero after no_padding_2_padding

    # 2. advantages through verl's own dispatch (masked_grpo: row 5 is failed, so its group uses 3 rows).
    import recipe.nemo_gym.algorithms.masked_grpo  # noqa: F401  (registers masked_grpo in this driver process)

    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 0.0, 0.0, 1.0, 0.25])
    token_rewards = torch.zeros(len(rows), RESPONSE_LEN)
    token_rewards[torch.arange(len(rows)), lengths - 1] = rewards
    batch = batch.union(old)
    batch.batch["token_level_rewards"] = token_rewards
    batch = compute_advantage(batch, adv_estimator=config.algorithm.adv_estimator, config=config.algorithm)
    advantages = batch.batch["advantages"]
    assert advantages[5].abs().sum() == 0 and advantages[6].abs().sum() > 0

    # 3. update_actor (one PPO mini-batch of 8 rows, one epoch).
    before = actor_weights(worker_group)
    started = time.perf_counter()
    metrics = RayPPOTrainer._update_actor(trainer, batch).meta_info["metrics"]
    t_update = time.perf_counter() - started
    after = actor_weights(worker_group)
    changed = [name for name in before if not torch.equal(before[name], after[name])]
    print(f"update_actor: {t_update:.3f}s, {len(changed)}/{len(before)} tensors changed, metrics keys {len(metrics)}")
    assert len(changed) == len(before), f"unchanged: {sorted(set(before) - set(changed))}"
    assert np.isfinite(np.mean(metrics["actor/pg_loss"]))

    # 4. the new policy: compute_log_prob moves, equals HF loaded with the trained weights, and the
    #    first Adam step (sign descent) raised the policy-gradient surrogate sum(A * Δlogp) on valid tokens.
    started = time.perf_counter()
    new, _ = RayPPOTrainer._compute_old_log_prob(trainer, batch)
    t_logprob2 = time.perf_counter() - started
    new_lp = new.batch["old_log_probs"]
    assert (new_lp - old_lp)[valid].abs().max() > 1e-3
    loaded = hf.load_state_dict(after, strict=False)
    assert not loaded.unexpected_keys and set(loaded.missing_keys) <= {"lm_head.weight"}  # tied to embeddings
    gap_after = (new_lp - _hf_logprobs(hf, rows))[valid].abs().max().item()
    print(f"second compute_log_prob: {t_logprob2:.3f}s, max |verl - HF(trained)| = {gap_after:.2e}")
    assert gap_after < LOGPROB_TOL
    mask = batch.batch["response_mask"].bool()
    surrogate_gain = (advantages * (new_lp - old_lp))[mask].sum().item()
    assert surrogate_gain > 0, surrogate_gain


_PROBE = """
import json
import verl  # VERL_USE_EXTERNAL_MODULES imports our modules here, before anything resolves the platform
from verl.plugin.platform import get_platform
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.utils.device import get_device_id, get_device_name, get_nccl_backend, get_resource_name
from verl.workers.engine import EngineRegistry

print(json.dumps({
    "platform": type(get_platform()).__name__,
    "device": get_device_name(),
    "device_id": get_device_id(),
    "backend": get_nccl_backend(),
    "ray_resource": get_resource_name(),
    "engine": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
    "masked_grpo": get_adv_estimator_fn("masked_grpo").__name__,
}))
"""


def test_env_alone_selects_the_cpu_platform_in_a_fresh_process():
    """What every verl process of a CPU run sees with only the environment set (no code of ours called)."""
    from recipe.nemo_gym.cpu import platform as cpu_platform

    env = dict(os.environ)
    values = cpu_platform.apply_env(env)
    env["VERL_USE_EXTERNAL_MODULES"] = values["VERL_USE_EXTERNAL_MODULES"] + ",recipe.nemo_gym.algorithms.masked_grpo"
    assert values["VERL_USE_EXTERNAL_MODULES"].split(",")[0] == "recipe.nemo_gym.cpu.platform"
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "platform": "PlatformCPU",
        "device": "cpu",
        "device_id": "cpu",
        "backend": "gloo",
        "ray_resource": "GPU",
        "engine": "FSDPEngineWithLMHead",
        "masked_grpo": "compute_masked_grpo_outcome_advantage",
    }


def test_apply_env_keeps_other_external_modules_and_is_idempotent():
    from recipe.nemo_gym.cpu import platform as cpu_platform

    env = {"VERL_USE_EXTERNAL_MODULES": "my.plugin,recipe.nemo_gym.cpu.platform"}
    cpu_platform.apply_env(env)
    first = dict(env)
    cpu_platform.apply_env(env)
    assert env == first
    assert env["VERL_USE_EXTERNAL_MODULES"] == "recipe.nemo_gym.cpu.platform,my.plugin"
    assert env["VERL_PLATFORM"] == "cpu" and env["VERL_ENGINE_DEVICE"] == "cuda"
