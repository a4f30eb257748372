"""Imported at start-up by every interpreter of a guarded Gym's process tree (``PYTHONPATH`` names this directory):
runs :func:`nemo_gym_adapter.access.gym_guard.boot`, loaded by path (the trainer's package is not importable in Gym's
venv). Does nothing without ``NGV_GYM_ACCESS_KEY``. A failure to install the guard ends the process: a Gym server
that would answer everyone must not start as if it were guarded."""

import importlib.util
import os
import sys
from pathlib import Path


def _boot() -> None:
    if not os.environ.get("NGV_GYM_ACCESS_KEY"):
        return
    path = Path(__file__).resolve().parent.parent / "gym_guard.py"
    spec = importlib.util.spec_from_file_location("_ngv_gym_guard", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["_ngv_gym_guard"] = module
    spec.loader.exec_module(module)
    module.boot()


try:
    _boot()
except Exception as e:  # noqa: BLE001  (sitecustomize errors are otherwise printed and ignored by site)
    sys.stderr.write(f"nemo-gym-verl: the Gym access guard could not be installed in pid {os.getpid()}: {e!r}\n")
    sys.stderr.flush()
    os._exit(78)
