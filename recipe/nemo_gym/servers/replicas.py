"""verl's rollout replicas as the manager finds them: their addresses and server actors behind verl's ``llm_client``,
the engine's token-ID patch inside each, the tokenizer ids the manager needs and the weight version each serves.

Steps 1-3 of :class:`~recipe.nemo_gym.managers.base.GymManagerBase`'s start-up (its module docstring); the engine (vLLM
or SGLang) is :mod:`recipe.nemo_gym.servers.engines`'s :class:`~recipe.nemo_gym.servers.engines.Engine`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import ray

from nemo_gym_adapter.access.guard import install_on_actors
from nemo_gym_adapter.access.key import RunKey
from nemo_gym_adapter.errors import AdapterError, ServerError
from nemo_gym_adapter.gym.addresses import ReplicaEndpoint, check_replica_endpoints, replica_endpoints
from nemo_gym_adapter.wire.policy import PROBE_TEXT
from recipe.nemo_gym.servers.engines import ENGINES, Engine

logger = logging.getLogger(__name__)


def find_replicas(llm_client: Any, engine: Engine = ENGINES["vllm"]) -> tuple[list[ReplicaEndpoint], dict[str, Any]]:
    """``([endpoint per replica], {actor name: handle})`` of the rollout servers behind ``llm_client``.

    Addresses come from verl's load balancer (what the trainer's own agent loop routes to). ``LLMServerClient``
    keeps its balancer handle private, so without one we fall back to the actors' own addresses. Handles are found
    by verl's actor names (``vllm_server_{replica}_{node}``, ``sglang_server_...``: ``engine.actor_prefix``; how
    verl's ServerAdapter finds them too).
    """
    balancer = getattr(llm_client, "_load_balancer", None)
    wanted = list(ray.get(balancer.get_all_servers.remote(), timeout=60)) if balancer is not None else None
    actors = engine.find_actors()
    if not actors:
        raise ServerError(
            f"no {engine.label} server actors ({engine.actor_prefix}*) in this Ray namespace: were the replicas "
            f"started? (actor_rollout_ref.rollout.name={engine.name})"
        )
    by_address = {ep.address: ep for ep in replica_endpoints(actors)}
    addresses = wanted if wanted is not None else sorted(by_address)
    unknown = [a for a in addresses if a not in by_address]
    if unknown or not addresses:
        raise ServerError(
            f"verl's load balancer lists replicas {addresses} but the server actors serve "
            f"{ {a: ep.actor for a, ep in by_address.items()} }: no actor for {unknown or 'any replica'}"
        )
    endpoints = [by_address[a] for a in addresses]
    # Each replica must advertise its own node's address: Gym (maybe on another host) calls exactly these.
    for warning in check_replica_endpoints(endpoints, ray.util.get_node_ip_address()):
        logger.warning("%s replica address: %s", engine.label, warning)
    return endpoints, {ep.actor: actors[ep.actor] for ep in endpoints}


def patch_replicas(
    handles: Mapping[str, Any],
    engine: Engine = ENGINES["vllm"],
    assistant_edits: str = "keep_ids",
    partial_rollouts: bool = True,
) -> list[Any]:
    """The engine's token-ID patch inside every server actor; a missing, hook-less or other-engine report is a
    ``ServerError``. Each report (``vllm.patch.PatchReport``, ``sglang.patch.PatchReport``) is logged: actor, pid,
    node, hook, engine and version."""
    reports = engine.apply_patch(handles, assistant_edits, partial_rollouts)  # ServerError naming a failing actor
    if len(reports) != len(handles):
        raise ServerError(f"token-ID patch: {len(reports)} reports for {len(handles)} actors {list(handles)}")
    for name, report in zip(handles, reports, strict=True):
        if not report.hook or report.backend != engine.name:
            raise ServerError(f"token-ID patch: actor {name} reported no {engine.label} hook ({report})")
        logger.info(
            "token-ID patch in %s (pid %d on %s): %s, %s %s",
            name,
            report.pid,
            report.node_ip,
            report.hook,
            engine.label,
            report.version,
        )
    return reports


def guard_replicas(handles: Mapping[str, Any], endpoints: Sequence[ReplicaEndpoint], key: RunKey) -> list[Any]:
    """The access guard with the run's ``key`` inside every server actor (``access.guard.install_on_actors``; the key
    unchanged where the vLLM plugin already installed it), then the proof: each replica must refuse ``GET /v1/models``
    without the key (401) -- a ``ServerError`` naming the replica otherwise. The key is never logged."""
    import urllib.error
    import urllib.request

    reports = install_on_actors(handles, key.value.get_secret_value())
    for ep in endpoints:
        url = f"{ep.url}/models"
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        except OSError as e:
            raise ServerError(f"rollout replica {ep.address} ({ep.actor}): GET {url} failed: {e}") from e
        if status != 401:
            raise ServerError(
                f"rollout replica {ep.address} ({ep.actor}) answered {status} to a request without the run's rollout "
                "key: the access guard is not in place (nemo_gym.access.require_key)"
            )
    logger.info("rollout replicas %s refuse requests without the run's key (%s)", [ep.address for ep in endpoints], key)
    return reports


def load_tokenizer(model_config: Any) -> tuple[Any, int | None]:
    """The tokenizer of verl's model config (``actor_rollout_ref.model``) and the model's embedding rows (its HF
    config's ``vocab_size``, or its ``text_config``'s; None when neither says): token ids outside are refused."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    hf = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
    config = hf.hf_config
    vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    return hf.tokenizer, int(vocab) if isinstance(vocab, int) and vocab > 0 else None


def tokenizer_ids(tokenizer: Any, model_path: str) -> tuple[int, list[int]]:
    """The pad id (EOS when the tokenizer has no pad) and the engine probe's token ids."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise AdapterError(f"actor_rollout_ref.model.path={model_path}: tokenizer has no pad/eos token")
    return int(pad), [int(t) for t in tokenizer.encode(PROBE_TEXT, add_special_tokens=False)]


def server_weight_version(server: Any) -> int | None:
    """Runs inside a rollout server actor (vLLM or SGLang): the ``global_steps`` verl's last weight sync set
    (``set_global_steps``, the same attribute on both of verl's servers)."""
    return getattr(server, "global_steps", None)


def weight_versions(handles: Mapping[str, Any], timeout: float = 60.0) -> list[int | None]:
    """:func:`server_weight_version` of each server actor; an actor that cannot answer (its node lost) is left out,
    logged: a weight-version stamp never fails a step."""
    refs = {name: h.__ray_call__.remote(server_weight_version) for name, h in handles.items()}
    out: list[int | None] = []
    for name, ref in refs.items():
        try:
            out.append(ray.get(ref, timeout=timeout))
        except (ray.exceptions.RayError, TimeoutError) as e:
            logger.warning("weight version of %s unreadable (left out): %r", name, e)
    return out


async def weight_versions_async(handles: Mapping[str, Any]) -> list[int | None]:
    """:func:`weight_versions` from an event loop."""
    answers = await asyncio.gather(
        *(h.__ray_call__.remote(server_weight_version) for h in handles.values()), return_exceptions=True
    )
    for name, answer in zip(handles, answers, strict=True):
        if isinstance(answer, BaseException):
            logger.warning("weight version of %s unreadable (left out): %r", name, answer)
    return [a for a in answers if not isinstance(a, BaseException)]
