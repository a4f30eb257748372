"""The run's console, quieted at the source: settings every Ray worker of the run gets (and the driver), so that
what nobody can act on is never printed; ``nemo_gym_adapter.console.notices`` leaves out, in the driver, only what
no setting turns off.

:func:`quiet_env` puts defaults in the Ray runtime env (a value the user set, there or in the environment, wins):

- ``TQ_NUM_THREADS``: TransferQueue sizes torch's thread pool to it (default 8) on every put and get, and warns
  each time 8 exceeds the node's physical cores (200+ identical warnings in a 30-step run on 2 cores); the node's
  physical cores, at most 8, is what it would fall back to anyway;
- ``VERL_LOGGING_LEVEL=WARN``: verl's start-up progress at INFO (``Platform override from VERL_PLATFORM`` in every
  process, ``worker group kwargs``, ``all initialize finished, ready to fit``...) and an ``update_weights done``
  line every step; the start-up line of :mod:`nemo_gym_adapter.console.startup` says where the start-up went. verl's
  warnings and errors are kept; ``VERL_LOGGING_LEVEL=INFO`` brings the rest back;
- ``TQ_LOGGING_LEVEL=WARNING``: TransferQueue's actors log request statistics at INFO every 5 minutes (a dozen
  lines each time, per actor);
- ``PYTHONWARNINGS``: :data:`WARNING_NOTICES` appended (and the same filters in this process: :func:`quiet_driver`);
- :data:`~nemo_gym_adapter.console.startup.LAUNCH_T0_ENV`: this process's start, the first mark of the start-up line.

In verl's TaskRunner, :func:`quiet_validation_dumps` sends verl's pretty-printed validation metrics to DEBUG.
"""

from __future__ import annotations

import builtins
import logging
import os
import re
import warnings

from omegaconf import DictConfig, OmegaConf, open_dict

from nemo_gym_adapter.console.startup import LAUNCH_T0_ENV, launch_t0

ENV_KEY = "ray_kwargs.ray_init.runtime_env.env_vars"

# Python warnings every run prints and nobody can act on, left out at their source (``PYTHONWARNINGS`` in every
# Ray worker, ``warnings.filterwarnings`` here); the form is Python's -W option's: the message matched at its start.
WARNING_NOTICES: tuple[str, ...] = (
    # verl, at import, in every process: each optional training engine not installed (torchtitan, veomni, automodel,
    # mindspeed, megatron) -- ~10 lines per process that nobody using FSDP can act on
    "ignore::UserWarning:verl.workers.engine",
    # verl, three times per run: GRPO-like estimators need no critic (the configs choose them)
    "ignore:Disabled critic as algorithm.adv_estimator != gae:UserWarning",
    # torchdata's StatefulDataLoader calls a torch API that torch deprecated
    "ignore:'set_vital' is deprecated:UserWarning",
    # vLLM's Triton dispatcher touches a deprecated torch alias while it looks for kernels
    "ignore:`torch.distributed.reduce_op` is deprecated:FutureWarning",
)
VERL_ENGINE_NOTICES = WARNING_NOTICES[0]
VERL_LOGGING_LEVEL = "WARN"
TQ_LOGGING_LEVEL = "WARNING"

logger = logging.getLogger(__name__)


def quiet_env(cfg: DictConfig) -> dict[str, str]:
    """The defaults of the module docstring in ``cfg``'s Ray runtime env; returns what was added. Idempotent."""
    import psutil

    env_vars = OmegaConf.select(cfg, ENV_KEY, default=None)
    current = OmegaConf.to_container(env_vars, resolve=True) if env_vars is not None else {}
    if not isinstance(current, dict):
        return {}  # not a mapping: verl's own config check names it
    extra: dict[str, str] = {LAUNCH_T0_ENV: launch_t0()}
    if "TQ_NUM_THREADS" not in current and "TQ_NUM_THREADS" not in os.environ:
        extra["TQ_NUM_THREADS"] = str(max(1, min(8, psutil.cpu_count(logical=False) or 1)))
    for name, value in (("VERL_LOGGING_LEVEL", VERL_LOGGING_LEVEL), ("TQ_LOGGING_LEVEL", TQ_LOGGING_LEVEL)):
        if name not in current and name not in os.environ:
            extra[name] = value
    filters = [f for f in (current.get("PYTHONWARNINGS") or os.environ.get("PYTHONWARNINGS", "")).split(",") if f]
    missing = [f for f in WARNING_NOTICES if f not in filters]
    if missing:
        extra["PYTHONWARNINGS"] = ",".join([*filters, *missing])
    with open_dict(cfg):
        for name, value in extra.items():
            OmegaConf.update(cfg, f"{ENV_KEY}.{name}", value, force_add=True)
    return extra


def quiet_driver() -> None:
    """:data:`WARNING_NOTICES` as ``warnings`` filters in this process (already started: ``PYTHONWARNINGS`` is read
    at a start)."""
    for spec in WARNING_NOTICES:
        action, message, category, module = (spec.split(":") + [""] * 4)[:4]
        warnings.filterwarnings(
            action,  # type: ignore[arg-type]
            message=re.escape(message),
            category=getattr(builtins, category) if category else Warning,
            module=re.escape(module),  # the module and its submodules
        )


VALIDATION_DUMPS = ("Initial validation metrics", "Final validation metrics")


def quiet_validation_dumps() -> bool:
    """verl's v1 trainer ``pprint``s its validation metrics before training and after the last step as one Python
    dict (~120 console lines for one environment); the same metrics are in that step's metrics line (verl's console
    logger: step 0, the last step). In this process (the TaskRunner) they go to this module's logger at DEBUG; any
    other ``pprint`` of that module prints as before. True when installed (idempotent)."""
    import verl.trainer.ppo.v1.trainer_base as trainer_base

    real = getattr(trainer_base, "pprint", None)
    if real is None or getattr(real, "ngv_quiet", False):
        return False

    def pprint(obj: object, *args: object, **kwargs: object) -> None:
        if isinstance(obj, str) and obj.startswith(VALIDATION_DUMPS):
            logger.debug("%s", obj)
            return
        real(obj, *args, **kwargs)

    pprint.ngv_quiet = True  # type: ignore[attr-defined]
    trainer_base.pprint = pprint
    return True
