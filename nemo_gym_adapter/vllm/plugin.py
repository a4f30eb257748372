"""vLLM general plugin (entry point ``vllm.general_plugins``: ``nemo_gym_verl_console``): run by vLLM in each of its
processes (API server, engine core, workers) wherever this package is installed.

Two things, each idempotent (vLLM may call a plugin several times per process):

* repeated notices appear once per process (:func:`nemo_gym_adapter.console.once`): vLLM 0.25+ reloads weights layer
  by layer after every weight sync and warns ``RotaryEmbedding: Failed to load weights`` each time -- the rotary cache
  is computed, not a checkpoint weight, and vLLM puts its own tensors back, so nothing is wrong and nothing is to be
  done; one line per weight sync buried each step's metrics. The first occurrence still shows;
* inside a Ray worker whose job published a rollout key (a training run's rollout server: verl builds the engine
  arguments, which load the plugins, before it builds and serves the OpenAI app), the access guard with that key
  (:mod:`nemo_gym_adapter.access.guard`), so the server never answers a request without it -- not even between its
  start and the moment the manager reaches it through Ray. Elsewhere (no Ray, no key published) nothing.

``VLLM_PLUGINS`` (vLLM's own allow-list) can leave it out; the manager then installs the guard through Ray.
"""

from __future__ import annotations

import logging

from nemo_gym_adapter.console import once

logger = logging.getLogger(__name__)

# Loggers whose messages repeat every step (vLLM names loggers after their modules).
REPEATING_LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise",)


def install() -> None:
    """The plugin's entry point (idempotent: vLLM may call it several times per process)."""
    for name in REPEATING_LOGGERS:
        once(name)
    guard_from_run_key()


def guard_from_run_key() -> bool:
    """The access guard with this Ray job's rollout key, when one is published (:func:`access.key.fetch`); True when
    installed. A failure to read the key is logged and leaves the server to the manager's install through Ray."""
    from nemo_gym_adapter.access.guard import install_guard
    from nemo_gym_adapter.access.key import fetch

    try:
        key = fetch()
    except Exception as e:  # never stop vLLM from starting: the manager installs it through Ray and checks it
        logger.warning(
            "nemo-gym-verl: could not read the run's rollout key from Ray (%s); guard left to the manager", e
        )
        return False
    if key is None:
        return False
    install_guard([key.value.get_secret_value()])
    return True
