"""The console quieted at the source (``recipe.nemo_gym.trainer.console``): the settings reach every Ray worker
through the runtime env, a value the user set wins, and the Python warning filters drop the known notices and
nothing else -- in a real interpreter reading ``PYTHONWARNINGS``, and in this process."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

from omegaconf import OmegaConf

from nemo_gym_adapter.console.startup import LAUNCH_T0_ENV
from recipe.nemo_gym.trainer import console


def _cfg(env_vars: dict[str, str]):
    return OmegaConf.create({"ray_kwargs": {"ray_init": {"runtime_env": {"env_vars": env_vars}}}})


def _env(cfg) -> dict[str, str]:
    return OmegaConf.to_container(cfg.ray_kwargs.ray_init.runtime_env.env_vars)


def test_the_defaults_reach_every_ray_worker_and_a_users_value_wins(monkeypatch):
    for name in ("TQ_NUM_THREADS", "PYTHONWARNINGS", "VERL_LOGGING_LEVEL", "TQ_LOGGING_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    cfg = _cfg({"A": "1"})
    console.quiet_env(cfg)
    env = _env(cfg)
    assert 1 <= int(env["TQ_NUM_THREADS"]) <= 8 and env["A"] == "1"
    assert env["PYTHONWARNINGS"] == ",".join(console.WARNING_NOTICES)
    assert (
        env["VERL_LOGGING_LEVEL"] == "WARN" and env["TQ_LOGGING_LEVEL"] == "WARNING" and float(env[LAUNCH_T0_ENV]) > 0
    )
    mine = {"TQ_NUM_THREADS": "3", "PYTHONWARNINGS": "error::DeprecationWarning", "VERL_LOGGING_LEVEL": "INFO"}
    cfg = _cfg(dict(mine))
    console.quiet_env(cfg)
    console.quiet_env(cfg)  # idempotent
    env = _env(cfg)
    assert env["TQ_NUM_THREADS"] == "3" and env["VERL_LOGGING_LEVEL"] == "INFO"
    assert env["PYTHONWARNINGS"] == ",".join(["error::DeprecationWarning", *console.WARNING_NOTICES])
    monkeypatch.setenv("VERL_LOGGING_LEVEL", "DEBUG")  # set in the launching shell: not overridden either
    cfg = _cfg({})
    console.quiet_env(cfg)
    assert "VERL_LOGGING_LEVEL" not in _env(cfg)


KNOWN_WARNINGS = [
    ("Disabled critic as algorithm.adv_estimator != gae. If it is not intended, please set critic.enable=True", "U"),
    ("'set_vital' is deprecated, please do not call", "U"),
    ("`torch.distributed.reduce_op` is deprecated, please use `torch.distributed.ReduceOp` instead", "F"),
]
REAL_WARNINGS = [
    ("Disabled critic as algorithm.adv_estimator != gae.", "F"),  # the same text, another category: shown
    ("a real problem: the critic is disabled", "U"),
    ("`torch.distributed.reduce_op` is deprecated", "D"),
]
_CATEGORY = {"U": UserWarning, "F": FutureWarning, "D": DeprecationWarning}


def test_a_worker_reading_pythonwarnings_drops_the_known_ones_and_shows_a_real_warning():
    code = (
        "import warnings\n"
        f"for text, cat in {KNOWN_WARNINGS + REAL_WARNINGS!r}:\n"
        "    warnings.warn(text, {'U': UserWarning, 'F': FutureWarning, 'D': DeprecationWarning}[cat])\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": ",".join(["always", *console.WARNING_NOTICES])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Invalid -W option" not in out.stderr, out.stderr
    shown = [line for line in out.stderr.splitlines() if "Warning: " in line]
    assert len(shown) == len(REAL_WARNINGS), out.stderr
    for text, _ in KNOWN_WARNINGS:
        assert not any(text in line for line in shown), text
    control = subprocess.run(  # without the filters every one is shown: the test can fail
        [sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert sum("Warning: " in line for line in control.stderr.splitlines()) == len(KNOWN_WARNINGS + REAL_WARNINGS)


def test_the_driver_gets_the_same_filters():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        console.quiet_driver()
        for text, cat in KNOWN_WARNINGS + REAL_WARNINGS:
            warnings.warn(text, _CATEGORY[cat], stacklevel=1)
    assert [str(w.message) for w in caught] == [text for text, _ in REAL_WARNINGS]


def test_verls_validation_dumps_go_to_debug_and_any_other_pprint_of_its_trainer_still_prints(monkeypatch, capsys):
    import verl.trainer.ppo.v1.trainer_base as trainer_base

    monkeypatch.setattr(trainer_base, "pprint", trainer_base.pprint)  # put back after the test
    trainer_base.pprint("Initial validation metrics: {'val-core/x': 0.5}")  # the control: verl prints it
    assert "Initial validation metrics" in capsys.readouterr().out
    assert console.quiet_validation_dumps() and not console.quiet_validation_dumps()  # idempotent
    trainer_base.pprint("Initial validation metrics: {'val-core/x': 0.5}")
    trainer_base.pprint("Final validation metrics: None")
    trainer_base.pprint({"something": "else"})
    assert capsys.readouterr().out == "{'something': 'else'}\n"
