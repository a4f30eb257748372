"""Install the token-ID patch (:mod:`nemo_gym_adapter.vllm.hooks`) on vLLM: narrowly, visibly, idempotently.

* :func:`apply_patch`: in this process (``nemo_gym_adapter.vllm.server`` does it before vLLM's server starts). It
  picks the hook of the installed vLLM version (``vllm.hooks.HOOK_TARGETS``), raises ``SetupError`` for an
  unsupported version or a missing hook, wraps it once (a second call reports ``already_patched``) and logs it.
  It also installs partial rollouts (:mod:`nemo_gym_adapter.vllm.resume`: a turn a weight sync aborted is resumed
  from the tokens it had), the abort guard for the turns that cannot be resumed (:mod:`nemo_gym_adapter.vllm.abort`:
  an aborted completion answers 503) and the output-budget clamp on ``/v1/completions``
  (:mod:`nemo_gym_adapter.vllm.request_limits`).
* :func:`apply_patch_to_actors`: inside verl's live rollout server actors (``vllm_server_{replica}_{node}``, found by
  :func:`find_vllm_server_actors`) through ``actor.__ray_call__``; one :class:`PatchReport` per actor, or a
  ``ServerError`` naming the actor that failed or did not answer (the Ray side is
  :mod:`nemo_gym_adapter.runtime.server_actors`, shared with the SGLang patch).
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from nemo_gym_adapter.errors import SetupError
from nemo_gym_adapter.runtime.server_actors import (
    actor_identity,
    call_on_actors,
    find_server_actors,
    sum_dicts_on_actors,
    sum_on_actors,
)
from nemo_gym_adapter.tokens.splice import ASSISTANT_EDITS
from nemo_gym_adapter.vllm import resume
from nemo_gym_adapter.vllm.abort import ABORT_GUARD_TARGETS, install_abort_guard
from nemo_gym_adapter.vllm.hooks import OPTIONS, SENTINEL, hook_target_for, make_harmony_guard, make_wrapper
from nemo_gym_adapter.vllm.request_limits import make_completion_wrapper

logger = logging.getLogger(__name__)

ACTOR_PREFIX = "vllm_server_"  # verl's vLLMReplica names its server actors vllm_server_{replica}_{node}
_LOCK = threading.Lock()


@dataclass(frozen=True)
class PatchReport:
    """What ``apply_patch`` did in one process (picklable: it comes back from Ray actors)."""

    vllm_version: str
    hook: str
    already_patched: bool
    pid: int
    actor: str | None = None
    node_ip: str | None = None  # the Ray node's IP when applied inside an actor
    assistant_edits: str = "keep_ids"
    partial_rollouts: bool = True

    backend = "vllm"  # the engine (a class attribute: the SGLang patch's report has the same three names)

    @property
    def version(self) -> str:
        return self.vllm_version


def apply_patch(assistant_edits: str = "keep_ids", partial_rollouts: bool = True) -> PatchReport:
    """Install the splice on this process's vLLM; idempotent (a second call reports ``already_patched``).

    ``assistant_edits`` (``nemo_gym.assistant_edits``): what a tokenized assistant message whose text was changed
    while its ids were kept gets: ``keep_ids`` (its ids win) or ``refuse`` (HTTP 400); set on every call.
    ``partial_rollouts`` (``nemo_gym.partial_rollouts``): a turn a weight sync aborted is resumed from its tokens
    (``vllm.resume``), or (``False``) answered 503 and regenerated whole; set on every call.
    Raises ``SetupError`` for an unsupported vLLM version, a missing hook or an unknown option.
    """
    import vllm

    if assistant_edits not in ASSISTANT_EDITS:
        raise SetupError(f"assistant_edits must be one of {ASSISTANT_EDITS}, got {assistant_edits!r}")

    version = getattr(vllm, "__version__", "unknown")
    target = hook_target_for(version)
    class_name, method_name = target.qualname.split(".")
    try:
        cls = getattr(importlib.import_module(target.module), class_name)
    except (ImportError, AttributeError) as e:
        raise SetupError(f"vLLM {version}: cannot import {target.module}.{class_name} for the token-ID patch") from e
    with _LOCK:
        current = getattr(cls, method_name, None)
        if current is None:
            raise SetupError(f"vLLM {version}: {target.dotted} does not exist; the token-ID patch cannot be applied")
        already = getattr(current, SENTINEL, None) is not None
        if not already:
            setattr(cls, method_name, make_wrapper(current))
            logger.info("nemo-gym-verl token-ID patch installed on %s (vLLM %s)", target.dotted, version)
        guarded = getattr(cls, target.guard, None)
        if guarded is not None and getattr(guarded, SENTINEL, None) is None:
            # Harmony (GPT-OSS) requests bypass the hook in this method: ids on them are refused, not ignored.
            setattr(cls, target.guard, make_harmony_guard(guarded))
        completion = getattr(cls, target.completion, None)
        if completion is None:
            logger.warning(
                "vLLM %s: no %s.%s; /v1/completions budgets are not clamped", version, class_name, target.completion
            )
        elif getattr(completion, SENTINEL, None) is None:
            setattr(cls, target.completion, make_completion_wrapper(completion))
        OPTIONS["assistant_edits"] = assistant_edits
        # A generation a weight sync aborted (verl's async trainers) is resumed from its tokens, or, when it cannot
        # be, answered 503, never as a cut "success".
        resume.OPTIONS["enabled"] = bool(partial_rollouts)
        if not install_resume_and_guard():
            logger.info(
                "nemo-gym-verl partial rollouts (%s) and abort guard installed on %s (vLLM %s)",
                "on" if partial_rollouts else "off",
                ", ".join(t.endpoint for t in ABORT_GUARD_TARGETS),
                version,
            )
    return PatchReport(
        version, target.dotted, already, os.getpid(), assistant_edits=assistant_edits, partial_rollouts=partial_rollouts
    )


def install_resume_and_guard() -> bool:
    """Partial rollouts and the abort guard (both idempotent); True when both were already installed."""
    resumed = resume.install_resume()
    guarded = install_abort_guard()
    return resumed and guarded


def is_patched() -> bool:
    """True when this process's vLLM hook carries the splice (False for unsupported or unimported vLLM)."""
    import vllm

    target = hook_target_for(getattr(vllm, "__version__", "unknown"))
    class_name, method_name = target.qualname.split(".")
    cls = getattr(importlib.import_module(target.module), class_name)
    return getattr(getattr(cls, method_name, None), SENTINEL, None) is not None


def _patch_inside_actor(
    actor_self: Any, assistant_edits: str = "keep_ids", partial_rollouts: bool = True
) -> PatchReport:
    """Runs inside a live actor via ``__ray_call__`` (``actor_self`` is the actor instance, verl's server: resumed
    segments read their weight version from it)."""
    report = apply_patch(assistant_edits, partial_rollouts)
    resume.set_server(actor_self)
    name, node_ip = actor_identity(actor_self)
    return replace(report, actor=name, node_ip=node_ip)


def apply_patch_to_actors(
    actor_handles: Iterable[Any] | Mapping[str, Any],
    timeout: float = 120.0,
    *,
    assistant_edits: str = "keep_ids",
    partial_rollouts: bool = True,
) -> list[PatchReport]:
    """Apply the patch inside each live actor (verl's ``vllm_server_*``) with ``actor.__ray_call__.remote``.

    ``assistant_edits``, ``partial_rollouts``: as for :func:`apply_patch`, set in every actor.
    ``actor_handles``: handles, or a mapping name -> handle (names are used in errors). The actors must be able to
    import ``nemo_gym_adapter`` (same venv / runtime env). Returns one report per actor, in order. Raises
    ``ServerError`` naming the first actor that failed or did not answer within ``timeout`` seconds in total.
    """
    return call_on_actors(
        actor_handles,
        _patch_inside_actor,
        assistant_edits,
        partial_rollouts,
        timeout=timeout,
        what="vLLM token-ID patch",
    )


def _aborted_inside_actor(actor_self: Any) -> int:
    from nemo_gym_adapter.vllm.abort import aborted_total

    return aborted_total()


def aborted_turns(actor_handles: Mapping[str, Any], timeout: float = 10.0) -> int | None:
    """Sum over the server actors of the generations the abort guard answered 503 (``vllm.abort``); None
    (logged) when any actor does not answer: a metric, never a failed step."""
    return sum_on_actors(actor_handles, _aborted_inside_actor, timeout)


def _counters_inside_actor(actor_self: Any) -> dict[str, int]:
    from nemo_gym_adapter.vllm.abort import aborted_total, regenerated_tokens_total

    return {
        **resume.counters(),
        "aborted_turns": aborted_total(),
        "regenerated_tokens": regenerated_tokens_total(),
    }


def engine_counters(actor_handles: Mapping[str, Any], timeout: float = 10.0) -> dict[str, int] | None:
    """Sums over the server actors of what happened to generations a weight sync aborted: ``interrupted_turns``,
    ``resumes``, ``resumed_turns``, ``resumed_tokens`` (kept), ``refused_turns`` and ``refused/<reason>``,
    ``seam_stop_cuts``, ``seam_cut_tokens`` (``vllm.resume.counters``), ``aborted_turns`` (answered 503) and
    ``regenerated_tokens`` (the tokens those 503s withheld); None (logged) when any actor does not answer."""
    return sum_dicts_on_actors(actor_handles, _counters_inside_actor, timeout)


def find_vllm_server_actors(prefix: str = ACTOR_PREFIX, all_namespaces: bool = False) -> dict[str, Any]:
    """verl's vLLM rollout server actors by name: ``{prefix}{replica}_{node}[_{suffix}]`` (and PD ``decode_``
    servers; :func:`nemo_gym_adapter.runtime.server_actors.find_server_actors`). Reward and teacher servers
    (``vllm_server_reward_*``, ``vllm_server_teacher_*``) are not included."""
    return find_server_actors(prefix, all_namespaces)
