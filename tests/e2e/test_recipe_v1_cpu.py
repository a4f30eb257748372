"""The hydra-launched recipe on verl's v1 (TransferQueue) trainer on CPU, end to end, as a user launches it (the
default: ``trainer.use_v1=True``, ``trainer.v1.trainer_mode=sync``).

One subprocess: verl's v1 ``PPOTrainerSync`` with the FSDP2 actor on CPU, real TransferQueue, the CPU vLLM replica
(patched), NeMo Gym (``example_single_tool_call``) started by our manager (``recipe.nemo_gym.managers.v1``), two
GRPO steps (``masked_grpo``) with a weight sync after each, then a third step whose rows are all too long (the legacy
e2e's ``masked_step_rows``). Checked from verl's console logger: steps 1 and 2 are logged with the rollout metrics
under their own names (``gym/<env>/reward_mean``, ``gym/all/masked_rate/<reason>``, never ``timing_s/gym/...``), the
on-policy gap, verl's staleness metrics computed from the weight-version tags we stamp (a sample generated under
weight version k = step - 1 carries k), and the engine probe moves after step 1 (the weight sync reached vLLM); in
step 3 every rollout is masked and the groups still finish (the replay buffer does not stall), counted by reason.
(A separate one-step launch asserted the all-masked step before: ~100 s less CI.) No process may be left. Helpers
are the legacy e2e's (``tests/e2e/test_recipe_cpu_smoke.py``).
"""

from __future__ import annotations

import math

import pytest

from nemo_gym_adapter.rollouts.trajectory import MaskReason
from tests.e2e import test_recipe_cpu_smoke as legacy
from tests.e2e.test_recipe_cpu_smoke import (
    ENV,
    GAP_TOL,
    LR,
    PROBE_MIN_MOVE,
    STEPS,
    _parse_steps,
    _run_recipe,
    masked_step_overrides,
)

reaped_children = legacy.reaped_children  # the legacy e2e's fixture: this process reaps what the run leaves
pytestmark = pytest.mark.e2e

V1 = ("trainer.use_v1=true", "trainer.v1.trainer_mode=sync")


def _masked_counts_add_up(m: dict[str, float]) -> None:
    by_reason = sum(m[f"gym/all/masked_rate/{r.value}"] for r in MaskReason)
    assert by_reason == pytest.approx(m["gym/all/masked_rate"]), m


def test_grpo_steps_then_an_all_masked_step_on_v1_with_plain_gym_metrics_and_no_orphans(tmp_path, reaped_children):
    text, wall = _run_recipe(tmp_path, *V1, *masked_step_overrides(tmp_path), f"actor_rollout_ref.actor.optim.lr={LR}")
    assert "PPOTrainerSync" in text or "v1, sync" in text, text[-3000:]
    steps = _parse_steps(text)
    assert sorted(steps) == list(range(1, STEPS + 2)), f"steps logged: {sorted(steps)}\n{text[-3000:]}"
    for step, m in steps.items():
        assert not [k for k in m if k.startswith("timing_s/gym")], sorted(m)  # plain names, not timings
        _masked_counts_add_up(m)
        assert m["gym/all/num_samples"] == 2 * 4  # train_batch_size x rollout.n, every sample put (and trained)
        if step > STEPS:
            continue  # the all-masked step, below
        for key in (
            f"gym/{ENV}/reward_mean",
            "gym/all/masked_rate",
            "gym/all/masked_rate/non_contiguous",
            "gym/all/contiguity_rate",
            "gym/timing/rollout_s",
            "gym/engine/probe_logprob_mean",
            "onpolicy/rollout_nll_mean",
            "actor/pg_loss",
        ):
            assert key in m and math.isfinite(m[key]), (step, key, sorted(m))
        _trusted_logprobs_step(step, m)
        # verl computes these from our min/max_global_steps tags: generated under weight version step - 1, in one go.
        assert m["training/off_policy/trajectory_staleness/max"] == 0, (step, m)
        assert m["training/off_policy/trajectory_staleness_worst/max"] == 0, (step, m)
        assert m["training/off_policy/trajectory_spans/max"] == 1, (step, m)
    probes = [steps[s]["gym/engine/probe_logprob_mean"] for s in range(1, STEPS + 1)]
    assert abs(probes[1] - probes[0]) > PROBE_MIN_MOVE, f"rollout engine weights did not change after step 1: {probes}"
    # Every rollout of the last step masked (prompts longer than data.max_prompt_length): each group is still
    # published finished with its masked samples, so verl's replay buffer samples it (no stall, no "no materializable
    # trajectories" error) and the step trains on nothing.
    m = steps[STEPS + 1]
    assert m["gym/all/masked_rate"] == 1.0 and m["gym/all/masked_rate/prompt_too_long"] == 1.0
    # nemo_gym.trusted_logprobs: a trusted step (check_every 10) recomputes nothing, so no gap is reported; the
    # sampler-side entropy estimate has no trained token to average
    assert m["onpolicy/trusted"] == 1.0 and "onpolicy/num_tokens" not in m, m
    assert math.isnan(m["onpolicy/rollout_nll_mean"]), m
    print(
        f"v1 engine probe per step: {probes}; recipe: {wall:.0f}s wall; per step "
        + ", ".join(
            f"{s}: gen {m['timing_s/gen']:.1f}s step {m['timing_s/step']:.1f}s rollout {m['gym/timing/rollout_s']:.1f}s "
            f"put {m['gym/timing/tq_put_s']:.3f}s old log-probs {m['timing_s/old_log_prob']:.2f}s "
            f"gap {m.get('onpolicy/logprob_abs_diff_mean', math.nan):.1e} trusted {m['onpolicy/trusted']:.0f}"
            for s, m in sorted(steps.items())
            if s <= STEPS
        )
        + f"; all-masked step: actor/pg_loss {m.get('actor/pg_loss')}"
    )
    assert not (tmp_path / "gym" / "gym.pid").exists()  # the manager stopped Gym itself
    # nemo_gym.ray_head: early (the default): Gym joined the Ray head the task runner started; it is stopped too
    assert "Connecting to Ray cluster at specified address: 127.0.0.1:" in (tmp_path / "gym" / "gym.log").read_text()
    assert not (tmp_path / "gym" / "gym_ray.pid").exists()
    # nemo_gym.warm_launcher (the default): the launch ran in the warm launcher started next to that head
    warm_logs = "".join(p.read_text() for p in (tmp_path / "gym").glob("gym_warm-*.log"))
    assert "warm Gym launcher: launch received" in warm_logs, warm_logs[-2000:]
    assert not (tmp_path / "gym" / "gym_warm.pid").exists()
    left = reaped_children()
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"


def _trusted_logprobs_step(step: int, m: dict[str, float]) -> None:
    """``nemo_gym.trusted_logprobs`` (on in the CPU configs, ``check_every`` 10): step 1 recomputes the old log-probs and
    the guard measures the gap (float32-small: within its bounds); step 2 uses the rollout's log-probs as the old
    ones, so nothing recomputed them: no gap, no ``actor/entropy`` (verl computes it in that pass)."""
    if step == 1:
        assert m["onpolicy/trusted"] == 0.0 and m["onpolicy/guard/within"] == 1.0, m
        assert m["onpolicy/num_tokens"] > 0 and m["onpolicy/guard/num_tokens"] == m["onpolicy/num_tokens"]
        assert m["onpolicy/logprob_abs_diff_mean"] < GAP_TOL, (step, m["onpolicy/logprob_abs_diff_mean"])
        assert math.isfinite(m["onpolicy/kl_k3"]) and math.isfinite(m["actor/entropy"])
    else:
        assert m["onpolicy/trusted"] == 1.0, m
        gone = [k for k in m if k.startswith(("onpolicy/logprob_", "onpolicy/guard/", "actor/entropy"))]
        assert not gone, gone


# verl's async v1 modes on the README demo: (steps, overrides). separate_async serves rollouts from a standalone
# replica that the CPU checkpoint engine (recipe/nemo_gym/cpu/checkpoint_engine.py) syncs; hybrid_engine=false so Gym's
# replica list holds (async_modes.check_separate_async); train_batch_size 8 = parameter_sync_step 1 x mini-batch 8.
SEPARATE_ASYNC = (
    "trainer.v1.separate_async.parameter_sync_step=1",
    "actor_rollout_ref.hybrid_engine=false",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "ray_kwargs.ray_init.num_gpus=2",  # Ray's logical GPU slots: one for the actor, one for the standalone replica
    "actor_rollout_ref.rollout.checkpoint_engine.backend=cpu_zmq",
    "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.nemo_gym.cpu.checkpoint_engine",
)
# (steps, overrides, config). colocate_async runs Gym's example_single_tool_call (turns of up to 192 tokens) with four
# batches of rollouts ahead, so turns are in flight at every weight sync (benchmarks/bench_partial_rollouts.py's load):
# partial rollouts must resume them all, none regenerated.
COLOCATE_ASYNC = ("trainer.v1.colocate_async.num_warmup_batches=4",)
ASYNC_MODES = {
    "colocate_async": (6, COLOCATE_ASYNC, "nemo_gym_cpu"),
    "separate_async": (3, SEPARATE_ASYNC, "nemo_gym_cpu_toy"),
}


# One async mode in the default tier, the other in the slow tier (CI budget, docs/CI.md): separate_async covers more of
# ours (the CPU checkpoint engine, the standalone replica, async_modes.check_separate_async); colocate_async runs
# the same manager, tags and staleness path on verl's colocated replica, with long turns that partial rollouts must
# resume (the default tier proves a resume on the live server: tests/integration/vllm/test_weight_sync_abort.py).
@pytest.mark.parametrize("mode", [pytest.param("colocate_async", marks=pytest.mark.slow), "separate_async"])
def test_async_mode_overlaps_rollouts_with_training_and_tags_weight_versions(tmp_path, reaped_children, mode):
    """verl's async modes (``separate_async`` on the README demo: toy environment, one-letter replies;
    ``colocate_async`` on Gym's example_single_tool_call with long turns): rollouts of the next batches run
    while the actor trains, so some steps train on samples generated under the previous weights. Every sample carries
    the weight version the vLLM servers held when it was generated (``min/max_global_steps``), which verl turns into
    staleness metrics: never negative (no sample claims weights newer than the trainer's), 0 on step 1 (everything was
    generated under version 0), at least 1 on some step (the overlap happened). ``separate_async``: the standalone
    replica's weights move every step (the CPU checkpoint engine delivered them; the probe reads that replica).
    Turns in flight at a sync are resumed from their tokens (partial rollouts): none answered 503, none regenerated;
    ``colocate_async``, whose long turns are always in flight at a sync, resumed some. No process may be left: the
    run that first failed this left a fresh Ray cluster's agents behind (docs/V1_NOTES.md). ~2-3 min wall each
    (colocate_async 6 steps, separate_async 3)."""
    steps_wanted, overrides, config_name = ASYNC_MODES[mode]
    text, wall = _run_recipe(
        tmp_path,
        "trainer.use_v1=true",
        f"trainer.v1.trainer_mode={mode}",
        f"trainer.total_training_steps={steps_wanted}",
        *overrides,
        config_name=config_name,
    )
    assert f"(v1, {mode})" in text, text[-3000:]
    steps = _parse_steps(text)
    assert sorted(steps) == list(range(1, steps_wanted + 1)), f"steps logged: {sorted(steps)}\n{text[-3000:]}"
    stale = [steps[s]["training/off_policy/trajectory_staleness/max"] for s in sorted(steps)]
    for s, m in steps.items():
        assert m["training/off_policy/trajectory_staleness/min"] >= 0, (s, m)
        assert m["training/off_policy/trajectory_spans/min"] >= 1, (s, m)
        assert (
            m["training/off_policy/trajectory_staleness_worst/max"] >= m["training/off_policy/trajectory_staleness/max"]
        )
        if "gym/all/masked_rate" in m:  # rollouts finished during this step (async: not every step)
            _masked_counts_add_up(m)
    assert stale[0] == 0 and max(stale) >= 1, f"staleness per step: {stale}"
    # Model calls vLLM aborted at a weight sync and the abort guard sent back to Gym for a retry (vllm_abort):
    # read from the server actors, cumulative. With one-letter replies few or none are in flight at an abort.
    aborted = [
        steps[s]["gym/engine/aborted_turns_total"]
        for s in sorted(steps)
        if "gym/engine/aborted_turns_total" in steps[s]
    ]
    assert aborted and aborted == sorted(aborted), f"aborted turns per step: {aborted}"
    # Partial rollouts (nemo_gym_adapter.vllm.resume): every turn an abort interrupted resumed from its tokens inside
    # the server; none was answered 503 and regenerated. The last counters read from verl's server actors (cumulative;
    # read at a step's first dispatch, so they lag a sync). The toy's one-letter turns are rarely in flight at a sync
    # (separate_async, 3 steps: measured 0); colocate_async's long turns always are.
    engine = {
        k.removeprefix("gym/engine/").removesuffix("_total"): v
        for k, v in steps[max(s for s in steps if "gym/engine/interrupted_turns_total" in steps[s])].items()
        if k.startswith("gym/engine/") and k.endswith("_total")
    }
    assert engine["regenerated_tokens"] == engine["aborted_turns"] == engine["refused_turns"] == 0, engine
    assert engine["resumes"] >= engine["interrupted_turns"] >= engine["resumed_turns"], engine
    if mode == "colocate_async":
        assert engine["resumed_turns"] > 0 and engine["resumed_tokens"] > 0, f"no turn resumed at a sync: {engine}"
    masked_aborted = sum(m.get("gym/all/masked_rate/aborted", 0.0) for m in steps.values())
    probes = [
        steps[s]["gym/engine/probe_logprob_mean"] for s in sorted(steps) if "gym/engine/probe_logprob_mean" in steps[s]
    ]
    if mode == "separate_async":  # every step syncs the standalone replica (parameter_sync_step=1)
        assert len(probes) == steps_wanted, probes
        assert all(abs(b - a) > PROBE_MIN_MOVE for a, b in zip(probes, probes[1:], strict=False)), probes
    print(
        f"{mode}: {wall:.0f}s wall; staleness max per step {stale}; aborted turns (cumulative) {aborted}; "
        f"masked 'aborted' rate summed over steps {masked_aborted}; engine probe per step {probes}; "
        f"interrupted turns {engine}"
    )
    assert not (tmp_path / "gym" / "gym.pid").exists()
    left = reaped_children()
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"
