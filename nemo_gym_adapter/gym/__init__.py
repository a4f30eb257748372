"""Component 3: NeMo Gym's lifecycle and health, reached over HTTP only (Gym runs in its own venv).

``launch`` (what to start: the ``gym env start`` spec), ``ports`` (the band Gym's servers' ports come from),
``servers`` (start, stop, restart, attach), ``readiness`` (when a launched Gym serves, and who is to blame when it does
not), ``head`` (what a running Gym answers: config, server instances, routes), ``ray_head`` (Gym's Ray head from Gym's venv), ``warm`` and
``warm_boot`` (a Gym interpreter with its imports done, handed the launch), ``early`` (both of those started before
verl's workers), ``service`` (Gym as a shared service, ``python -m nemo_gym_adapter.gym.service``), ``liveness`` and
``probes`` (dead and silent servers found within seconds), ``addresses`` (multi-host address rules), ``capture``
(Gym's token-ID capture files), ``catalogue`` (Gym's bundled environments), ``server_venvs`` (each server's venv)
and ``venv_prep`` (those venvs prepared: at set-up, and on first use before a launch).
Imported by rollouts, collect and the recipe; imports access, data (routing), runtime and the flat modules.
"""
