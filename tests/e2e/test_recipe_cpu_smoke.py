"""The hydra-launched recipe on CPU, end to end: ``python -m recipe.nemo_gym.main --config-name nemo_gym_cpu
trainer.use_v1=false`` (the v1 trainer, the default, is tests/e2e/test_recipe_v1_cpu.py, with these helpers).

One subprocess runs the whole thing as a user would: verl's legacy trainer with the FSDP2 actor on CPU, the CPU vLLM
replica (patched), NeMo Gym (``example_single_tool_call``, its bundled example rows) started by our manager, three
GRPO steps (``masked_grpo``) with a weight sync to vLLM after each. Checked from the console logger's output: steps
1 and 2 are logged with per-environment reward, masked rate, contiguity rate and the rollout-vs-actor logprob gap,
and the engine's weights moved between them. Step 3's rows have prompts longer than ``data.max_prompt_length``
(:func:`masked_step_rows`), so every rollout of that step is masked: the step must still finish, with the gap metrics
(ours and verl's ``rollout_corr/*``) as NaN. (Two launches asserted this before, one of them only for the all-masked
step: one launch is ~150 s less CI.) Afterwards no process may be left: the test process becomes a child subreaper
for the run, so anything the run leaves behind (Ray helpers, Gym servers re-parented away from their dead parents)
lands here and is caught.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

pytestmark = pytest.mark.e2e

STEPS = 2
LR = 1e-2
PROBE_MIN_MOVE = 2e-6  # float32 log-probs near -8 resolve ~5e-7; an unsynced engine gives exactly 0 (deterministic CPU)
TIMEOUT_S = float(os.environ.get("NGV_E2E_TIMEOUT", "1500"))
ENV = "example_single_tool_call_simple_agent"
LEGACY = "trainer.use_v1=false"  # verl's legacy trainer (the shipped configs default to v1)
PR_SET_CHILD_SUBREAPER = 36
# Mean |rollout - actor| log-prob, fp32 on both sides: float32 rounding (~3e-7; the tiny models' old padded vocabulary
# gave 3e-4). The step-2 gap also checks verl's weight sync into vLLM.
GAP_TOL = 1e-5
_VALUE = re.compile(r"^(?:np\.(?:float|int)\d+\()?([-+0-9.eEinfa]+)\)?$")


def _subreaper(on: bool) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def _parse_steps(log: str) -> dict[int, dict[str, float]]:
    """verl's console logger: ``step:N - key:value - key:value ...`` (one line per step, maybe Ray-prefixed)."""
    steps: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        match = re.search(r"step:(\d+) - (.*)$", line)
        if not match:
            continue
        metrics = {}
        for item in match.group(2).split(" - "):
            key, _, raw = item.rpartition(":")
            value = _VALUE.match(raw.strip())
            if key and value:
                metrics[key.strip()] = float(value.group(1))
        steps[int(match.group(1))] = metrics
    return steps


@pytest.fixture
def reaped_children():
    """Make this process the subreaper of everything the test starts; yield a check for leftovers."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    _subreaper(True)

    def leftovers(grace_s: float = 30.0) -> list[psutil.Process]:
        deadline = time.monotonic() + grace_s
        while True:
            alive = [
                p for p in me.children(recursive=True) if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE
            ]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(1.0)

    try:
        yield leftovers
    finally:
        _subreaper(False)
        stray = [p for p in me.children(recursive=True) if p.pid not in before]
        for p in stray:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(stray, timeout=10)


def batch_overrides(batch: int, n: int) -> list[str]:
    """Hydra overrides for steps of ``batch`` prompts x ``n`` samples: one PPO mini-batch per step, and micro batches
    of the whole step (verl needs each micro batch to divide the step's ``batch x n`` samples)."""
    return [
        f"data.train_batch_size={batch}",
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={batch * n}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={batch * n}",
    ]


def masked_step_rows(path: Path, batch: int = 2, steps: int = STEPS) -> Path:
    """A data file (``data.shuffle=false``) whose first ``steps`` batches are Gym's example rows and whose last batch
    has prompts longer than the CPU configs' ``data.max_prompt_length`` (256 tokens; vLLM's context is 1024): every
    rollout of step ``steps + 1`` comes back masked ``prompt_too_long``, the steps before are ordinary."""
    from tests.support.gym_fixtures import example_rows

    rows = example_rows()
    normal = [rows[i % len(rows)] for i in range(batch * steps)]
    long = []
    for i in range(batch):
        row = json.loads(json.dumps(rows[i % len(rows)]))
        message = row["responses_create_params"]["input"][-1]
        message["content"] += " Please answer in full detail." * 10  # ~110 more tokens: ~330 of 256
        long.append(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in normal + long))
    return path


def masked_step_overrides(tmp_path: Path) -> tuple[str, ...]:
    """Overrides for :data:`STEPS` ordinary steps and then one whose every rollout is masked (:func:`masked_step_rows`)."""
    rows = masked_step_rows(tmp_path / "rows.jsonl")
    return (f"data.train_files=[{rows}]", f"data.val_files=[{rows}]", f"trainer.total_training_steps={STEPS + 1}")


def _run_recipe(
    tmp_path: Path, *overrides: str, config_name: str = "nemo_gym_cpu", watch: Any = None
) -> tuple[str, float]:
    """``python -m recipe.nemo_gym.main --config-name <config_name>`` with ``overrides``; (log text, wall seconds).
    ``watch(pid, log_path)``: a thread to start beside the run (e.g. ``tests.support.listeners.TreeListeners``);
    stopped when the run ends."""
    log_path = tmp_path / "recipe.log"
    cmd = [
        sys.executable,
        "-m",
        "recipe.nemo_gym.main",
        "--config-name",
        config_name,
        *overrides,
        f"nemo_gym.run_dir={tmp_path / 'gym'}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])
        watcher = watch(proc.pid, log_path) if watch is not None else None
        if watcher is not None:
            watcher.start()
        try:
            status = proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.terminate()  # SIGTERM: the recipe's own cleanup path
            proc.wait(timeout=120)
            pytest.fail(f"recipe did not finish in {TIMEOUT_S:.0f}s; log: {log_path}")
        except BaseException:  # the session interrupted (Ctrl-C, or SIGTERM: tests/support/sigterm.py)
            proc.terminate()  # the recipe stops Gym, Ray and its replicas itself
            proc.wait(timeout=120)
            raise
    wall = time.monotonic() - started
    if watcher is not None:
        watcher.stop()
    text = log_path.read_text(errors="replace")
    assert status == 0, f"exit {status} after {wall:.0f}s\n{text[-6000:]}"
    return text, wall


def test_grpo_steps_then_an_all_masked_step_on_cpu_with_gym_metrics_and_no_orphans(tmp_path, reaped_children):
    run_dir = tmp_path / "gym"
    text, wall = _run_recipe(
        tmp_path,
        LEGACY,
        *masked_step_overrides(tmp_path),
        # A large step, so step 1's update (AdamW's weight decay alone, should every advantage be 0) moves the engine's
        # log-probs well above float32 noise (measured: 1.3e-5 on the probe; the step-1 probe was identical to 15
        # digits across separate runs, so an unsynced engine reads the same value twice).
        f"actor_rollout_ref.actor.optim.lr={LR}",
        # The guard checks every 2nd step here: step 1 checks, step 2 is trusted, the all-masked step 3 is a scheduled
        # check with nothing to measure (so verl's recompute and rollout-correction steps run on it, below).
        "nemo_gym.trusted_logprobs.check_every=2",
    )

    steps = _parse_steps(text)
    assert sorted(steps) == list(range(1, STEPS + 2)), f"steps logged: {sorted(steps)}\n{text[-3000:]}"
    for step, m in steps.items():
        if step > STEPS:
            continue  # the all-masked step, below
        for key in (
            f"gym/{ENV}/reward_mean",
            "gym/all/masked_rate",
            "gym/all/masked_rate/non_contiguous",
            "gym/all/contiguity_rate",
            "gym/timing/generate_sequences_s",
            "onpolicy/rollout_nll_mean",
            "actor/pg_loss",
        ):
            assert key in m and math.isfinite(m[key]), (step, key, sorted(m))
        assert m["gym/all/num_samples"] == 2 * 4  # train_batch_size x rollout.n, every row back
        assert math.isfinite(m["gym/engine/probe_logprob_mean"]), (step, sorted(m))
        # nemo_gym.trusted_logprobs (on in the CPU configs): step 1 recomputes and the guard measures the gap; step 2
        # trains on the rollout's log-probs as the old ones (verl's bypass_mode switched for that step: no recompute,
        # so no gap, no actor/entropy and no rollout_corr/*, as in verl's own bypass).
        if step == 1:
            assert m["onpolicy/trusted"] == 0.0 and m["onpolicy/guard/within"] == 1.0, m
            assert m["onpolicy/num_tokens"] > 0
            assert m["onpolicy/logprob_abs_diff_mean"] < GAP_TOL, (step, m["onpolicy/logprob_abs_diff_mean"])
            for key in ("onpolicy/kl_k3", "rollout_corr/k3_kl", "actor/entropy"):
                assert math.isfinite(m[key]), (key, sorted(m))
        else:
            assert m["onpolicy/trusted"] == 1.0, m
            gone = [k for k in m if k.startswith(("onpolicy/logprob_", "rollout_corr/", "actor/entropy"))]
            assert not gone, gone
    # The engine's log-probability of a fixed prompt, read before each step's rollouts: step 2 sees the weights
    # verl synced after step 1's update (AdamW changes them even with zero advantages), step 1 the initial ones.
    # With no sync the engine keeps its weights and the probe stays put (to float32 noise).
    probes = [steps[s]["gym/engine/probe_logprob_mean"] for s in range(1, STEPS + 1)]
    assert abs(probes[1] - probes[0]) > PROBE_MIN_MOVE, f"rollout engine weights did not change after step 1: {probes}"

    # Every rollout of the last step masked (prompts longer than data.max_prompt_length): verl's step runs to the end.
    # verl's own rollout-correction step raises on a batch without a valid token; the trainer's guard
    # (recipe.nemo_gym.algorithms.rollout_correction) reports its metrics as NaN instead, like onpolicy/*.
    m = steps[STEPS + 1]
    assert m["gym/all/masked_rate"] == 1.0 and m["gym/all/masked_rate/prompt_too_long"] == 1.0
    assert m["onpolicy/num_tokens"] == 0 and m["onpolicy/trusted"] == 0.0 and m["onpolicy/guard/num_tokens"] == 0
    assert "log-prob guard, step 3: no trained token of a fresh sample to measure" in text
    for key in ("onpolicy/logprob_abs_diff_mean", "onpolicy/kl_k3", "rollout_corr/kl", "rollout_corr/k3_kl"):
        assert key in m and math.isnan(m[key]), (key, sorted(m))
    print(
        f"engine probe logprob per step: {probes}; recipe: {wall:.0f}s wall; per step "
        + ", ".join(
            f"{s}: gen {m['timing_s/gen']:.1f}s step {m['timing_s/step']:.1f}s "
            f"gap {m.get('onpolicy/logprob_abs_diff_mean', math.nan):.1e} trusted {m['onpolicy/trusted']:.0f}"
            for s, m in sorted(steps.items())
            if s <= STEPS
        )
        + f"; all-masked step: actor/pg_loss {m.get('actor/pg_loss')}"
    )

    assert not (run_dir / "gym.pid").exists()  # the manager stopped Gym itself
    # nemo_gym.ray_head: early (the default): Gym joined the Ray head the task runner started; it is stopped too
    assert "Connecting to Ray cluster at specified address: 127.0.0.1:" in (run_dir / "gym.log").read_text()
    assert not (run_dir / "gym_ray.pid").exists()
    # nemo_gym.warm_launcher (the default): the launch ran in the warm launcher started next to that head
    warm_logs = "".join(p.read_text() for p in (run_dir).glob("gym_warm-*.log"))
    assert "warm Gym launcher: launch received" in warm_logs, warm_logs[-2000:]
    assert not (run_dir / "gym_warm.pid").exists()
    left = reaped_children()
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"


def test_driver_sweeps_a_gym_left_behind_by_a_killed_task_runner(tmp_path):
    """If the TaskRunner dies without stopping Gym, the driver's sweep stops Gym's session from the pid file."""
    from nemo_gym_adapter.gym.servers import PID_FILE
    from recipe.nemo_gym.main import sweep_gym

    # A stand-in for Gym's launcher: a session leader with a child (Ray helpers keep the session id).
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(600)']); time.sleep(600)",
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not psutil.Process(leader.pid).children() and time.monotonic() < deadline:
            time.sleep(0.1)
        (child,) = psutil.Process(leader.pid).children()
        (tmp_path / PID_FILE).write_text(json.dumps({"sessions": [leader.pid], "pids": [leader.pid]}))
        stopped = sweep_gym(tmp_path)
        assert set(stopped) == {leader.pid, child.pid}
        assert leader.wait(timeout=10) is not None
        assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
        assert not (tmp_path / PID_FILE).exists()
        assert sweep_gym(tmp_path) == []  # nothing recorded: nothing touched
    finally:
        if leader.poll() is None:
            leader.kill()
