"""nemo_gym_adapter: the library half of nemo-gym-verl, one package per integration component.

- :mod:`~nemo_gym_adapter.tokens` -- the on-policy token-ID fix's pure token math (splice, turn ends, history checks);
- :mod:`~nemo_gym_adapter.vllm` -- everything that touches vLLM: per-version hooks, the patch applied via Ray, the
  abort guard, the standalone patched server;
- :mod:`~nemo_gym_adapter.gym` -- NeMo Gym's lifecycle and health: launch, servers, Ray head, warm launcher,
  shared service, liveness probes, addresses;
- :mod:`~nemo_gym_adapter.rollouts` -- one step's orchestration: core, HTTP client, trajectories, samples, metrics,
  validation;
- :mod:`~nemo_gym_adapter.data` -- rows and their routing: the dataset verl loads, its cache, the row contract, JSONL
  reading, environment sampling;
- :mod:`~nemo_gym_adapter.demo_models` -- models built at set-up for the demo, ``collect`` and the tests.

Plumbing shared by all stays at the top (``config``, ``errors``, ``paths``, ``procs``, ``reaper``, ``loop_thread``,
``progress``, ``policy``, ``wire``: Gym's payload models, ``row_echo``: is a result another row's) and imports none of
the packages; ``collect`` (rollouts without training) is the one command at the top and may import any of them.
Dependencies point one way: recipe -> rollouts -> gym / vllm -> data / tokens -> plumbing
(``tests/unit/test_layering.py``).

Nothing here imports ``nemo_gym``: NeMo Gym runs in its own venv and is reached over HTTP only. Heavy dependencies
(vLLM, torch, Ray) are imported lazily inside functions.
"""

__version__ = "0.1.0"
