"""nemo_gym_adapter: the library half of nemo-gym-verl, one package per integration component.

- :mod:`~nemo_gym_adapter.tokens` -- the on-policy token-ID fix's pure token math (splice, turn ends, history checks);
- :mod:`~nemo_gym_adapter.vllm`, :mod:`~nemo_gym_adapter.sglang` -- everything that touches each engine: per-version
  hooks, the patch applied via Ray, the abort guard, the standalone patched server;
- :mod:`~nemo_gym_adapter.gym` -- NeMo Gym's lifecycle and health: launch, servers, Ray head, warm launcher,
  shared service, liveness probes, addresses;
- :mod:`~nemo_gym_adapter.rollouts` -- one step's orchestration: core, HTTP client, trajectories, samples, metrics,
  validation;
- :mod:`~nemo_gym_adapter.data` -- rows and their routing: the dataset verl loads, its cache, the row contract, JSONL
  reading, environment sampling;
- :mod:`~nemo_gym_adapter.access` -- only the run's own clients get in: the rollout key and its guards;
- :mod:`~nemo_gym_adapter.demo_models` -- models built at set-up for the demo, ``collect`` and the tests;
- :mod:`~nemo_gym_adapter.runtime` -- processes and their lifetime, where a run's files go;
- :mod:`~nemo_gym_adapter.console` -- what the user sees: repeated notices once, the progress bar;
- :mod:`~nemo_gym_adapter.wire` -- Gym's payloads and what a replica serves, as typed models.

Flat, the package's face: ``config`` (the ``nemo_gym:`` section), ``errors`` (the error taxonomy), ``moved`` (old
module paths that still import), and ``collect`` (rollouts without training: the one command at the top, which may
import any package). Dependencies point one way (``tests/unit/test_layering.py``):
collect -> rollouts -> gym / vllm / sglang -> access / tokens / data / demo_models -> runtime / console / wire -> flat.

Nothing here imports ``nemo_gym``: NeMo Gym runs in its own venv and is reached over HTTP only. Heavy dependencies
(vLLM, torch, Ray) are imported lazily inside functions.
"""

from nemo_gym_adapter import moved

moved.install()

__version__ = "0.1.0"
