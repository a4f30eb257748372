"""Gym's servers that the trainer starts early, before verl builds its workers and vLLM: Gym's Ray head
(:mod:`~nemo_gym_adapter.gym.ray_head`, ``nemo_gym.ray_head: early``) and a warm Gym launcher next to it
(:mod:`~nemo_gym_adapter.gym.warm`, ``nemo_gym.warm_launcher``).

Both recipe task runners wrap their start-up in :func:`early_gym_servers`; the rollout manager created later in the
same process claims each server from its slot (``ray_head.claim_early_head``, ``warm.claim_early_warm``) and stops it
at shutdown. This module is the only one that knows about both, so neither of the two imports the other's start-up.
Before either starts, a watchdog (:mod:`nemo_gym_adapter.runtime.reaper`) is set on the run dir their pid records go to.
It takes the ``nemo_gym:`` section already validated (the task runners pass ``load_config(config).gym``): the library
never reads the recipe's whole config.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from nemo_gym_adapter.config import NemoGymConfig
from nemo_gym_adapter.gym import ray_head, warm
from nemo_gym_adapter.gym.ray_head import GymRayHead
from nemo_gym_adapter.runtime import reaper


@contextlib.contextmanager
def early_gym_servers(gym: NemoGymConfig) -> Iterator[GymRayHead | None]:
    """Start Gym's Ray head now, if the run's ``nemo_gym:`` section wants one, for the rollout manager created later
    in this process to claim (``ray_head.claim_early_head``), and, with ``nemo_gym.warm_launcher``, a warm Gym
    launcher next to it (``warm.claim_early_warm``). On exit what nobody claimed (start-up failed before the manager
    existed) is stopped; what was claimed is the manager's to stop.

    First, for a Gym we start with a run dir: a watchdog that stops whatever the run dir's pid records name once
    this process is gone, however it died (``reaper.start_watchdog``)."""
    head = launcher = None
    if gym.head_url is None and gym.run_dir:  # before anything is recorded there (reaper module docstring)
        reaper.start_watchdog(Path(gym.run_dir))
    if ray_head.wants_head(gym):
        head = ray_head.start_head_for(gym)
        ray_head.EARLY.park(head)
    try:
        if warm.wants_warm(gym):  # after the head: its environment holds the head's token
            launcher = warm.start_warm_for(gym, head)  # None (cold launch later) if it cannot start
            warm.EARLY.park(launcher)
        yield head
    finally:
        warm.EARLY.drop(launcher)
        ray_head.EARLY.drop(head)
