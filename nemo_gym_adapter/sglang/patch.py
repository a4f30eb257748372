"""Install the SGLang token-ID patch: narrowly, visibly, idempotently; in this process or inside verl's actors.

* :func:`apply_patch`: in this process. SGLang 0.5.12 only (verl 0.9.1's ``verl[sglang]`` pin; anything else raises
  ``SetupError`` naming the version), the methods of :data:`HOOK_TARGETS` wrapped once each (a second call reports
  ``already_patched``): the raw-body reader (``sglang.request_ids``) on chat and tokenize, the splice and the
  conversation-template guard (``sglang.hooks``), the answer (``sglang.answer``: token fields, aborted -> 503) on chat
  and completions. The wrappers are set on the classes, so the handlers SGLang's app creates in its lifespan use them
  whenever the patch is applied.
* :func:`apply_patch_to_actors`: inside verl's live ``SGLangHttpServer`` actors (``sglang_server_{replica}_{node}``,
  :func:`find_sglang_server_actors`) through ``actor.__ray_call__``: SGLang's FastAPI app, its tokenizer manager and
  template manager live in that actor (the scheduler runs in child processes), so a class-level patch there reaches
  every chat request (:mod:`nemo_gym_adapter.runtime.server_actors`, shared with vLLM). Inside the actor it refuses a server
  without a tokenizer (verl's default ``rollout.skip_tokenizer_init=True``: SGLang's chat endpoint then answers 500
  to everything) naming the key, and takes the actor's ``config.max_model_len`` (verl's ``rollout.max_model_len``,
  which verl does not pass to SGLang) as a clamp limit. One :class:`PatchReport` per actor, or a ``ServerError``
  naming the actor that failed.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Iterable, Mapping
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
from nemo_gym_adapter.sglang import answer, hooks
from nemo_gym_adapter.sglang.request_ids import SENTINEL, make_request_wrapper
from nemo_gym_adapter.tokens.splice import ASSISTANT_EDITS

SUPPORTED_VERSIONS = ("0.5.12",)  # where the hooks below were read and executed (docs/SGLANG.md)
ACTOR_PREFIX = "sglang_server_"  # verl's SGLangReplica names its server actors sglang_server_{replica}_{node}
_OPENAI = "sglang.srt.entrypoints.openai"


@dataclass(frozen=True)
class HookTarget:
    """One SGLang method the patch wraps: ``module.Class.method`` and the factory of its wrapper."""

    module: str
    qualname: str  # "Class.method"
    wrap: Callable[[Any], Any]

    @property
    def dotted(self) -> str:
        return f"{self.module}.{self.qualname}"


def _completion_guard(original: Any) -> Any:
    return answer.make_response_wrapper(original, chat=False)


# The one place the hooked SGLang 0.5.12 methods are pinned (the render hook first: the report's ``hook``).
HOOK_TARGETS: tuple[HookTarget, ...] = (
    HookTarget(f"{_OPENAI}.serving_chat", "OpenAIServingChat._apply_jinja_template", hooks.make_render_wrapper),
    HookTarget(
        f"{_OPENAI}.serving_chat", "OpenAIServingChat._apply_conversation_template", hooks.make_conversation_guard
    ),
    HookTarget(f"{_OPENAI}.serving_chat", "OpenAIServingChat.handle_request", make_request_wrapper),
    HookTarget(f"{_OPENAI}.serving_tokenize", "OpenAIServingTokenize.handle_request", make_request_wrapper),
    HookTarget(f"{_OPENAI}.serving_chat", "OpenAIServingChat._build_chat_response", answer.make_response_wrapper),
    HookTarget(
        f"{_OPENAI}.serving_completions", "OpenAIServingCompletion._build_completion_response", _completion_guard
    ),
)
_LOCK = threading.Lock()


@dataclass(frozen=True)
class PatchReport:
    """What :func:`apply_patch` did in one process (picklable: it comes back from Ray actors)."""

    sglang_version: str
    hook: str  # the render hook (HOOK_TARGETS[0])
    hooks: tuple[str, ...]  # every wrapped method
    already_patched: bool
    pid: int
    actor: str | None = None
    node_ip: str | None = None  # the Ray node's IP when applied inside an actor
    assistant_edits: str = "keep_ids"
    max_model_len: int | None = None  # verl's rollout.max_model_len, a clamp limit (None: SGLang's context only)

    backend = "sglang"  # the engine (a class attribute: the vLLM patch's report has the same three names)

    @property
    def version(self) -> str:
        return self.sglang_version


def _class_and_method(target: HookTarget, version: str) -> tuple[type, str]:
    class_name, method = target.qualname.split(".")
    try:
        cls = getattr(importlib.import_module(target.module), class_name)
        getattr(cls, method)
    except (ImportError, AttributeError) as e:
        raise SetupError(f"SGLang {version}: {target.dotted} is missing; the token-ID patch cannot be applied") from e
    return cls, method


def _installed(cls: type, method: str) -> bool:
    # The class's own attribute: handle_request is inherited from OpenAIServingBase, and a wrapper on one subclass
    # must not count for the other.
    return getattr(cls.__dict__.get(method), SENTINEL, None) is not None


def sglang_version() -> str:
    """The installed SGLang's version; ``SetupError`` when it is not one :data:`SUPPORTED_VERSIONS` names."""
    import sglang

    version = getattr(sglang, "__version__", "unknown")
    if version not in SUPPORTED_VERSIONS:
        raise SetupError(
            f"SGLang {version!r} is not supported by the nemo-gym-verl token-ID patch (supported: "
            f"{', '.join(SUPPORTED_VERSIONS)}, verl 0.9.1's pin). Install sglang=={SUPPORTED_VERSIONS[-1]}, or add the "
            "version to nemo_gym_adapter/sglang/patch.py after checking where it renders chat prompts (docs/SGLANG.md)."
        )
    return version


def apply_patch(assistant_edits: str = "keep_ids", max_model_len: int | None = None) -> PatchReport:
    """Install the hooks on this process's SGLang; idempotent (a second call reports ``already_patched``).

    ``assistant_edits`` (``nemo_gym.assistant_edits``) and ``max_model_len`` (a clamp limit besides SGLang's context
    length) are set on every call. Raises ``SetupError`` for an unsupported SGLang, a missing method or an option."""
    if assistant_edits not in ASSISTANT_EDITS:
        raise SetupError(f"assistant_edits must be one of {ASSISTANT_EDITS}, got {assistant_edits!r}")
    version = sglang_version()
    found = [(*_class_and_method(t, version), t) for t in HOOK_TARGETS]  # all checked before anything is wrapped
    already = True
    with _LOCK:
        for cls, method, target in found:
            if not _installed(cls, method):
                setattr(cls, method, target.wrap(getattr(cls, method)))
                already = False
        hooks.OPTIONS["assistant_edits"] = assistant_edits
        hooks.OPTIONS["max_model_len"] = max_model_len
    return PatchReport(
        version,
        HOOK_TARGETS[0].dotted,
        tuple(t.dotted for t in HOOK_TARGETS),
        already,
        os.getpid(),
        assistant_edits=assistant_edits,
        max_model_len=max_model_len,
    )


def is_patched() -> bool:
    """True when every hook of :data:`HOOK_TARGETS` carries the patch in this process."""
    version = sglang_version()
    return all(_installed(*_class_and_method(t, version)) for t in HOOK_TARGETS)


def unpatch() -> None:
    """Put SGLang's originals back in this process (the tests' unpatched control)."""
    with _LOCK:
        for target in HOOK_TARGETS:
            class_name, method = target.qualname.split(".")
            cls = getattr(importlib.import_module(target.module), class_name)
            original = getattr(cls.__dict__.get(method), SENTINEL, None)
            if original is None:
                continue
            if any(original is base.__dict__.get(method) for base in cls.__mro__[1:]):
                delattr(cls, method)  # it was inherited: drop our override
            else:
                setattr(cls, method, original)


def _patch_inside_actor(actor_self: Any, assistant_edits: str = "keep_ids") -> PatchReport:
    """Runs inside verl's ``SGLangHttpServer`` actor via ``__ray_call__`` (``actor_self`` is the actor instance)."""
    tokenizer_manager = getattr(actor_self, "tokenizer_manager", None)
    if tokenizer_manager is not None and getattr(tokenizer_manager, "tokenizer", None) is None:
        raise SetupError(
            "SGLang runs without a tokenizer (actor_rollout_ref.rollout.skip_tokenizer_init=True, verl's default): its "
            "OpenAI chat endpoint answers 500 to every request; set actor_rollout_ref.rollout.skip_tokenizer_init=False"
        )
    config = getattr(actor_self, "config", None)
    max_model_len = getattr(config, "max_model_len", None)
    report = apply_patch(assistant_edits, max_model_len if isinstance(max_model_len, int) else None)
    name, node_ip = actor_identity(actor_self)
    return replace(report, actor=name, node_ip=node_ip)


def apply_patch_to_actors(
    actor_handles: Iterable[Any] | Mapping[str, Any],
    timeout: float = 120.0,
    *,
    assistant_edits: str = "keep_ids",
    partial_rollouts: bool = True,
) -> list[PatchReport]:
    """Apply the patch inside each live actor (verl's ``sglang_server_*``); one report per actor, in order.

    ``partial_rollouts`` is accepted for the engines' common signature and has no effect: on SGLang a turn a weight
    sync aborted is always answered 503 and regenerated (what resuming it would take: docs/SGLANG.md).

    ``actor_handles``: handles, or a mapping name -> handle (names are used in errors). The actors must be able to
    import ``nemo_gym_adapter`` (same image / runtime env). Raises ``ServerError`` naming the first actor that failed
    (an unsupported SGLang, a server without a tokenizer) or did not answer within ``timeout`` seconds in total."""
    return call_on_actors(
        actor_handles, _patch_inside_actor, assistant_edits, timeout=timeout, what="SGLang token-ID patch"
    )


def _aborted_inside_actor(actor_self: Any) -> int:
    return answer.aborted_total()


def aborted_turns(actor_handles: Mapping[str, Any], timeout: float = 10.0) -> int | None:
    """Sum over the server actors of the generations answered 503 because SGLang aborted them; None (logged) when
    any actor does not answer: a metric, never a failed step."""
    return sum_on_actors(actor_handles, _aborted_inside_actor, timeout)


def _counters_inside_actor(actor_self: Any) -> dict[str, int]:
    aborted = answer.aborted_total()
    return {
        "interrupted_turns": aborted,
        "aborted_turns": aborted,
        "regenerated_tokens": answer.regenerated_tokens_total(),
    }


def engine_counters(actor_handles: Mapping[str, Any], timeout: float = 10.0) -> dict[str, int] | None:
    """Sums over the server actors: ``interrupted_turns`` = ``aborted_turns`` (every aborted turn is answered 503)
    and ``regenerated_tokens`` (the tokens those 503s withheld); None (logged) when any actor does not answer."""
    return sum_dicts_on_actors(actor_handles, _counters_inside_actor, timeout)


def find_sglang_server_actors(all_namespaces: bool = False) -> dict[str, Any]:
    """verl's SGLang rollout server actors by name (``sglang_server_{replica}_{node}``; reward and teacher servers
    left out)."""
    return find_server_actors(ACTOR_PREFIX, all_namespaces)
