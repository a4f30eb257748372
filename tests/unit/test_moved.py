"""Old module paths still import (``nemo_gym_adapter.moved``): each old name is the new module itself, with a
FutureWarning naming the new path; a class a user's config names by its old path is the class verl and hydra load;
an unknown name is still not found; the old module names that became packages answer as packages
(``python -m recipe.nemo_gym.reporting``)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from nemo_gym_adapter import moved
from recipe.nemo_gym.config.load import MANAGER_CLASS, MANAGER_CLASS_V1

REPO = Path(__file__).resolve().parents[2]


def _forget(old: str) -> None:
    """Undo an old name's import: this process imports it afresh (and warns) next time."""
    module = sys.modules.pop(old, None)
    parent, _, child = old.rpartition(".")
    if module is not None and getattr(sys.modules.get(parent), child, None) is module:
        delattr(sys.modules[parent], child)


@pytest.fixture
def fresh():
    """Old names imported by a test are forgotten after it."""
    names: list[str] = []
    yield names.append
    for name in names:
        _forget(name)


@pytest.mark.parametrize(("old", "new"), sorted(moved.MOVED.items()))
def test_an_old_path_is_the_new_module_itself_and_says_where_it_went(old, new, fresh):
    fresh(old)
    _forget(old)
    with pytest.warns(FutureWarning, match=re.escape(f"{old} moved to {new}; the old path will be removed")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new) and sys.modules[old] is module
    assert module.__name__ == new and module.__spec__ is not None and module.__spec__.name == new  # ran once, as new
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert importlib.import_module(old) is module  # the warning is once per process


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("recipe.nemo_gym.agent_loop.NemoGymAgentLoopManager", MANAGER_CLASS),
        ("recipe.nemo_gym.agent_loop_tq.NemoGymAgentLoopManagerTQ", MANAGER_CLASS_V1),
    ],
)
def test_a_manager_class_named_by_its_old_path_is_the_class_verl_and_hydra_load(old, new, fresh):
    """``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` in a user's own config: verl's ``load_class``
    (what its trainers call) and hydra's ``_locate`` (a ``_target_``) both get the one class."""
    from hydra._internal.utils import _locate
    from verl.utils.import_utils import load_class_from_fqn

    module = old.rpartition(".")[0]
    fresh(module)
    _forget(module)
    with pytest.warns(FutureWarning, match=f"{re.escape(module)} moved to"):
        cls = load_class_from_fqn(old, "AgentLoopManager")
    assert cls is _locate(new) is _locate(old) and cls.__module__ == new.rpartition(".")[0]


def test_the_old_masked_grpo_module_registers_the_estimator_it_always_did(fresh):
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    fresh("recipe.nemo_gym.advantage")
    _forget("recipe.nemo_gym.advantage")
    with pytest.warns(FutureWarning, match="recipe.nemo_gym.algorithms.masked_grpo"):
        old = importlib.import_module("recipe.nemo_gym.advantage")
    assert get_adv_estimator_fn("masked_grpo") is old.compute_masked_grpo_outcome_advantage


@pytest.mark.parametrize(
    "name",
    ["recipe.nemo_gym.no_such_module", "nemo_gym_adapter.no_such_module", "recipe.nemo_gym.managers.agent_loop"],
)
def test_a_name_that_never_existed_is_still_not_found(name):
    with pytest.raises(ModuleNotFoundError, match=re.escape(name)):
        importlib.import_module(name)


@pytest.mark.parametrize(("old", "new"), sorted(moved.BECAME_PACKAGES.items()))
def test_an_old_module_whose_name_is_now_a_package_answers_as_that_package(old, new):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        package, module = importlib.import_module(old), importlib.import_module(new)
    assert hasattr(package, "__path__") and module.__name__ == new and old not in moved.MOVED


def test_the_finder_is_installed_once_behind_the_real_modules():
    moved.install()
    moved.install()
    ours = [i for i, f in enumerate(sys.meta_path) if getattr(f, "ngv_moved", False)]
    assert len(ours) == 1
    path_finder = next(i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder)
    assert ours[0] == path_finder + 1  # behind the real modules, ahead of fallbacks (an editable install's)


def test_python_m_reporting_still_runs_the_report_command():
    out = subprocess.run(
        [sys.executable, "-W", "error::FutureWarning", "-m", "recipe.nemo_gym.reporting", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m recipe.nemo_gym.reporting") and "metrics" in out.stdout
