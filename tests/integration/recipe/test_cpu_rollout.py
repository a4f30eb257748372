"""verl 0.9.1's own rollout stack on CPU: LLMServerManager -> CPU vLLM replica -> LLMServerClient, and weight sync.

Built the way the legacy trainer (``RayPPOTrainer.init_workers``) builds it, with verl's classes throughout: the
FSDP2 actor worker group (``ActorRolloutRefWorker`` via ``recipe.nemo_gym.cpu.platform``), then
``LLMServerManager.create(config=, worker_group=actor_wg)``, which resolves ``rollout.name=vllm`` through verl's
``RolloutReplicaRegistry`` (re-pointed by ``recipe.nemo_gym.cpu.rollout``) and launches ``vllm_server_0_0`` in
hybrid mode next to the actor, then ``CheckpointEngineManager`` (naive backend) for sleep/wake and weight sync.

To push arbitrary weights (perturbed, restored) a second group of verl's ``CheckpointEngineWorker`` is used: it
hosts the same ``ServerAdapter`` the actor uses and finds the server by name, so both go through the same
``ServerAdapter.update_weights`` -> ZMQ + shared memory -> engine path. One vLLM start for the whole module.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import time
import types
import urllib.request

import pytest
import torch

from tests.integration.verl_workers import spawn_cpu_actor_workers

pytestmark = pytest.mark.integration

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12]
MAX_TOKENS = 6
LOGPROB_TOL = 1e-4  # fp32 end to end; measured gap vs Hugging Face ~1e-6


def _compose_config(model_path: str):
    """verl's ``ppo_trainer`` config with the CPU actor and rollout overrides, as a hydra command line would give."""
    import verl
    from hydra import compose, initialize_config_dir

    from recipe.nemo_gym.cpu import platform as cpu_platform

    rollout = "actor_rollout_ref.rollout"
    overrides = [
        *cpu_platform.CPU_ACTOR_OVERRIDES,
        f"actor_rollout_ref.model.path={model_path}",
        "trainer.use_v1=false",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        f"{rollout}.log_prob_micro_batch_size_per_gpu=8",
        f"{rollout}.name=vllm",
        f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.dtype=float32",
        # load_format stays verl's default "dummy": the engine starts on random weights and, as in
        # RayPPOTrainer.fit, only weight syncs give it real ones (every weight test pushes what it needs first).
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


def _pusher_worker_group(config):
    """verl's ``CheckpointEngineWorker`` (naive engine + vLLM ``ServerAdapter``) for pushing arbitrary weights."""
    import ray
    from verl.checkpoint_engine.base import CheckpointEngineWorker
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

    pool = RayResourcePool(process_on_nodes=[1], use_gpu=False, max_colocate_count=1, name_prefix="weight_pusher")
    return RayWorkerGroup(
        resource_pool=pool,
        ray_cls_with_init=RayClassWithInitArgs(
            cls=ray.remote(CheckpointEngineWorker),
            rollout_config=config.actor_rollout_ref.rollout,
            model_config=config.actor_rollout_ref.model,
            replica_rank=0,
        ),
        device_name="cpu",
    )


@pytest.fixture(scope="module")
def rollout(tiny_model_qwen25):
    """config, manager (LLMServerManager), actor_wg, pusher_wg: one CPU vLLM replica in our own Ray cluster."""
    import ray

    from recipe.nemo_gym.cpu import platform as cpu_platform
    from recipe.nemo_gym.cpu import rollout as cpu_rollout

    if ray.is_initialized():
        pytest.fail("a Ray cluster is already up in this process; this test needs its own (platform env, GPU slot)")
    env = {"VERL_USE_EXTERNAL_MODULES": cpu_rollout.__name__}
    cpu_platform.apply_env(env)  # the CPU platform first, then the replica registration, in every Ray worker
    # address="local": never join a colleague's cluster. 6 logical CPUs: the actor bundle takes 3, the pusher 1,
    # and verl's load-balancer actor needs one free CPU to be scheduled. One logical GPU slot for the actor.
    ray.init(address="local", num_cpus=6, num_gpus=1, include_dashboard=False, runtime_env={"env_vars": env})
    try:
        from verl.workers.rollout.llm_server import LLMServerManager

        config = _compose_config(str(tiny_model_qwen25))
        started = time.perf_counter()
        actor_wg = spawn_cpu_actor_workers(config).actor_wg
        pusher_wg = _pusher_worker_group(config)
        print(f"actor + pusher worker groups: {time.perf_counter() - started:.1f}s")
        started = time.perf_counter()
        manager = LLMServerManager.create(config=config, worker_group=actor_wg)
        server = ray.get_actor("vllm_server_0_0")
        in_actor = ray.get(server.__ray_call__.remote(lambda self: self.launch_seconds), timeout=60)
        print(
            f"LLMServerManager.create: {time.perf_counter() - started:.1f}s (vLLM start in the actor {in_actor:.1f}s)"
        )
        yield types.SimpleNamespace(config=config, manager=manager, actor_wg=actor_wg, pusher_wg=pusher_wg)
    finally:
        ray.shutdown()


def _generate(client, request_id: str, **sampling):
    sampling = {"temperature": 0.0, "logprobs": True, "max_tokens": MAX_TOKENS, **sampling}
    return asyncio.run(client.generate(request_id, prompt_ids=list(PROMPT), sampling_params=sampling))


def _push_weights(pusher_wg, named_tensors: list[tuple[str, torch.Tensor]], step: int) -> None:
    """One verl weight sync of arbitrary tensors: the naive checkpoint engine holds them, ServerAdapter pushes."""
    import ray

    ray.get(pusher_wg.execute_checkpoint_engine(["send_weights"], [named_tensors]), timeout=120)
    ray.get(pusher_wg.update_weights(global_steps=step), timeout=120)


def _checkpoint(model_dir) -> list[tuple[str, torch.Tensor]]:
    from safetensors.torch import load_file

    return list(load_file(os.path.join(model_dir, "model.safetensors")).items())


def _perturbed(model_dir, seed: int) -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return [(n, t + 0.05 * torch.randn(t.shape, generator=generator)) for n, t in _checkpoint(model_dir)]


def _checkpoint_engine_manager(rollout):
    """The trainer's ``CheckpointEngineManager`` over the actor worker group and the replicas."""
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.utils.config import omega_conf_to_dataclass

    return CheckpointEngineManager(
        config=omega_conf_to_dataclass(rollout.config.actor_rollout_ref.rollout.checkpoint_engine),
        actor_wg=rollout.actor_wg,
        replicas=rollout.manager.get_replicas(),
    )


def _hf_logprobs(model_dir, state: list[tuple[str, torch.Tensor]], response: list[int]) -> list[float]:
    """Log-probabilities of ``response`` after ``PROMPT`` under a Hugging Face forward pass with ``state`` loaded."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    missing, unexpected = model.load_state_dict(dict(state), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embedding when absent
    ids = torch.tensor([PROMPT + list(response)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(PROMPT) - 1 : -1]
    # Over every row, as verl's actor computes it. verl's vLLM server drops the rows beyond len(tokenizer)
    # (monkey_patch_compute_logits): the same distribution only because the tiny models have no padding rows (with
    # the old padded qwen25 the engine sat 3.4e-4 above, more than LOGPROB_TOL).
    return torch.log_softmax(logits, dim=-1).gather(1, ids[0, len(PROMPT) :, None])[:, 0].tolist()


def test_manager_builds_the_cpu_replica_under_verls_names(rollout):
    import ray
    from verl.workers.rollout.replica import get_rollout_replica_class

    from recipe.nemo_gym.cpu.rollout import CPUvLLMReplica, server_actors

    assert get_rollout_replica_class(rollout.config.actor_rollout_ref.rollout.name) is CPUvLLMReplica
    (replica,) = rollout.manager.get_replicas()
    assert isinstance(replica, CPUvLLMReplica)
    assert list(server_actors()) == ["vllm_server_0_0"]

    # The actor found by name is the one behind the replica, and __ray_call__ runs inside it.
    server = ray.get_actor("vllm_server_0_0")
    inside = ray.get(server.__ray_call__.remote(lambda self: (type(self).__name__, self.get_server_address())))
    assert inside[0] == "CPUvLLMHttpServer"
    assert f"{inside[1][0]}:{inside[1][1]}" == rollout.manager.get_addresses()[0]


def test_llm_client_generate_returns_tokens_with_logprobs(rollout):
    client = rollout.manager.get_client()
    out = _generate(client, "gen-1", ignore_eos=True)
    assert len(out.token_ids) == MAX_TOKENS
    assert out.log_probs is not None and len(out.log_probs) == MAX_TOKENS
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in out.log_probs)
    assert out.stop_reason == "completed"
    # Greedy decoding is deterministic: the same request gives the same tokens.
    assert _generate(client, "gen-2", ignore_eos=True).token_ids == out.token_ids


def test_load_balancer_addresses_serve_openai_http(rollout, tiny_model_qwen25):
    import ray

    client = rollout.manager.get_client()
    servers = ray.get(client._load_balancer.get_all_servers.remote())  # verl's LLMServerClient keeps it private
    assert servers == rollout.manager.get_addresses()
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
    client = rollout.manager.get_client()
    before = _generate(client, "sleep-1")
    checkpoints = _checkpoint_engine_manager(rollout)
    checkpoints.sleep_replicas()
    checkpoints.wake_up_replicas()
    after = _generate(client, "sleep-2")
    assert after.token_ids == before.token_ids
    assert after.log_probs == pytest.approx(before.log_probs, abs=1e-6)


def test_weight_sync_changes_the_engine_and_restores_exactly(rollout, tiny_model_qwen25):
    client = rollout.manager.get_client()
    original = _checkpoint(tiny_model_qwen25)
    _push_weights(rollout.pusher_wg, original, step=10)
    baseline = _generate(client, "sync-0")

    perturbed = _perturbed(tiny_model_qwen25, seed=0)
    started = time.perf_counter()
    _push_weights(rollout.pusher_wg, perturbed, step=11)
    print(f"weight sync ({sum(t.numel() for _, t in perturbed)} params): {time.perf_counter() - started:.2f}s")
    changed = _generate(client, "sync-1")
    assert changed.extra_fields["global_steps"] == 11
    diffs = [abs(a - b) for a, b in zip(changed.log_probs, baseline.log_probs, strict=True)]
    assert changed.token_ids != baseline.token_ids or max(diffs) > 1e-2, (baseline, changed)

    _push_weights(rollout.pusher_wg, original, step=12)
    restored = _generate(client, "sync-2")
    assert restored.extra_fields["global_steps"] == 12
    assert restored.token_ids == baseline.token_ids
    assert restored.log_probs == pytest.approx(baseline.log_probs, abs=1e-6)


def test_failed_weight_load_raises_and_keeps_serving(rollout, tiny_model_qwen25):
    """A tensor the engine cannot load fails the sync (instead of hanging verl's sender) and leaves the weights."""
    import ray

    client = rollout.manager.get_client()
    original = _checkpoint(tiny_model_qwen25)
    _push_weights(rollout.pusher_wg, original, step=40)
    before = _generate(client, "fail-0")
    with pytest.raises(ray.exceptions.RayTaskError, match="loading the synced weights failed"):
        _push_weights(rollout.pusher_wg, [("model.no_such_layer.weight", torch.zeros(4, 4)), *original[:3]], step=41)
    after = _generate(client, "fail-1")
    assert after.token_ids == before.token_ids
    assert after.log_probs == pytest.approx(before.log_probs, abs=1e-6)
    _push_weights(rollout.pusher_wg, original, step=42)  # and the next sync works
    assert _generate(client, "fail-2").extra_fields["global_steps"] == 42


def test_synced_weights_match_hugging_face_logprobs(rollout, tiny_model_qwen25):
    """After a sync the engine computes with exactly the pushed tensors (incl. the tied LM head)."""
    pushed = _perturbed(tiny_model_qwen25, seed=1)
    _push_weights(rollout.pusher_wg, pushed, step=20)
    out = _generate(rollout.manager.get_client(), "hf-1", temperature=1.0, ignore_eos=True)
    assert out.log_probs == pytest.approx(_hf_logprobs(tiny_model_qwen25, pushed, out.token_ids), abs=LOGPROB_TOL)


def test_trainer_weight_sync_from_the_fsdp_actor(rollout, tiny_model_qwen25):
    """RayPPOTrainer's own sync (CheckpointEngineManager, naive): FSDP2 actor weights -> engine, exactly."""
    client = rollout.manager.get_client()
    _push_weights(rollout.pusher_wg, _perturbed(tiny_model_qwen25, seed=2), step=30)  # engine != actor now
    stale = _generate(client, "trainer-0", temperature=1.0, ignore_eos=True)
    expected_stale = _hf_logprobs(tiny_model_qwen25, _checkpoint(tiny_model_qwen25), stale.token_ids)
    assert max(abs(a - b) for a, b in zip(stale.log_probs, expected_stale, strict=True)) > 1e-2

    checkpoints = _checkpoint_engine_manager(rollout)
    started = time.perf_counter()
    checkpoints.update_weights(global_steps=31)
    print(f"CheckpointEngineManager.update_weights (FSDP2 actor -> vLLM): {time.perf_counter() - started:.2f}s")
    out = _generate(client, "trainer-1", temperature=1.0, ignore_eos=True)
    assert out.extra_fields["global_steps"] == 31
    expected = _hf_logprobs(tiny_model_qwen25, _checkpoint(tiny_model_qwen25), out.token_ids)
    assert out.log_probs == pytest.approx(expected, abs=LOGPROB_TOL)
