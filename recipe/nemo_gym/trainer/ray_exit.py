"""The run's own Ray stops with the run, workers included.

Why: ``ray.shutdown()`` stops the raylet this driver started (``ray_init.address: local``); each worker then shuts
its core worker down and exits. Seen once in the v1 smoke e2e: verl's ``GlobalRequestLoadBalancer`` worker logged
"Core worker is destructed" and was still alive 30 s later, hung in Python's own exit (most likely joining a
non-daemon thread) -- an orphan holding ~700 MB until something killed it. So the workers below the raylet are
noted while Ray is up, and whichever is still alive ``grace_s`` after the shutdown is killed.

Only what this driver's own raylet started: a driver attached to a cluster started elsewhere has no raylet of its
own here, and nothing is noted or killed.
"""

from __future__ import annotations

import logging

from nemo_gym_adapter.runtime.procs import descendant_processes

logger = logging.getLogger(__name__)

GRACE_S = 10.0


def local_raylet_pids() -> list[int]:
    """Pids of the raylet(s) ``ray.init`` started in this process ([] when attached, or on a Ray without the API)."""
    try:
        import ray._private.worker as ray_worker

        node = getattr(ray_worker, "_global_node", None)
        infos = (getattr(node, "all_processes", None) or {}).get("raylet", [])
        return [info.process.pid for info in infos if getattr(info, "process", None) is not None]
    except Exception:  # a private API: its absence only means nothing is noted
        logger.debug("no local raylet found", exc_info=True)
        return []


def stop_stragglers(procs: list, grace_s: float = GRACE_S) -> list[tuple[int, str]]:
    """Wait up to ``grace_s`` for ``procs`` to exit, SIGKILL the rest; return the (pid, name) of those killed."""
    import psutil

    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    killed = []
    for p in alive:
        try:
            name = p.name()
            p.kill()
            killed.append((p.pid, name))
        except psutil.Error:
            continue
    psutil.wait_procs(alive, timeout=5)
    return killed


def shutdown() -> list[tuple[int, str]]:
    """``ray.shutdown()``, then the stragglers of this driver's own raylet killed after :data:`GRACE_S`."""
    import ray

    if not ray.is_initialized():
        return []
    workers = descendant_processes(local_raylet_pids())
    ray.shutdown()
    killed = stop_stragglers(workers)
    if killed:
        print(
            f"[nemo-gym-verl] {len(killed)} Ray worker(s) still running {GRACE_S:g} s after Ray stopped were killed: "
            + ", ".join(f"{name} (pid {pid})" for pid, name in killed),
            flush=True,
        )
    return killed
