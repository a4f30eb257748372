"""vLLM general plugin (entry point ``vllm.general_plugins``: ``nemo_gym_verl_console``): run by vLLM in each of its
processes (API server, engine core, workers) wherever this package is installed.

It does three things, each idempotent (vLLM may call a plugin several times per process); ``VLLM_PLUGINS``, vLLM's
own allow-list, can leave it out:

- repeated notices appear once per process (:func:`nemo_gym_adapter.console.repeats.once`): vLLM 0.25+ reloads weights layer
  by layer after every weight sync and warns ``RotaryEmbedding: Failed to load weights`` each time -- the rotary cache
  is computed, not a checkpoint weight, and vLLM puts its own tensors back, so nothing is wrong and nothing is to be
  done; one line per weight sync buried each step's metrics. The first occurrence still shows.
- the tool parser ``ngv_json`` (:mod:`nemo_gym_adapter.vllm.tool_parser`) is registered lazily (imported only when a
  server is started with ``--tool-call-parser ngv_json``). verl's rollout replicas never import a
  ``--tool-parser-plugin`` file (they build vLLM's app without vLLM's launcher), so this is how they get it.
- inside a Ray worker whose job published a rollout key (a training run's rollout server: verl builds the engine
  arguments, which load the plugins, before it builds and serves the OpenAI app), the access guard with that key
  (:mod:`nemo_gym_adapter.access.guard`), so the server never answers a request without it -- not even between its
  start and the moment the manager reaches it through Ray (left out: the manager installs it through Ray then).
  Elsewhere (no Ray, no key published) nothing.
"""

from __future__ import annotations

import logging
import sys

from nemo_gym_adapter.console.repeats import once

logger = logging.getLogger(__name__)

# Loggers whose messages repeat every step (vLLM names loggers after their modules).
REPEATING_LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise",)
TOOL_PARSERS = {"ngv_json": ("nemo_gym_adapter.vllm.tool_parser", "JsonToolParser")}


def register_tool_parsers() -> None:
    """Register our tool parsers with vLLM's ``ToolParserManager`` by name only (their modules load on first use).

    Only in a process that serves vLLM's OpenAI app: every such process (vLLM's launcher, verl's server actor) has
    imported ``vllm.tool_parsers`` with the app's modules before it builds its engine arguments (when vLLM loads this
    plugin); importing it here would add ~1.6 s to each engine-core and worker process, which never parse tool
    calls."""
    if "vllm.tool_parsers" not in sys.modules:
        return
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError as e:  # a vLLM without the registry: selecting the parser then fails naming it
        logging.getLogger(__name__).warning("vLLM tool parsers %s not registered: %s", sorted(TOOL_PARSERS), e)
        return
    for name, (module, cls) in TOOL_PARSERS.items():
        if name not in ToolParserManager.tool_parsers:
            ToolParserManager.register_lazy_module(name, module, cls)


def install() -> None:
    """The plugin's entry point (idempotent: vLLM may call it several times per process)."""
    for name in REPEATING_LOGGERS:
        once(name)
    register_tool_parsers()
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
