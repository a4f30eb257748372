"""The trainer's sampling settings -- verl's ``actor_rollout_ref.rollout`` keys and its ``val_kwargs`` -- read once,
checked, and each either sent with every request or refused at start-up naming the key (a key the config lacks: verl's
default, sent too).

verl 0.9.1 samples in its own agent loop with ``temperature``, ``top_p``, ``top_k`` (training or ``val_kwargs``),
``repetition_penalty``, ``ignore_eos`` and a budget of ``response_length`` tokens; its vLLM server takes the training
values as server-wide defaults (``override_generation_config``). Gym's agents call the engine themselves, so each
setting must travel with each request (``nemo_gym_adapter.rollouts.sampling``), or validation silently samples with
the training ones. Per key:

=====================================================  =========================================================
``rollout.temperature``, ``rollout.top_p``             sent (``responses_create_params``)
``rollout.top_k``, ``rollout.repetition_penalty``,     sent (``metadata.extra_body``, merged by Gym's ``vllm_model``
``rollout.ignore_eos``                                 into the engine request)
``rollout.response_length``                            sent as ``max_output_tokens``, capping a row's own
``rollout.n``, ``val_kwargs.n``                        samples per prompt
``val_kwargs.temperature``/``top_p``/``top_k``         sent on validation requests
``rollout.do_sample``, ``val_kwargs.do_sample``        ``false`` means greedy: refused with a temperature above 0
                                                       (verl's vLLM agent loop ignores the key; one of the two
                                                       values would be silently dropped)
``rollout.full_determinism: true``                     refused: verl seeds each request with its replica's rank,
                                                       which Gym's requests do not carry
``rollout.over_sample_rate`` above 0                   refused: Gym runs every rollout to its end
any other ``val_kwargs`` key                           refused: not a setting the adapter sends
=====================================================  =========================================================

Pure: :func:`read_sampling` takes a ``select(key, default)`` over the whole config (``load._select``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

ROLLOUT = "actor_rollout_ref.rollout"
VAL_KWARGS_KEYS = frozenset({"_target_", "temperature", "top_p", "top_k", "do_sample", "n"})
"""``val_kwargs`` keys verl 0.9.1 defines (``SamplingConfig``); :func:`read_sampling` refuses any other."""


class SamplingSettings(BaseModel):
    """One pass's sampling settings (training or validation), each sent with every request; a key the config does
    not have takes verl 0.9.1's default (``RolloutConfig``, ``SamplingConfig``)."""

    model_config = ConfigDict(frozen=True)

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    repetition_penalty: float = 1.0
    ignore_eos: bool = False


Select = Callable[[str, Any], Any]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def read_sampling(select: Select, val_keys: Any, problems: list[str]) -> tuple[SamplingSettings, SamplingSettings]:
    """(training, validation) settings from the config behind ``select``; ``val_keys``: the keys present under
    ``rollout.val_kwargs``. Appends one problem per bad or refused key (the module docstring's table)."""

    def read(key: str, default: Any, ok: Callable[[Any], bool], fix: str) -> Any:
        value = select(key, default)
        if value is None:
            value = default
        if not ok(value):
            problems.append(f"{key}={value!r}: {fix}")
            return default
        return value

    def number(key: str, default: float, ok: Callable[[float], bool], fix: str) -> float:
        return float(read(key, default, lambda v: _number(v) and ok(v), fix))

    def temperature(key: str) -> float:
        return number(key, 1.0, lambda v: v >= 0, "must be a number >= 0")

    def top_p(key: str) -> float:
        return number(key, 1.0, lambda v: 0 < v <= 1, "must be a number in (0, 1]")

    def top_k(key: str) -> int:
        fix = "must be an integer: -1 (or 0) for no top-k, else the number of tokens kept"
        return int(read(key, -1, lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= -1, fix))

    train = SamplingSettings(
        temperature=temperature(f"{ROLLOUT}.temperature"),
        top_p=top_p(f"{ROLLOUT}.top_p"),
        top_k=top_k(f"{ROLLOUT}.top_k"),
        repetition_penalty=number(f"{ROLLOUT}.repetition_penalty", 1.0, lambda v: v > 0, "must be a number > 0"),
        ignore_eos=read(f"{ROLLOUT}.ignore_eos", False, lambda v: isinstance(v, bool), "must be true or false"),
    )
    val = train.model_copy(
        update={
            "temperature": temperature(f"{ROLLOUT}.val_kwargs.temperature"),
            "top_p": top_p(f"{ROLLOUT}.val_kwargs.top_p"),
            "top_k": top_k(f"{ROLLOUT}.val_kwargs.top_k"),
        }
    )
    for where, settings, default in (("", train, True), (".val_kwargs", val, False)):
        key = f"{ROLLOUT}{where}.do_sample"
        do_sample = select(key, default)  # verl's defaults: sampled training, greedy validation
        if do_sample is False and settings.temperature > 0:
            problems.append(
                f"{key}=False with {ROLLOUT}{where}.temperature={settings.temperature!r}: do_sample=false means greedy "
                f"decoding; set {ROLLOUT}{where}.temperature=0 for greedy, or {key}=true to sample"
            )
    if select(f"{ROLLOUT}.full_determinism", False):
        problems.append(
            f"{ROLLOUT}.full_determinism=True: verl seeds each request with its replica's rank, which requests made by "
            "Gym's agents do not carry (and one seed per replica would make a group's samples identical); set false"
        )
    over_sample = select(f"{ROLLOUT}.over_sample_rate", 0)
    if over_sample:
        problems.append(
            f"{ROLLOUT}.over_sample_rate={over_sample!r}: Gym runs every rollout to its end (verl's early termination "
            "of an agent loop does not apply); set 0"
        )
    unknown = sorted(set(val_keys or ()) - VAL_KWARGS_KEYS)
    if unknown:
        problems.append(
            f"{ROLLOUT}.val_kwargs has {unknown}: not a validation setting the adapter sends with each request "
            f"(it sends {sorted(VAL_KWARGS_KEYS - {'_target_'})}); remove them"
        )
    return train, val
