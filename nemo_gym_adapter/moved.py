"""Old module paths that still import: one table of every module the house moved into a room (issue 34), and the
import finder that serves an old name with the new module.

A user's config names classes by dotted path (``agent_loop_manager_class: recipe.nemo_gym.agent_loop.
NemoGymAgentLoopManager``, a hydra ``_target_``, verl's ``load_class``), and their scripts import our modules; those
paths keep working for a while. :func:`install` (called by ``nemo_gym_adapter/__init__.py`` and
``recipe/nemo_gym/__init__.py``, idempotent) puts a finder in ``sys.meta_path`` right behind the path finder: behind
every real module, so it is only asked for names no file answers to. For an old name of :data:`MOVED` it imports the NEW module and registers that
same object under the old name too (a class is one class whichever path named it; nothing runs twice), warning once
per old name per process::

    FutureWarning: recipe.nemo_gym.agent_loop moved to recipe.nemo_gym.managers.legacy; the old path will be removed

An unknown name is left to the import system (``ModuleNotFoundError`` as ever). Three old modules became packages of
the same name (:data:`BECAME_PACKAGES`); a package's own name cannot be aliased, so there the package is the new home:
``python -m recipe.nemo_gym.reporting`` runs ``reporting/__main__.py``; ``wire`` and ``console`` are library-internal.

Stdlib only: ``nemo_gym_adapter`` is imported by scripts that run in Gym's venv (``scripts/prepare_gym_venvs.py``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# old dotted module -> new dotted module, for every module that moved (issue 34); new names only in our own code
MOVED: dict[str, str] = {
    # recipe/nemo_gym/: the run's config
    "nemo_gym_adapter.recipe_config": "recipe.nemo_gym.config.load",
    "nemo_gym_adapter.recipe_checks": "recipe.nemo_gym.config.checks",
    "nemo_gym_adapter.recipe_sampling": "recipe.nemo_gym.config.sampling",
    "recipe.nemo_gym.resolvers": "recipe.nemo_gym.config.resolvers",
    "recipe.nemo_gym.gym_settings": "recipe.nemo_gym.config.gym_settings",
    # recipe/nemo_gym/: verl's rollout servers
    "recipe.nemo_gym.backends": "recipe.nemo_gym.servers.engines",
    "recipe.nemo_gym.replicas": "recipe.nemo_gym.servers.replicas",
    # recipe/nemo_gym/: algorithms
    "recipe.nemo_gym.advantage": "recipe.nemo_gym.algorithms.masked_grpo",
    "recipe.nemo_gym.masked_estimators": "recipe.nemo_gym.algorithms.masked_estimators",
    "recipe.nemo_gym.gdpo": "recipe.nemo_gym.algorithms.gdpo",
    "recipe.nemo_gym.outcomes": "recipe.nemo_gym.algorithms.outcomes",
    "recipe.nemo_gym.rollout_correction": "recipe.nemo_gym.algorithms.rollout_correction",
    "recipe.nemo_gym.logprob_guard": "recipe.nemo_gym.algorithms.logprob_guard",
    # recipe/nemo_gym/: the rollout managers
    "recipe.nemo_gym.manager_base": "recipe.nemo_gym.managers.base",
    "recipe.nemo_gym.agent_loop": "recipe.nemo_gym.managers.legacy",
    "recipe.nemo_gym.agent_loop_tq": "recipe.nemo_gym.managers.v1",
    "recipe.nemo_gym.tq_records": "recipe.nemo_gym.managers.tq_records",
    # recipe/nemo_gym/: verl's trainers wired
    "recipe.nemo_gym.task_runner": "recipe.nemo_gym.trainer.task_runner",
    "recipe.nemo_gym.task_runner_v1": "recipe.nemo_gym.trainer.task_runner_v1",
    "recipe.nemo_gym.async_modes": "recipe.nemo_gym.trainer.async_modes",
    "recipe.nemo_gym.storage": "recipe.nemo_gym.trainer.storage",
    "recipe.nemo_gym.ray_exit": "recipe.nemo_gym.trainer.ray_exit",
    # recipe/nemo_gym/: reporting (recipe.nemo_gym.reporting itself: BECAME_PACKAGES)
    "recipe.nemo_gym.reward_curve": "recipe.nemo_gym.reporting.curve",
    "recipe.nemo_gym.reward_plot": "recipe.nemo_gym.reporting.plot",
    # nemo_gym_adapter/: processes and their lifetime
    "nemo_gym_adapter.procs": "nemo_gym_adapter.runtime.procs",
    "nemo_gym_adapter.reaper": "nemo_gym_adapter.runtime.reaper",
    "nemo_gym_adapter.loop_thread": "nemo_gym_adapter.runtime.loop_thread",
    "nemo_gym_adapter.server_actors": "nemo_gym_adapter.runtime.server_actors",
    "nemo_gym_adapter.paths": "nemo_gym_adapter.runtime.paths",
    "nemo_gym_adapter.disk": "nemo_gym_adapter.runtime.disk",
    # nemo_gym_adapter/: what the user sees, Gym's payloads, the rollout client's row check
    "nemo_gym_adapter.progress": "nemo_gym_adapter.console.progress",
    "nemo_gym_adapter.tool_calls": "nemo_gym_adapter.wire.tool_calls",
    "nemo_gym_adapter.policy": "nemo_gym_adapter.wire.policy",
    "nemo_gym_adapter.row_echo": "nemo_gym_adapter.rollouts.row_echo",
}

# old modules whose name is now a package's: not aliased (the package answers to the name), listed for the record
BECAME_PACKAGES: dict[str, str] = {
    "recipe.nemo_gym.reporting": "recipe.nemo_gym.reporting.report",
    "nemo_gym_adapter.console": "nemo_gym_adapter.console.repeats",
    "nemo_gym_adapter.wire": "nemo_gym_adapter.wire.payloads",
}


def notice(old: str) -> str:
    """The warning an old name gets: where its module lives now."""
    return f"{old} moved to {MOVED[old]}; the old path will be removed"


class _Alias(importlib.abc.Loader):
    """Loads an old name as the new module object itself (imported, or found in ``sys.modules``)."""

    def __init__(self, old: str) -> None:
        self.old = old
        self._spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED[self.old])
        self._spec = module.__spec__  # the import system sets the alias spec on it next; exec_module puts it back
        # stacklevel 2: the import statement (warnings passes over the import machinery's own frames)
        warnings.warn(notice(self.old), FutureWarning, stacklevel=2)
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the module keeps its own name and spec: it ran once, under its new name


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of :data:`MOVED` (and nothing else)."""

    ngv_moved = True  # what install() looks for (a reloaded copy of this module defines another class)

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(fullname))


def install() -> None:
    """Put the finder right behind the path finder in ``sys.meta_path``, once per process: the real modules are found
    first, and an old name is ours before any fallback finder's (setuptools' editable finder would serve the old
    file from the checkout the venv was installed from, e.g. main's while a git worktree runs)."""
    if any(getattr(finder, "ngv_moved", False) for finder in sys.meta_path):
        return
    after = [i for i, finder in enumerate(sys.meta_path) if finder is importlib.machinery.PathFinder]
    sys.meta_path.insert(after[0] + 1 if after else len(sys.meta_path), MovedFinder())
