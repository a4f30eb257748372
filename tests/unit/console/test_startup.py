"""The start-up line (``nemo_gym_adapter.console.startup``): each phase from its two marks, the total from the
launch, a phase without both marks left out (never guessed), the first mark of a name kept unless ``last``."""

from __future__ import annotations

import os
import time

import psutil

from nemo_gym_adapter.console.startup import LAUNCH_T0_ENV, StartupTimeline, launch_t0


def _timeline(marks: dict[str, float]) -> StartupTimeline:
    timeline = StartupTimeline()
    for name, at in marks.items():
        timeline.mark(name, at)
    return timeline


def test_every_phase_with_both_marks_in_order_and_the_total_from_the_launch():
    timeline = _timeline(
        {"launch": 100.0, "taskrunner": 108.5, "run": 119.0, "init": 130.0, "engine": 139.0, "engine_ready": 163.0}
    )
    timeline.mark("weights", 163.5)
    timeline.mark("ready", 164.0)
    timeline.mark("gym", 186.0)
    timeline.note("rollout manager and Gym", "Gym 12.5 s")
    assert timeline.summary() == (
        "start-up 86.0 s: driver and Ray 8.5 s, TaskRunner start 10.5 s, TransferQueue and data 11.0 s, "
        "actor workers 9.0 s, vLLM engine 24.0 s, replica wiring 0.5 s, first weight sync 0.5 s, "
        "rollout manager and Gym 22.0 s (Gym 12.5 s)"
    )


def test_a_phase_without_both_marks_is_left_out_and_the_total_starts_at_this_process_without_a_launch():
    timeline = _timeline({"taskrunner": 10.0, "run": 15.0, "ready": 40.0, "gym": 52.0})  # a GPU run: no engine
    assert timeline.summary() == "start-up 42.0 s: TaskRunner start 5.0 s, rollout manager and Gym 12.0 s"
    assert StartupTimeline().summary() == "start-up"


def test_the_first_step_line_is_made_once_from_verls_timers():
    timeline = _timeline({"launch": 100.0})
    line = timeline.first_step({"step": 18.1, "gen": 4.84, "update_actor": 1.2, "update_weights": "n/a"})
    assert line is not None and line.startswith("first step 18.1 s (generation 4.8 s, update 1.2 s), ")
    assert line.endswith(" s after the launch") and timeline.get("first_step") is not None
    assert timeline.first_step({"step": 2.0}) is None  # step 2: nothing more
    assert StartupTimeline().first_step({}) == "first step done"  # no timers, no launch: nothing guessed


def test_the_first_mark_of_a_name_is_kept_unless_last():
    timeline = StartupTimeline()
    timeline.mark("engine", 1.0)
    timeline.mark("engine", 2.0)  # a second replica's launch
    timeline.mark("engine_ready", 3.0, last=True)
    timeline.mark("engine_ready", 5.0, last=True)  # the last replica up
    assert timeline.span("engine", "engine_ready") == 4.0


def test_the_launch_comes_from_the_drivers_environment_and_this_process_start_from_the_os():
    timeline = StartupTimeline()
    timeline.mark_process_start({LAUNCH_T0_ENV: launch_t0()})
    assert timeline.get("launch") == psutil.Process(os.getpid()).create_time() == timeline.get("taskrunner")
    broken = StartupTimeline()
    broken.mark_process_start({LAUNCH_T0_ENV: "not a time"})
    assert broken.get("launch") is None and broken.get("taskrunner") is not None


def test_a_wrapper_that_execs_the_driver_sets_the_launch_and_a_stale_one_is_ignored():
    started = psutil.Process(os.getpid()).create_time()
    later = started + 0.5  # an exec'ing wrapper's set-up ended here (this process is older than that)
    assert float(launch_t0({LAUNCH_T0_ENV: repr(later)})) == later
    assert float(launch_t0({LAUNCH_T0_ENV: repr(started - 100)})) == started  # a parent launch's value
    assert float(launch_t0({LAUNCH_T0_ENV: repr(time.time() + 100)})) == started  # not yet: not a start
    assert float(launch_t0({LAUNCH_T0_ENV: "garbage"})) == float(launch_t0({})) == started
