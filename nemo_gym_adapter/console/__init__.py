"""What the user sees on the console: ``repeats`` (each distinct repeated log message once per process) and
``progress`` (a step's rollouts as a progress bar).

Imports only the flat modules; imported by the packages above it (vllm's plugin, the rollout client).
"""
