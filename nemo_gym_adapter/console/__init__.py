"""What the user sees on the console: ``repeats`` (each distinct repeated log message once per process),
``progress`` (a step's rollouts as a progress bar), ``notices`` (the driver's console without the known notices no
setting turns off) and ``startup`` (the start-up line, phase by phase).

Imports only the flat modules; imported by the packages above it (vllm's plugin, the rollout client, the recipe).
"""
