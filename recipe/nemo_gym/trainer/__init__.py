"""What wires verl's trainers, on the driver and in verl's TaskRunner actor: ``task_runner`` (verl's legacy
TaskRunner and ``RayPPOTrainer``), ``task_runner_v1`` (verl's v1 TaskRunner and trainer mixin), ``async_modes``
(verl's async modes checked before anything starts), ``storage`` (checkpoints and dumps on a full disk), ``ray_exit``
(the run's own Ray stopped with it).

May import every room below it (config, servers, algorithms, cpu, managers) and the library; only ``main`` imports it.
"""
