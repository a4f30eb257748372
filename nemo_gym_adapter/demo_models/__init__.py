"""Deterministic tiny models built at run time: what the README demo, ``collect`` and the CPU configs serve.

``build_tiny_model(family)`` (``qwen25``, ``qwen3``, ``llama3``) returns a local model directory (tokenizer + random
weights, about a second to build, cached under ``paths.tiny_models_dir()``) that transformers, vLLM and verl load
offline; the shipped configs reach it through ``${ngv_tiny_model:<family>}`` (``recipe.nemo_gym.config.resolvers``).
Each family keeps the token-level traits of the real one that the token-ID splice must survive (``tiny_models``); the
chat templates and tokenizer corpus are in ``templates``.

CLI: ``python -m nemo_gym_adapter.demo_models [--family all|qwen25|qwen3|llama3] [--root DIR]``.
"""

from nemo_gym_adapter.demo_models.tiny_models import FAMILIES, build_tiny_model

__all__ = ["FAMILIES", "build_tiny_model"]
