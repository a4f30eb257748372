"""nemo_gym_adapter: the library half of nemo-gym-verl.

Usable without verl's trainer. Nothing here imports ``nemo_gym``: NeMo Gym runs in its own venv and is
reached over HTTP only. Heavy dependencies (vLLM, torch, Ray) are imported lazily inside functions.
"""

__version__ = "0.1.0"
