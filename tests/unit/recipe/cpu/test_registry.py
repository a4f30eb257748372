"""The CPU replica's registration (``recipe.nemo_gym.cpu.registry``): loaded in every process of a CPU run through
``VERL_USE_EXTERNAL_MODULES``, it points ``rollout.name=vllm`` at the CPU replica without importing vLLM -- only the
process that asks verl for the class (the TaskRunner) pays for that import. A fresh interpreter, as a Ray worker
starts; the control is the configs' former ``recipe.nemo_gym.cpu.rollout``, which imported vLLM in every process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[4]
CODE = """
import sys
import verl
from verl.workers.rollout.replica import RolloutReplicaRegistry
loader = RolloutReplicaRegistry._registry["vllm"]
print(f"{loader.__module__}.{loader.__qualname__}", "vllm" in sys.modules)
"""


def _import_verl(modules: str) -> list[str]:
    env = {**os.environ, "VERL_USE_EXTERNAL_MODULES": modules, "VERL_PLATFORM": "cpu", "VLLM_TARGET_DEVICE": "cpu"}
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", CODE], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split()[-2:]


def test_every_process_gets_the_cpu_replica_registered_and_none_imports_vllm_for_it():
    cfg = OmegaConf.load(REPO / "configs" / "nemo_gym_cpu.yaml")
    modules = cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES
    assert modules == "recipe.nemo_gym.cpu.platform,recipe.nemo_gym.cpu.registry"
    assert _import_verl(modules) == ["recipe.nemo_gym.cpu.registry.load_cpu_vllm_replica", "False"]
    # the control: loading the replica's module itself registers it too, and imports vLLM in every process
    assert _import_verl("recipe.nemo_gym.cpu.platform,recipe.nemo_gym.cpu.rollout") == [
        "recipe.nemo_gym.cpu.rollout._load_cpu_vllm_replica",
        "True",
    ]
