"""The run's rollout key: one secret per training run, required by every rollout server, known to the run's clients.

Where it comes from: the driver generates it at start-up (:func:`generate`, 256 random bits), unless you chose one
in the environment variable :data:`ENV` (``NGV_ROLLOUT_API_KEY``: a Gym you run yourself and attach to must send the
same key, so you give both sides the same value). Never in the config (verl prints the whole config), argv (any user
sees another's with ``ps``), a log or a file: it lives in process memory, in the environment of our own processes
(``/proc/<pid>/environ`` is readable by the owner only) and in the Ray cluster's internal key-value store.

How it reaches the run's processes: the driver publishes it in Ray's internal KV, keyed by the Ray job (:func:`publish`,
right after ``ray.init``), before verl starts any worker; every process of the job reads it from there
(:func:`fetch`): the vLLM plugin inside each rollout server installs the guard with it before the server answers
(:mod:`nemo_gym_adapter.access.guard`), verl's SGLang weight-sync client sends it
(:mod:`nemo_gym_adapter.sglang.verl_client`), the manager hands it to Gym (``policy_api_key``, through Gym's
environment only) and to its own probes.
Anyone who can read Ray's KV can run code in the cluster anyway, so the KV adds no exposure Ray itself does not have;
Ray's token protects both (:mod:`nemo_gym_adapter.access.listen`). A process that finds no published key (a manager
built by a test, without the recipe's driver) makes one and publishes it itself (:func:`for_this_job`).

Clients send it as ``Authorization: Bearer <key>`` (:func:`bearer`), what every OpenAI client sends.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import threading
from dataclasses import dataclass
from typing import Literal

from pydantic import SecretStr

from nemo_gym_adapter.config import NemoGymConfig
from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.wire.policy import auth_headers as bearer

logger = logging.getLogger(__name__)

ENV = "NGV_ROLLOUT_API_KEY"  # a key you choose instead of a generated one (attach mode: your Gym sends it too)
KV_NAMESPACE = "nemo_gym_verl"
_KV_PREFIX = "rollout_key:"
Source = Literal["generated", "env"]
_LOCK = threading.Lock()
_CACHE: dict[str, RunKey] = {}  # job id -> the key this process found or made
_LOCAL = ""  # _CACHE's entry for a process without Ray (the key stays in this process)
__all__ = ["ENV", "RunKey", "bearer", "driver_key", "fetch", "for_this_job", "from_env", "generate", "policy_key"]


@dataclass(frozen=True)
class RunKey:
    """The run's key and where it came from (``generated`` here, or the user's ``env`` variable)."""

    value: SecretStr
    source: Source

    def __repr__(self) -> str:  # never the value
        return f"RunKey(<{len(self.value.get_secret_value())} chars>, source={self.source!r})"

    @property
    def header(self) -> dict[str, str]:
        """The request header every client of a rollout server sends."""
        return bearer(self.value)


def generate() -> RunKey:
    """A new key: 32 random bytes, URL-safe (43 characters)."""
    return RunKey(SecretStr(secrets.token_urlsafe(32)), "generated")


def from_env(environ: dict[str, str] | None = None) -> RunKey | None:
    """The key you chose in :data:`ENV`, or None. An empty or blank value is an error naming the variable (an empty
    key would let everyone in)."""
    value = (os.environ if environ is None else environ).get(ENV)
    if value is None:
        return None
    if not value.strip() or value != value.strip():
        raise AdapterConfigError(f"{ENV} is set but blank or padded with spaces: unset it (a key is then generated)")
    return RunKey(SecretStr(value), "env")


def driver_key(environ: dict[str, str] | None = None) -> RunKey:
    """The key a run starts with: :data:`ENV` when set, else a generated one."""
    return from_env(environ) or generate()


# ------------------------------------------------------------------------------------------------ Ray's KV


def _job_id() -> str:
    import ray

    return ray.get_runtime_context().get_job_id()


def _kv_name(job_id: str) -> bytes:
    return f"{_KV_PREFIX}{job_id}".encode()


def publish(key: RunKey) -> None:
    """Put ``key`` in Ray's internal KV for this process's job (a driver or worker of a connected Ray)."""
    from ray.experimental import internal_kv

    job = _job_id()
    payload = json.dumps({"key": key.value.get_secret_value(), "source": key.source}).encode()
    internal_kv._internal_kv_put(_kv_name(job), payload, overwrite=True, namespace=KV_NAMESPACE)
    with _LOCK:
        _CACHE[job] = key


def _connected() -> bool:
    """Is this process connected to a Ray cluster (a driver after ``ray.init``, or a worker)?"""
    import sys

    if "ray" not in sys.modules:  # never imported: not a Ray process
        return False
    import ray
    from ray.experimental import internal_kv

    return ray.is_initialized() and internal_kv._internal_kv_initialized()


def fetch() -> RunKey | None:
    """This job's published key, or None (no Ray here, or nothing published)."""
    if not _connected():
        return _CACHE.get(_LOCAL)
    from ray.experimental import internal_kv

    job = _job_id()
    with _LOCK:
        if job in _CACHE:
            return _CACHE[job]
    raw = internal_kv._internal_kv_get(_kv_name(job), namespace=KV_NAMESPACE)
    if raw is None:
        return None
    data = json.loads(raw)
    key = RunKey(SecretStr(data["key"]), data.get("source", "generated"))
    with _LOCK:
        _CACHE[job] = key
    return key


def unpublish() -> None:
    """Remove this job's key from Ray's KV (the run ends; Ray's KV outlives jobs on a shared cluster)."""
    if _connected():
        from ray.experimental import internal_kv

        job = _job_id()
        internal_kv._internal_kv_del(_kv_name(job), namespace=KV_NAMESPACE)
        with _LOCK:
            _CACHE.pop(job, None)


def for_this_job() -> RunKey:
    """The job's key: the published one (the recipe's driver published it), else :data:`ENV`'s or a generated one,
    published now so the job's other processes find the same (a manager a test builds directly). Without Ray, one
    key per process."""
    found = fetch()
    if found is not None:
        return found
    key = driver_key()
    if _connected():
        publish(key)
    else:  # no Ray: this process is the run (its servers get the key from it directly)
        with _LOCK:
            key = _CACHE.setdefault(_LOCAL, key)
    where = "published for this Ray job" if _connected() else "kept in this process"
    logger.info("rollout key: %s, %s", "from " + ENV if key.source == "env" else "generated", where)
    return key


def post_init_publisher(key: RunKey) -> object:
    """A function for Ray's post-``ray.init`` hooks that publishes ``key`` as soon as the driver is connected (before
    verl creates its first actor); named so a second ``run`` in one process replaces it."""

    def publish_rollout_key() -> None:
        publish(key)

    publish_rollout_key.__qualname__ = "ngv_publish_rollout_key"
    return publish_rollout_key


# ------------------------------------------------------------------------------------------------ the recipe's


def rollout_key(gym: NemoGymConfig) -> RunKey | None:
    """The run's key for a ``nemo_gym:`` section: this job's (:func:`for_this_job`) with
    ``nemo_gym.access.require_key`` (the default), None without. Attached to a Gym you run (``nemo_gym.head_url``),
    the key must be one you chose (:data:`ENV`), for your Gym to send it too: a generated one is an
    ``AdapterConfigError`` naming both ways out."""
    if not gym.access.require_key:
        return None
    key = for_this_job()
    if gym.head_url is not None and key.source != "env":
        raise AdapterConfigError(attach_error(gym.head_url))
    return key


def attach_error(head_url: str) -> str:
    """Why a generated key cannot work with an attached Gym, and the two ways out."""
    return (
        f"nemo_gym.head_url={head_url}: the Gym you attach to must send this run's rollout key to the replicas, and a "
        f"key generated here is known to no one else. Choose one: set {ENV} on the trainer's driver and the same on "
        "the Gym service (python -m nemo_gym_adapter.gym.service reads it), or set nemo_gym.access.require_key=false "
        "if your own network policy keeps other clients out (docs/CLUSTER.md)"
    )


def policy_key(gym: NemoGymConfig) -> SecretStr:
    """What Gym's model server sends the replicas (``policy_api_key``): the run's key (:func:`rollout_key`), else
    ``nemo_gym.policy_api_key``."""
    key = rollout_key(gym)
    return key.value if key is not None else gym.policy_api_key
