"""vLLM general plugin (entry point ``vllm.general_plugins``: ``nemo_gym_verl_console``): run by vLLM in each of its
processes (API server, engine core, workers) wherever this package is installed.

It only makes repeated notices appear once per process (:func:`nemo_gym_adapter.console.once`): vLLM 0.25+ reloads
weights layer by layer after every weight sync and warns ``RotaryEmbedding: Failed to load weights`` each time --
the rotary cache is computed, not a checkpoint weight, and vLLM puts its own tensors back, so nothing is wrong and
nothing is to be done; one line per weight sync buried each step's metrics. The first occurrence still shows.
Nothing else is changed; ``VLLM_PLUGINS`` (vLLM's own allow-list) can leave it out.
"""

from __future__ import annotations

from nemo_gym_adapter.console import once

# Loggers whose messages repeat every step (vLLM names loggers after their modules).
REPEATING_LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise",)


def install() -> None:
    """The plugin's entry point (idempotent: vLLM may call it several times per process)."""
    for name in REPEATING_LOGGERS:
        once(name)
