"""The directory a guarded Gym's processes get on ``PYTHONPATH`` (``access.gym_guard``): its ``sitecustomize`` runs in
every interpreter of Gym's process tree. A package only so that an installed copy ships the file."""
