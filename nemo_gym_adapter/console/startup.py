"""A run's start-up, phase by phase, in one console line: where the time before step 1 goes.

The phases are marked where they happen -- all in one process, verl's TaskRunner (the trainer, the CPU replica's
launch and the rollout manager run there) -- on the process-wide :data:`TIMELINE` (``mark(name)``, wall clock). The
launch's own start comes from the driver through the environment (:data:`LAUNCH_T0_ENV`: the driver process's start
time, which ``recipe.nemo_gym.main`` puts in the Ray runtime env), so the first phase covers the driver's imports,
``ray.init`` and the start of the TaskRunner's process. A phase whose two marks are not both there (a GPU run has no
CPU replica marks; a trainer path that does not mark one) is left out of the line, never guessed.

Marks, in order: ``launch`` (the driver's start), ``taskrunner`` (the TaskRunner process's start: a worker Ray may
have started ahead, so "driver and Ray" can end before the TaskRunner was asked for), ``run`` (its ``run`` entered:
``import verl`` and the CPU backend's modules done), ``init`` (TransferQueue up, datasets read: verl's worker set-up next), ``engine`` /
``engine_ready`` (the first CPU vLLM replica's launch, the last one's end), ``weights`` (verl's set-up done, the first
weight sync next), ``ready`` (verl ready to fit), ``gym`` (the rollout manager up: replicas found and patched, Gym
started), ``first_step`` (step 1's metrics).
"""

from __future__ import annotations

import os
import threading
import time

LAUNCH_T0_ENV = "NGV_LAUNCH_T0"

#: (label, from mark, to mark), in start-up order.
PHASES: tuple[tuple[str, str, str], ...] = (
    ("driver and Ray", "launch", "taskrunner"),
    ("TaskRunner start", "taskrunner", "run"),
    ("TransferQueue and data", "run", "init"),
    ("actor workers", "init", "engine"),
    ("vLLM engine", "engine", "engine_ready"),
    ("replica wiring", "engine_ready", "weights"),
    ("first weight sync", "weights", "ready"),
    ("rollout manager and Gym", "ready", "gym"),
)


class StartupTimeline:
    """Named wall-clock marks of one process (thread-safe). :meth:`mark` keeps the first time a name is marked unless
    ``last=True`` (an end that may be reached again, e.g. each replica's launch)."""

    def __init__(self) -> None:
        self._marks: dict[str, float] = {}
        self._notes: dict[str, str] = {}
        self._lock = threading.Lock()

    def mark(self, name: str, at: float | None = None, last: bool = False) -> None:
        at = time.time() if at is None else at
        with self._lock:
            if last or name not in self._marks:
                self._marks[name] = at

    def note(self, label: str, text: str) -> None:
        """Detail added after a phase's seconds in the summary (e.g. the rollout manager's own steps)."""
        with self._lock:
            self._notes[label] = text

    def get(self, name: str) -> float | None:
        with self._lock:
            return self._marks.get(name)

    def span(self, start: str, end: str) -> float | None:
        with self._lock:
            a, b = self._marks.get(start), self._marks.get(end)
        return None if a is None or b is None else b - a

    def mark_process_start(self, environ: dict[str, str] | None = None) -> None:
        """``launch`` (the driver's start, from :data:`LAUNCH_T0_ENV`) and ``taskrunner`` (this process's start)."""
        value = (os.environ if environ is None else environ).get(LAUNCH_T0_ENV)
        try:
            if value:
                self.mark("launch", float(value))
        except ValueError:
            pass
        try:
            import psutil

            self.mark("taskrunner", psutil.Process().create_time())
        except Exception:  # psutil missing or the process table unreadable: that phase is left out
            pass

    def summary(self, end: str = "gym") -> str:
        """``start-up 86.0 s: driver and Ray 8.5 s, ...``: every phase both of whose marks exist, and the total from
        the launch (or this process's start) to ``end``."""
        parts = []
        for label, start, stop in PHASES:
            seconds = self.span(start, stop)
            if seconds is not None:
                with self._lock:
                    note = self._notes.get(label)
                parts.append(f"{label} {seconds:.1f} s" + (f" ({note})" if note else ""))
        first = "launch" if self.get("launch") is not None else "taskrunner"
        total = self.span(first, end)
        head = f"start-up {total:.1f} s" if total is not None else "start-up"
        return head + (": " + ", ".join(parts) if parts else "")

    def first_step(self, timing: dict[str, float]) -> str | None:
        """Marks ``first_step`` and returns its line (None after the first call): ``first step 18.1 s (generation
        4.8 s, weight sync 0.1 s, update 1.2 s), 104.2 s after the launch``, from verl's ``timing_raw`` (seconds by
        timer name)."""
        with self._lock:
            if "first_step" in self._marks:
                return None
        self.mark("first_step")
        parts = [
            f"{label} {timing[key]:.1f} s"
            for key, label in (("gen", "generation"), ("update_weights", "weight sync"), ("update_actor", "update"))
            if isinstance(timing.get(key), int | float)
        ]
        step = timing.get("step")
        line = f"first step {step:.1f} s" if isinstance(step, int | float) else "first step done"
        line += f" ({', '.join(parts)})" if parts else ""
        first = "launch" if self.get("launch") is not None else "taskrunner"
        since = self.span(first, "first_step")
        return line + (f", {since:.1f} s after the {first}" if since is not None else "")


TIMELINE = StartupTimeline()


def launch_t0(environ: dict[str, str] | None = None) -> str:
    """This launch's start, as :data:`LAUNCH_T0_ENV` carries it (the driver sets it for its Ray workers): the process's
    start time -- or a later one the environment already holds: a wrapper that ``exec``s the driver (``scripts/run.sh``
    after its set-up) keeps its own process, so the process's start would count the wrapper's set-up as start-up; it
    sets :data:`LAUNCH_T0_ENV` just before the ``exec``. A value from before this process began (a parent's launch)
    is stale and ignored."""
    given = (os.environ if environ is None else environ).get(LAUNCH_T0_ENV)
    try:
        import psutil

        started = psutil.Process().create_time()
    except Exception:
        return repr(time.time())
    try:
        at = float(given) if given else None
    except ValueError:
        at = None
    return repr(at if at is not None and started <= at <= time.time() else started)
