"""The OmegaConf resolvers the shipped hydra configs use (:func:`register_resolvers`; registered by
``recipe.nemo_gym.main`` before hydra composes the config).

``${ngv_gym_example:<resources server>}`` → that Gym environment's bundled ``data/example.jsonl`` (resolved in the
installed Gym, never committed here), ``${ngv_configs:<path>}`` → a file under the checkout's ``configs/``, ``${ngv_gym_servers:}`` → the checkout's
``gym_servers/`` (our own Gym servers' root, for ``NEMO_GYM_EXTRA_ROOTS``) and
``${ngv_tiny_model:<family>}`` → the deterministic tiny model (built on first use),
``${ngv_demo_model:<name>}`` → a real pretrained model (``smollm2``: SmolLM2-135M-Instruct; ``qwen2.5-coder-0.5b``: the
Qwen2.5-Coder-0.5B-Instruct tool model; converted on first use, minutes),
``${ngv_cpu_threads:<use_v1>,<trainer_mode>}`` → the CPU threads each computing process of a CPU run gets
(``OMP_NUM_THREADS``) and ``${ngv_manager:<use_v1>}``
→ the rollout manager for verl's trainer (:data:`~recipe.nemo_gym.config.load.MANAGER_CLASS_V1` for the v1 trainer,
:data:`~recipe.nemo_gym.config.load.MANAGER_CLASS` for the legacy one), so ``trainer.use_v1`` alone switches paths.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nemo_gym_adapter.errors import AdapterConfigError
from recipe.nemo_gym.config.load import MANAGER_CLASS, MANAGER_CLASS_V1


def gym_example_path(env: str, gym_venv: str | None = None) -> str:
    """``<Gym install>/resources_servers/<env>/data/example.jsonl`` (raises ``AdapterConfigError`` if absent)."""
    from nemo_gym_adapter.gym.launch import gym_package_root
    from nemo_gym_adapter.runtime import paths

    root = gym_package_root(Path(gym_venv) if gym_venv else paths.gym_venv())
    path = root / "resources_servers" / env / "data" / "example.jsonl"
    if not path.is_file():
        known = sorted(p.parent.parent.name for p in (root / "resources_servers").glob("*/data/example.jsonl"))
        raise AdapterConfigError(f"${{ngv_gym_example:{env}}}: Gym has no {path}; environments with examples: {known}")
    return str(path)


def configs_path(relative: str) -> str:
    """A file shipped in the checkout's ``configs/`` directory, as an absolute path (hydra keeps the user's cwd)."""
    from nemo_gym_adapter.runtime import paths

    path = paths.REPO_ROOT / "configs" / relative
    if not path.exists():
        raise AdapterConfigError(f"${{ngv_configs:{relative}}}: {path} does not exist")
    return str(path)


def gym_servers_path() -> str:
    """The checkout's ``gym_servers/`` directory (Gym servers of our own, found by Gym through
    ``NEMO_GYM_EXTRA_ROOTS``: ``nemo_gym.env: {NEMO_GYM_EXTRA_ROOTS: ${ngv_gym_servers:}}``)."""
    from nemo_gym_adapter.runtime import paths

    return str(paths.REPO_ROOT / "gym_servers")


def _tiny_model(family: str) -> str:
    from nemo_gym_adapter.demo_models import build_tiny_model

    return str(build_tiny_model(family))


def demo_model(name: str) -> str:
    """A real pretrained demo model's directory, converted on first use (``${ngv_demo_model:smollm2}``,
    ``${ngv_demo_model:qwen2.5-coder-0.5b}``: the manifests of ``nemo_gym_adapter.demo_models.manifests``)."""
    from nemo_gym_adapter.demo_models import converter
    from nemo_gym_adapter.demo_models.manifests import MANIFESTS

    if name not in MANIFESTS:
        raise AdapterConfigError(f"${{ngv_demo_model:{name}}}: unknown demo model; known: {sorted(MANIFESTS)}")
    return str(converter.build_demo_model(name))


def cpu_threads(use_v1: Any = True, trainer_mode: Any = "sync") -> str:
    """``OMP_NUM_THREADS`` for a CPU run's Ray workers: the node's physical cores, halved in verl's async modes.

    Ray sets ``OMP_NUM_THREADS=1`` in every worker whose task or actor holds no whole CPU
    (``ray._private.utils.set_omp_num_threads_if_unset``): verl's FSDP actor and our vLLM replica (``num_cpus=0``)
    then computed on one core of two (measured: the actor's update and vLLM's generation each ran on one thread).
    In sync mode (and on the legacy trainer) generation and the update take turns, so each gets every core; in
    ``colocate_async``/``separate_async`` they run at once and share them."""
    import psutil

    cores = psutil.cpu_count(logical=False) or psutil.cpu_count() or 1
    sync = _legacy_trainer(use_v1) or str(trainer_mode) == "sync"
    return str(cores if sync else max(1, cores // 2))


def _legacy_trainer(use_v1: Any) -> bool:
    """``trainer.use_v1`` as a resolver receives it (a bool, or its text inside an interpolation) says legacy."""
    return use_v1 is False or str(use_v1).lower() == "false"


def manager_class(use_v1: Any) -> str:
    """The rollout manager for ``trainer.use_v1`` (``${ngv_manager:${trainer.use_v1}}``)."""
    return MANAGER_CLASS if _legacy_trainer(use_v1) else MANAGER_CLASS_V1


def register_resolvers() -> None:
    """Register ``ngv_gym_example``, ``ngv_configs``, ``ngv_gym_servers``, ``ngv_tiny_model``, ``ngv_demo_model``,
    ``ngv_cpu_threads`` and ``ngv_manager`` with OmegaConf (idempotent)."""
    from omegaconf import OmegaConf

    for name, fn in (
        ("ngv_manager", manager_class),
        ("ngv_gym_example", gym_example_path),
        ("ngv_configs", configs_path),
        ("ngv_gym_servers", gym_servers_path),
        ("ngv_tiny_model", _tiny_model),
        ("ngv_demo_model", demo_model),
        ("ngv_cpu_threads", cpu_threads),
    ):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn, use_cache=True)
