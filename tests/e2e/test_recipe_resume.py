"""Checkpoint and resume, end to end (hydra, CPU, verl's v1 trainer): a run SIGKILLed mid-step and relaunched with
``trainer.resume_mode=auto`` ends at its target step as if it had never stopped, and nothing of either launch is left.

The README demo (toy environment, one-letter replies) on 8 rows, batches of 4 (two batches an epoch), rows drawn by
the environment-weighted sampler (``nemo_gym.env_weights``), a checkpoint at step 3 (``trainer.save_freq=3``):

- launch 1 trains steps 1-4 and is SIGKILLed -- the driver, as the OOM killer would -- once step 4 is logged and
  dumped, i.e. during step 5; its steps 4 and 5 were never checkpointed;
- launch 2 (same command, ``resume_mode=auto``, a new Gym) resumes from ``global_step_3`` and trains steps 4 and 5.

Asserted: the step counter (launch 2 logs steps 4 and 5 only, in epochs 1 and 2, and checkpoints step 5); the data
order (every step of both launches trained exactly the rows a fresh sampler yields for that step -- read back from
verl's ``trainer.rollout_data_dir`` dumps; a sampler without a state of its own would have replayed epoch 0's rows,
and the test checks it could tell); the weights (the rollout engine's log-probability of a fixed prompt before step
4's rollouts, ``gym/engine/probe_logprob_mean``, is the same in both launches: launch 2's engine serves the
checkpoint's weights, which are launch 1's after step 3); and no process of either launch alive once launch 2 ended
(launch 1's Gym and Gym's Ray head were stopped by its watchdog: ``nemo_gym_adapter.runtime.reaper``).

Measured (2 cores, shared): 218 s at load average 3, 219 s at 6-7 (launch 1 killed ~100 s after its start). With
the sampler of before ``EnvWeightedSampler.state_dict`` the test fails on launch 2's step 4 (epoch 0's rows again).

The legacy trainer (``trainer.use_v1=false``) resumes through the same pieces (verl's ``data.pt``, the same sampler,
verl's ``_load_checkpoint`` and weight sync); its variant passes too (262 s at load average 2).

Both variants are in the slow tier (``pytest --slow``, docs/CI.md): two launches each cost ~200 s of CI's 45-minute
budget. In the default tier the pieces are checked one by one: the sampler's state across a relaunch
(``tests/unit/data/test_env_sampling.py``), a checkpoint the way verl writes it (``tests/unit/recipe/trainer/test_storage.py``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest

from nemo_gym_adapter.data.env_sampling import EnvWeightedSampler
from tests.e2e import test_recipe_cpu_smoke as smoke
from tests.e2e.test_recipe_cpu_smoke import TIMEOUT_S, _parse_steps

reaped_children = smoke.reaped_children  # this process reaps what either launch leaves
pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
ENV = "toy_choice_simple_agent"
ROWS, BATCH, N = 8, 4, 4  # two batches an epoch; rollouts per row
SAVE_AT, KILL_AFTER, TOTAL = 3, 4, 5  # checkpoint at 3; SIGKILL once step 4 is logged and dumped; the target
SEED = 0
PROBE = "gym/engine/probe_logprob_mean"
PROBE_TOL = 1e-6  # same weights, same engine, same prompt: equal up to float32 noise


def _rows(path: Path) -> list[str]:
    """The first :data:`ROWS` rows of the toy environment's data, written to ``path``; their questions."""
    lines = (REPO / "configs" / "gym" / "data" / "toy_choice.jsonl").read_text().splitlines()[:ROWS]
    path.write_text("\n".join(lines) + "\n")
    return [json.loads(line)["responses_create_params"]["input"][0]["content"] for line in lines]


def _expected_rows(steps: int) -> dict[int, list[int]]:
    """Step -> the rows a fresh sampler yields for it (the trainer's: one environment, these rows, this seed)."""
    sampler = EnvWeightedSampler([ENV], np.zeros(ROWS, dtype=int), {ENV: 1.0}, BATCH, SEED)
    order = [row for _ in range((steps * BATCH) // ROWS + 1) for row in sampler]
    return {s: order[(s - 1) * BATCH : s * BATCH] for s in range(1, steps + 1)}


def _trained_rows(dump_dir: Path, questions: list[str]) -> dict[int, Counter]:
    """Step -> Counter of the rows its samples came from, read back from verl's rollout dump (decoded prompts)."""
    out = {}
    for path in sorted(dump_dir.glob("*.jsonl")):
        rows: Counter = Counter()
        for line in path.read_text().splitlines():
            prompt = json.loads(line)["input"]
            (row,) = [i for i, q in enumerate(questions) if q in prompt]
            rows[row] += 1
        out[int(path.stem)] = rows
    return out


class Launch:
    """One launch of the recipe (``python -m recipe.nemo_gym.main --config-name nemo_gym_cpu_toy``), its log in
    ``<tmp>/launch<n>.log``, its rollout dumps in ``<tmp>/rollouts<n>``; :meth:`run` waits for its end or SIGKILLs the
    driver -- as the OOM killer would -- once a given step is logged and its dump written."""

    def __init__(self, tmp_path: Path, n: int, overrides: list[str]) -> None:
        self.log_path = tmp_path / f"launch{n}.log"
        self.dumps = tmp_path / f"rollouts{n}"
        run_dirs = [f"nemo_gym.run_dir={tmp_path / f'gym{n}'}", f"hydra.run.dir={tmp_path / f'hydra{n}'}"]
        self.cmd = [
            *(sys.executable, "-m", "recipe.nemo_gym.main", "--config-name", "nemo_gym_cpu_toy"),
            *overrides,
            f"trainer.rollout_data_dir={self.dumps}",
            *run_dirs,
        ]
        self.proc: subprocess.Popen | None = None

    def _step_done(self, step: int) -> bool:
        """Step ``step`` is logged and its dump complete (verl writes it on a thread of its own)."""
        dump = self.dumps / f"{step}.jsonl"
        if step not in _parse_steps(self.text()) or not dump.exists():
            return False
        return len(dump.read_text().splitlines()) == BATCH * N

    def run(self, kill_after_step: int | None = None) -> tuple[int, str, float]:
        """(exit status, log text, seconds)."""
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
            try:
                while self.proc.poll() is None:
                    assert time.monotonic() - started < TIMEOUT_S, f"{self.log_path.name}: not done in {TIMEOUT_S}s"
                    if kill_after_step is not None and self._step_done(kill_after_step):
                        # At once: the next step has begun. A toy step on the legacy trainer with trusted log-probs
                        # takes ~0.7 s (no recompute pass), so the 0.5 s wait this had let launch 1 finish on its own.
                        self.proc.send_signal(signal.SIGKILL)
                    time.sleep(0.05)
            finally:
                if self.proc.poll() is None:
                    self.proc.kill()
                self.proc.wait(timeout=60)
        return self.proc.returncode, self.text(), time.monotonic() - started

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextlib.contextmanager
def reaping_orphans(launches: list[Launch]) -> Iterator[None]:
    """Reap, every half second, the zombies re-parented to this process (the test is their subreaper), as init would:
    the killed launch's raylet left unreaped stays a zombie whose pid the trainer's Ray workers poll, so they would
    take it for alive and never exit. The launches' own drivers are left for ``Popen.wait``."""
    done = threading.Event()

    def reap() -> None:
        while not done.wait(0.5):
            ours = {launch.proc.pid for launch in launches if launch.proc is not None}
            for child in psutil.Process().children():
                try:
                    if child.pid not in ours and child.status() == psutil.STATUS_ZOMBIE:
                        os.waitpid(child.pid, os.WNOHANG)
                except (psutil.Error, ChildProcessError):
                    continue

    thread = threading.Thread(target=reap, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


# Both trainers are in the slow tier (docs/CI.md): two launches each (~100 s apiece), and the default tier's budget.
@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["v1", "legacy"])
def test_a_run_killed_mid_step_resumes_at_its_checkpoint_with_the_same_rows_and_weights(
    tmp_path, reaped_children, trainer
):
    questions = _rows(tmp_path / "rows.jsonl")
    ckpt = tmp_path / "ckpt"
    common = [
        "trainer.use_v1=true" if trainer == "v1" else "trainer.use_v1=false",
        f"data.train_files={tmp_path / 'rows.jsonl'}",
        f"data.val_files={tmp_path / 'rows.jsonl'}",
        f"data.seed={SEED}",
        f"nemo_gym.env_weights={{{ENV}: 1}}",
        *smoke.batch_overrides(BATCH, N),
        f"trainer.total_training_steps={TOTAL}",
        f"trainer.save_freq={SAVE_AT}",
        "trainer.resume_mode=auto",
        f"trainer.default_local_dir={ckpt}",
        "trainer.logger=[console]",
    ]

    launches = [Launch(tmp_path, n, common) for n in (1, 2)]
    with reaping_orphans(launches):
        status1, text1, killed_s = launches[0].run(kill_after_step=KILL_AFTER)
        assert status1 == -signal.SIGKILL, f"launch 1 ended by itself ({status1})\n{text1[-4000:]}"
        steps1 = _parse_steps(text1)
        assert sorted(steps1) == list(range(1, KILL_AFTER + 1)), sorted(steps1)
        assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(SAVE_AT)
        assert sorted(p.name for p in ckpt.glob("global_step_*")) == [f"global_step_{SAVE_AT}"]

        status2, text2, wall2 = launches[1].run()
        assert status2 == 0, f"launch 2: exit {status2}\n{text2[-6000:]}"
        left = reaped_children(60.0)  # the trainers' own Ray agents may take a minute after a driver's SIGKILL
    assert f"global_step_{SAVE_AT}" in text2 and "Resuming from" in text2, text2[-4000:]
    steps2 = _parse_steps(text2)
    assert sorted(steps2) == list(range(SAVE_AT + 1, TOTAL + 1)), sorted(steps2)  # the step counter goes on
    assert [steps2[s]["training/epoch"] for s in sorted(steps2)] == [(s - 1) * BATCH // ROWS for s in sorted(steps2)]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(TOTAL)

    # Data order: each step of both launches trained exactly the rows a fresh sampler gives that step.
    expected = _expected_rows(TOTAL)
    # A sampler without a state of its own would give step 4 epoch 0's second batch again: make sure that differs.
    assert sorted(expected[SAVE_AT + 1]) != sorted(expected[2]), "this seed cannot tell the epochs apart"
    for n, want in ((1, range(1, KILL_AFTER + 1)), (2, range(SAVE_AT + 1, TOTAL + 1))):
        trained = _trained_rows(launches[n - 1].dumps, questions)
        assert set(want) <= set(trained), (n, sorted(trained))
        for s in want:
            assert trained[s] == Counter({row: N for row in expected[s]}), (n, s, trained[s], expected[s])

    # Weights: step 4's engine probe (read before its rollouts) is the same in both launches.
    probe1, probe2 = steps1[SAVE_AT + 1][PROBE], steps2[SAVE_AT + 1][PROBE]
    assert abs(probe2 - probe1) < PROBE_TOL, (probe1, probe2)
    assert abs(probe1 - steps1[1][PROBE]) > 100 * PROBE_TOL  # training moved it: the check can tell weights apart

    # Nothing of either launch: launch 1's Gym went with its watchdog (its records swept), launch 2 stopped its own.
    assert not list((tmp_path / "gym1").rglob("*.pid")), list((tmp_path / "gym1").rglob("*.pid"))
    assert "gone; stopped" in (tmp_path / "gym1" / "reaper.log").read_text()
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"
    print(
        f"resume ({trainer}): launch 1 killed {killed_s:.0f}s after its start (in step {KILL_AFTER + 1}); launch 2 "
        f"{wall2:.0f}s; probe at step {SAVE_AT + 1}: {probe1!r} vs {probe2!r}"
    )
