"""verl 0.9.1's own rollout stack on CPU: LLMServerManager -> CPU vLLM replica -> LLMServerClient, and weight sync.

Built the way the legacy trainer (``RayPPOTrainer.init_workers``) builds it, with verl's classes throughout:
``LLMServerManager.create(config=, worker_group=)`` resolves ``rollout.name=vllm`` through verl's
``RolloutReplicaRegistry`` (re-pointed by ``recipe.nemo_gym.cpu_rollout``), launches the server actor
``vllm_server_0_0`` in hybrid mode next to the worker group, and hands out an ``LLMServerClient`` over verl's
load balancer. The one stand-in: the worker group is verl's ``CheckpointEngineWorker`` instead of the FSDP2
``ActorRolloutRefWorker``; both push weights through the same verl ``ServerAdapter.update_weights`` (ZMQ + shared
memory into the engine), which is what the weight-sync tests exercise. One vLLM start for the whole module.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
import urllib.request

import pytest
import torch

pytestmark = pytest.mark.integration

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
MAX_TOKENS = 6
START_TIMEOUT_S = float(os.environ.get("NGV_VLLM_START_TIMEOUT", "900"))


def _compose_config(model_path: str):
    """verl's ``ppo_trainer`` config with the CPU rollout overrides, as a hydra command line would produce it."""
    import verl
    from hydra import compose, initialize_config_dir

    rollout = "actor_rollout_ref.rollout"
    overrides = [
        f"actor_rollout_ref.model.path={model_path}",
        "trainer.use_v1=false",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"{rollout}.name=vllm",
        f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.dtype=float32",
        f"{rollout}.load_format=auto",
        f"{rollout}.max_model_len=1024",
        f"{rollout}.prompt_length=256",
        f"{rollout}.response_length=32",
        f"{rollout}.max_num_seqs=8",
        f"{rollout}.max_num_batched_tokens=1024",
        # The sender allocates one shared-memory bucket of this size per sync: verl's 2 GiB default is for GPUs.
        f"{rollout}.checkpoint_engine.update_weights_bucket_megabytes=64",
    ]
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


@pytest.fixture(scope="module")
def rollout(tiny_model_qwen25):
    """(config, LLMServerManager, worker group) with one CPU vLLM replica in our own Ray cluster."""
    import ray

    from recipe.nemo_gym import cpu_platform, cpu_rollout

    if ray.is_initialized():
        pytest.fail("a Ray cluster is already up in this process; this test needs its own (platform env, GPU slot)")
    env = {"VERL_USE_EXTERNAL_MODULES": cpu_rollout.__name__}
    cpu_platform.apply_env(env)  # the CPU platform first, then the replica registration, in every Ray worker
    ray.init(address="local", num_cpus=4, num_gpus=1, include_dashboard=False, runtime_env={"env_vars": env})
    try:
        from verl.checkpoint_engine.base import CheckpointEngineWorker
        from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
        from verl.workers.rollout.llm_server import LLMServerManager

        config = _compose_config(str(tiny_model_qwen25))
        pool = RayResourcePool(process_on_nodes=[1], use_gpu=True, max_colocate_count=1, name_prefix="cpu_rollout")
        worker_group = RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=RayClassWithInitArgs(
                cls=ray.remote(CheckpointEngineWorker),
                rollout_config=config.actor_rollout_ref.rollout,
                model_config=config.actor_rollout_ref.model,
                replica_rank=0,
            ),
            device_name="cpu",
        )
        started = time.perf_counter()
        manager = LLMServerManager.create(config=config, worker_group=worker_group)
        server = ray.get_actor("vllm_server_0_0")
        in_actor = ray.get(server.__ray_call__.remote(lambda self: self.launch_seconds), timeout=60)
        print(
            f"LLMServerManager.create: {time.perf_counter() - started:.1f}s (vLLM start in the actor {in_actor:.1f}s)"
        )
        yield config, manager, worker_group
    finally:
        ray.shutdown()


def _generate(client, request_id: str, **sampling):
    sampling = {"temperature": 0.0, "logprobs": True, "max_tokens": MAX_TOKENS, **sampling}
    return asyncio.run(client.generate(request_id, prompt_ids=list(PROMPT), sampling_params=sampling))


def _push_weights(worker_group, named_tensors: list[tuple[str, torch.Tensor]], step: int) -> None:
    """One verl weight sync: hand the tensors to the worker's naive checkpoint engine, then ServerAdapter pushes."""
    import ray

    ray.get(worker_group.execute_checkpoint_engine(["send_weights"], [named_tensors]), timeout=300)
    ray.get(worker_group.update_weights(global_steps=step), timeout=300)


def _checkpoint(model_dir) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load_file

    return list(load_file(os.path.join(model_dir, "model.safetensors")).items())


def test_manager_builds_the_cpu_replica_under_verls_names(rollout):
    import ray
    from verl.workers.rollout.replica import get_rollout_replica_class

    from recipe.nemo_gym.cpu_rollout import CPUvLLMReplica, server_actors

    config, manager, _ = rollout
    assert get_rollout_replica_class(config.actor_rollout_ref.rollout.name) is CPUvLLMReplica
    (replica,) = manager.get_replicas()
    assert isinstance(replica, CPUvLLMReplica)
    assert list(server_actors()) == ["vllm_server_0_0"]

    # The actor found by name is the one behind the replica, and __ray_call__ runs inside it.
    server = ray.get_actor("vllm_server_0_0")
    inside = ray.get(server.__ray_call__.remote(lambda self: (type(self).__name__, self.get_server_address())))
    assert inside[0] == "CPUvLLMHttpServer"
    assert f"{inside[1][0]}:{inside[1][1]}" == manager.get_addresses()[0]


def test_llm_client_generate_returns_tokens_with_logprobs(rollout):
    _, manager, _ = rollout
    out = _generate(manager.get_client(), "gen-1", ignore_eos=True)
    assert len(out.token_ids) == MAX_TOKENS
    assert out.log_probs is not None and len(out.log_probs) == MAX_TOKENS
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in out.log_probs)
    assert out.stop_reason == "completed"
    # Greedy decoding is deterministic: the same request gives the same tokens.
    again = _generate(manager.get_client(), "gen-2", ignore_eos=True)
    assert again.token_ids == out.token_ids


def test_load_balancer_addresses_serve_openai_http(rollout, tiny_model_qwen25):
    import ray

    _, manager, _ = rollout
    client = manager.get_client()
    servers = ray.get(client._load_balancer.get_all_servers.remote())  # verl's LLMServerClient keeps it private
    assert servers == manager.get_addresses()
    assert re.fullmatch(r"[0-9.]+:\d+", servers[0]), servers
    body = {
        "model": str(tiny_model_qwen25),
        "messages": [{"role": "user", "content": "What is the weather?"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    request = urllib.request.Request(
        f"http://{servers[0]}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        answer = json.load(response)
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert 1 <= answer["usage"]["completion_tokens"] <= 4


def test_trainer_sleep_and_wake_keep_serving(rollout):
    """What RayPPOTrainer does around each step: sleep after init, wake before rollout (no-ops on CPU)."""
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.utils.config import omega_conf_to_dataclass

    config, manager, worker_group = rollout
    before = _generate(manager.get_client(), "sleep-1")
    checkpoints = CheckpointEngineManager(
        config=omega_conf_to_dataclass(config.actor_rollout_ref.rollout.checkpoint_engine),
        actor_wg=worker_group,
        replicas=manager.get_replicas(),
    )
    checkpoints.sleep_replicas()
    checkpoints.wake_up_replicas()
    after = _generate(manager.get_client(), "sleep-2")
    assert after.token_ids == before.token_ids
    assert after.log_probs == pytest.approx(before.log_probs, abs=1e-6)


def test_weight_sync_changes_the_engine_and_restores_exactly(rollout, tiny_model_qwen25):
    _, manager, worker_group = rollout
    client = manager.get_client()
    original = _checkpoint(tiny_model_qwen25)
    baseline = _generate(client, "sync-0")

    generator = torch.Generator().manual_seed(0)
    perturbed = [(name, t + 0.05 * torch.randn(t.shape, generator=generator)) for name, t in original]
    started = time.perf_counter()
    _push_weights(worker_group, perturbed, step=1)
    print(f"weight sync ({sum(t.numel() for _, t in perturbed)} params): {time.perf_counter() - started:.2f}s")
    changed = _generate(client, "sync-1")
    assert changed.extra_fields["global_steps"] == 1
    diffs = [abs(a - b) for a, b in zip(changed.log_probs, baseline.log_probs, strict=True)]
    assert changed.token_ids != baseline.token_ids or max(diffs) > 1e-2, (baseline, changed)

    _push_weights(worker_group, original, step=2)
    restored = _generate(client, "sync-2")
    assert restored.extra_fields["global_steps"] == 2
    assert restored.token_ids == baseline.token_ids
    assert restored.log_probs == pytest.approx(baseline.log_probs, abs=1e-5)


def test_synced_weights_match_hugging_face_logprobs(rollout, tiny_model_qwen25):
    """After a sync the engine computes with exactly the pushed tensors: its logprobs equal a HF forward pass."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, manager, worker_group = rollout
    generator = torch.Generator().manual_seed(1)
    pushed = [(n, t + 0.05 * torch.randn(t.shape, generator=generator)) for n, t in _checkpoint(tiny_model_qwen25)]
    _push_weights(worker_group, pushed, step=3)
    out = _generate(manager.get_client(), "hf-1", temperature=1.0, ignore_eos=True)

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_qwen25), torch_dtype=torch.float32)
    missing, unexpected = model.load_state_dict(dict(pushed), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding when absent
    ids = torch.tensor([PROMPT + list(out.token_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(PROMPT) - 1 : -1]
    # verl's vLLM server masks the padded vocabulary tail beyond the tokenizer (monkey_patch_compute_logits).
    logits[:, len(AutoTokenizer.from_pretrained(str(tiny_model_qwen25))) :] = float("-inf")
    expected = torch.log_softmax(logits.float(), dim=-1).gather(1, ids[0, len(PROMPT) :, None])[:, 0]
    assert out.log_probs == pytest.approx(expected.tolist(), abs=1e-4)
