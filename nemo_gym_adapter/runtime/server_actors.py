"""verl's rollout server actors through Ray, for any engine: found by verl's names, a function run inside each.

verl names each rollout server actor ``{engine}_server_{replica}_{node}[_{suffix}]`` (``vllm_server_0_0``,
``sglang_server_1_0``; PD decode servers ``{engine}_server_decode_{replica}_{node}``). The token-ID patches
(:mod:`nemo_gym_adapter.vllm.patch`, :mod:`nemo_gym_adapter.sglang.patch`) use these helpers to reach them:

* :func:`find_server_actors`: the live actors of one engine, by name (reward and teacher servers left out);
* :func:`call_on_actors`: ``fn(actor_instance, *args)`` inside each actor through ``actor.__ray_call__``, one result
  per actor, or a ``ServerError`` naming the actor that failed or did not answer in time;
* :func:`sum_on_actors`: the same for a counter read as a metric: None (logged) instead of an error;
* :func:`actor_identity`: inside an actor, its Ray name and node IP (what a patch report carries).

Imports only ``errors``; Ray is imported inside the functions.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from nemo_gym_adapter.errors import ServerError

logger = logging.getLogger(__name__)


def find_server_actors(prefix: str, all_namespaces: bool = False) -> dict[str, Any]:
    """verl's rollout server actors by name: ``{prefix}{replica}_{node}[_{suffix}]`` (and PD ``decode_`` servers),
    sorted by name. Reward and teacher servers (``{prefix}reward_*``, ``{prefix}teacher_*``) are not included."""
    import ray

    pattern = re.compile(rf"^{re.escape(prefix)}(decode_)?\d+_\d+(_.+)?$")
    found = {}
    for entry in ray.util.list_named_actors(all_namespaces=all_namespaces):
        name, namespace = (entry["name"], entry.get("namespace")) if isinstance(entry, dict) else (entry, None)
        if pattern.match(name):
            found[name] = ray.get_actor(name, namespace=namespace)
    return dict(sorted(found.items()))


def call_on_actors(
    actor_handles: Iterable[Any] | Mapping[str, Any],
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 120.0,
    what: str = "call",
) -> list[Any]:
    """``fn(actor_self, *args)`` inside every actor (``actor.__ray_call__``), all started at once; the results in
    order. ``actor_handles``: handles, or a mapping name -> handle (names are used in errors). Raises ``ServerError``
    ("<what>: actor X did not answer within Ns" / "<what> failed in actor X: <error>") for the first actor that
    failed or did not answer within ``timeout`` seconds in total."""
    import ray
    from ray.exceptions import GetTimeoutError

    items: list[tuple[str | None, Any]] = (
        list(actor_handles.items()) if isinstance(actor_handles, Mapping) else [(None, h) for h in actor_handles]
    )
    pending = [(name or describe_actor(h), h.__ray_call__.remote(fn, *args)) for name, h in items]
    deadline = time.monotonic() + timeout
    results = []
    for label, ref in pending:
        try:
            results.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
        except GetTimeoutError as e:
            raise ServerError(f"{what}: actor {label} did not answer within {timeout:.0f}s") from e
        except Exception as e:  # RayTaskError wraps the actor-side error (e.g. a SetupError naming a version)
            raise ServerError(f"{what} failed in actor {label}: {e}") from e
    return results


def sum_on_actors(actor_handles: Mapping[str, Any], fn: Callable[[Any], int], timeout: float = 10.0) -> int | None:
    """The sum of ``fn(actor_self)`` over the actors: a metric, so None (logged) when any actor does not answer."""
    import ray

    try:
        refs = [h.__ray_call__.remote(fn) for h in actor_handles.values()]
        return int(sum(ray.get(refs, timeout=timeout)))
    except Exception as e:  # a metric read must not fail a step
        logger.warning("reading %s from the server actors %s failed: %r", fn.__name__, list(actor_handles), e)
        return None


def sum_dicts_on_actors(
    actor_handles: Mapping[str, Any], fn: Callable[[Any], Mapping[str, int]], timeout: float = 10.0
) -> dict[str, int] | None:
    """Per key, the sum of ``fn(actor_self)`` (a dict of counts) over the actors: metrics, so None (logged) when any
    actor does not answer."""
    import ray

    try:
        refs = [h.__ray_call__.remote(fn) for h in actor_handles.values()]
        totals: dict[str, int] = {}
        for counts in ray.get(refs, timeout=timeout):
            for key, value in counts.items():
                totals[key] = totals.get(key, 0) + int(value)
        return totals
    except Exception as e:  # a metric read must not fail a step
        logger.warning("reading %s from the server actors %s failed: %r", fn.__name__, list(actor_handles), e)
        return None


def actor_identity(actor_self: Any) -> tuple[str, str]:
    """Inside an actor: its Ray name (the class name when it has none) and its node's IP."""
    import ray

    name = None
    try:
        name = ray.get_runtime_context().get_actor_name()
    except Exception:  # older Ray, or not in an actor: a report is still useful without a name
        pass
    return name or type(actor_self).__name__, ray.util.get_node_ip_address()


def describe_actor(handle: Any) -> str:
    """A readable name for an actor handle (for error messages)."""
    try:  # private Ray attributes: only for a readable error message
        cls = handle._ray_actor_creation_function_descriptor.class_name
        return f"{cls}({handle._actor_id.hex()})"
    except Exception:
        return repr(handle)
