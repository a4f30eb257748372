"""Processes and their lifetime, and where a run's files go: ``procs`` (child processes in their own sessions, stopped
by pid, early slots), ``reaper`` (pid records and the watchdog that stops what a dead trainer left), ``loop_thread``
(an event loop in a thread for synchronous callers), ``server_actors`` (verl's rollout server actors through Ray),
``paths`` (where venvs, caches and logs live), ``disk`` (is a failed write a full disk), ``versions`` (an installed
package's version, read one way).

Imports only the flat modules (``errors``); imported by every component package above it.
"""
