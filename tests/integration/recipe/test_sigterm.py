"""SIGTERM to the recipe's driver: the clean shutdown runs to its end and the process ends with SIGTERM's own status
(143; Popen: -15), also when that shutdown outlasts the 3 s abort alarm Ray's signal handler arms (``main.
_reinstall_after_ray_init``; without it this test ends with SIGABRT, 134, mid-cleanup: checked).

The driver is ``recipe.nemo_gym.main.run`` on the shipped CPU config with a real ``ray.init`` (what installs Ray's
handlers); only verl's ``run_ppo`` (a task that blocks, the driver waiting in ``ray.get`` as it does in training)
and the Gym sweep (slowed to 4 s) are stand-ins. The whole recipe under SIGTERM: ``docs/LONG_RUNS.md``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.e2e import test_recipe_cpu_smoke as e2e

reaped_children = e2e.reaped_children  # this process reaps what the driver leaves
pytestmark = pytest.mark.integration

DRIVER = textwrap.dedent(
    """
    import sys, time
    from hydra import compose, initialize_config_dir
    from recipe.nemo_gym import main

    def run_ppo(cfg, task_runner_class=None):  # verl's: ray.init, then the driver waits on the task runner
        import ray
        ray.init(address="local", num_cpus=1, include_dashboard=False)
        block = ray.remote(lambda: time.sleep(600))
        print("TRAINING", flush=True)
        ray.get(block.remote())

    sweep = main.sweep_gym
    def slow_sweep(run_dir):  # longer than the abort alarm (3 s) Ray's handler arms
        time.sleep(4)
        print("SWEPT", flush=True)
        return sweep(run_dir)

    # verl (and with it Ray's C++ config, which reads RAY_AUTH_* once) is imported where the recipe imports it: after
    # the run's environment is set. Imported before, Ray's client keeps auth off while the GCS it starts requires the
    # run's token, and ray.init fails -- unless an earlier test left RAY_AUTH_* in this process's environment.
    apply_runtime_env = main._apply_runtime_env
    def apply_then_stand_in(cfg):
        apply_runtime_env(cfg)
        import verl.trainer.main_ppo as main_ppo
        main_ppo.run_ppo = run_ppo
    main._apply_runtime_env, main.sweep_gym = apply_then_stand_in, slow_sweep
    with initialize_config_dir(config_dir=main.CONFIG_DIR, version_base=None):
        cfg = compose("nemo_gym_cpu", overrides=main.with_verl_searchpath([f"nemo_gym.run_dir={sys.argv[1]}"]))
    sys.exit(main.run(cfg))
    """
)


def test_sigterm_runs_the_whole_shutdown_and_exits_143(tmp_path: Path, reaped_children):
    log = tmp_path / "driver.log"
    with open(log, "wb") as out:
        driver = subprocess.Popen(
            [sys.executable, "-c", DRIVER, str(tmp_path / "gym")],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[3],
        )
        try:
            deadline = time.monotonic() + 300
            while "TRAINING" not in log.read_text() and time.monotonic() < deadline and driver.poll() is None:
                time.sleep(0.2)
            assert "TRAINING" in log.read_text(), log.read_text()[-3000:]
            driver.send_signal(signal.SIGTERM)
            status = driver.wait(timeout=120)
        finally:
            if driver.poll() is None:
                driver.kill()
    text = log.read_text()
    assert status == -signal.SIGTERM, f"exit status {status}\n{text[-3000:]}"
    assert "SWEPT" in text  # the cleanup ran to its end
    assert "SIGTERM received" not in text  # absl's handler (and its abort alarm) never ran
    left = reaped_children()
    assert not left, f"processes left behind: {[(p.pid, ' '.join(p.cmdline()[:3])) for p in left]}"
