"""Where the run's processes listen: loopback when the whole run is on one host, the node's address otherwise.

Measured with ``ss -ltnp`` (docs/CLUSTER.md has the listings): a Ray 2.60 cluster started by ``ray.init`` binds its
GCS, raylet, workers' gRPC servers and dashboard agent on every interface (``*``/``0.0.0.0``) and the runtime-env
agent on the node's address, whatever ``_node_ip_address``/``--node-ip-address`` says (Ray rewrites 127.0.0.1 to the
node's address); everything that asks Ray for the node's address then binds that: verl's vLLM and SGLang servers
(``ray.util.get_node_ip_address()``), TransferQueue's ZMQ sockets, verl's torch.distributed master. One supported
setting narrows all of it: Ray's ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` (``ray/_private/ray_constants.py``: "whether
to enable Ray clusters (in addition to local Ray)"; the default on Windows and macOS is off) set to ``0`` makes Ray a
one-machine Ray: node address 127.0.0.1 and every Ray listener on loopback, so the servers that bind the node's
address bind loopback too. Ray then refuses a second node (``ray start --address`` aborts), which is exactly the
one-host case.

:func:`plan` decides, from what the driver knows before ``ray.init``:

* one host (``auto``): the recipe starts its own Ray (``ray_kwargs.ray_init.address: local``, or none set and no
  cluster to join), ``trainer.nnodes`` is 1 and no Gym on another host calls the replicas (``nemo_gym.head_url``
  unset or local) -> :data:`LOCAL_ONLY_ENV` for the driver and everything it starts (they inherit it);
* otherwise Ray's defaults (the node's address, Ray's own ports on every interface: Ray 2.60 has no setting for a
  multi-node cluster that narrows them) and Ray's token refuses other clients.

Gym's own Ray head (``gym.ray_head``) is always one machine: it gets :data:`LOCAL_ONLY_ENV` whatever the run's
topology.

Ray's metrics exporters (:func:`ray_exporters_env`): every Ray 2.60 cluster ``ray.init`` or ``ray start`` starts runs
four HTTP servers that answer *any* path, without Ray's token, with the cluster's Prometheus metrics -- each node's
dashboard agent (``metrics_export_port``), the dashboard process (44227, ``DASHBOARD_METRIC_PORT``; it runs even
with ``include_dashboard=False``, then without its web UI) and the autoscaler monitor (44217,
``AUTOSCALER_METRIC_PORT``) -- and, with ``include_dashboard`` unset where Ray's dashboard packages are installed,
the dashboard's web UI on 8265. Read-only, but to every user of the host, and a flood makes the dashboard agents stop
answering. A run that does not use them (``nemo_gym.access.ray_dashboard: false``, the default) starts every Ray it
owns -- the trainer's, Gym's -- without them: Ray's own switch for the agents' exporter
(``RAY_enable_metrics_collection=0``: the raylet starts each dashboard agent with ``--disable-metrics-collection``),
and for the two fixed-port ones, which have no switch, a port no socket can bind (:data:`NO_PORT`): each process logs
that its metrics server could not start (``monitor.log``, ``dashboard.log`` in Ray's session logs) and goes on
without it. The recipe also starts its Ray with ``include_dashboard=False``. And a Ray the recipe starts gets a token of its own (:func:`ray_token_env`): Ray 2.60's ``ray.init``
turns token auth on by default with ``~/.ray/auth_token``, written with the process umask (0644 under the usual
022: readable by every user who can enter the home directory); a per-run token in the environment is never written.
Pure: no Ray import.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from nemo_gym_adapter.errors import AdapterConfigError

LOCAL_ONLY_VAR = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
LOCAL_ONLY_ENV = {LOCAL_ONLY_VAR: "0"}
RAY_AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
LOCAL_ONLY_MODES = ("auto", "true", "false")
# Ray 2.60 reads both ports from the environment (ray/dashboard/consts.py, ray/autoscaler/_private/constants.py) and
# catches its own failure to bind them; 65536 is outside every port range, so the bind always fails the same way.
NO_PORT = "65536"
RAY_EXPORTERS_OFF_ENV = {
    "RAY_enable_metrics_collection": "0",  # the dashboard agents' exporter (raylet: --disable-metrics-collection)
    "DASHBOARD_METRIC_PORT": NO_PORT,  # the dashboard process's exporter
    "AUTOSCALER_METRIC_PORT": NO_PORT,  # the autoscaler monitor's exporter
}


@dataclass(frozen=True)
class ListenPlan:
    """Where the run listens (``local_only``: every process of the run on 127.0.0.1) and why, for the log; ``env``:
    what the driver sets in its own environment before ``ray.init`` (inherited by Ray and everything it starts)."""

    local_only: bool
    reason: str
    env: Mapping[str, str] = field(default_factory=dict)


def starts_own_ray(address: str | None, environ: Mapping[str, str], recorded_cluster: str | None) -> bool:
    """Does ``ray.init(address=address)`` start a new local cluster? ``local`` always does; no address does unless
    ``RAY_ADDRESS`` or a cluster recorded by ``ray start`` (``recorded_cluster``) names one to join."""
    if address == "local":
        return True
    if address not in (None, "", "auto"):
        return False
    return not environ.get("RAY_ADDRESS") and recorded_cluster is None


def plan(
    mode: str,
    *,
    own_ray: bool,
    nnodes: int,
    gym_elsewhere: str | None,
    environ: Mapping[str, str],
) -> ListenPlan:
    """The run's :class:`ListenPlan` (module docstring). ``mode``: ``nemo_gym.access.local_only`` (``auto``, ``true``
    or ``false``); ``gym_elsewhere``: the host of an attached Gym on another host, else None. ``true`` where the run
    cannot be on one host is an ``AdapterConfigError`` naming the key and the reason."""
    if mode not in LOCAL_ONLY_MODES:
        raise AdapterConfigError(f"nemo_gym.access.local_only={mode!r}: use auto, true or false")
    blockers = []
    if not own_ray:
        blockers.append("the run joins a Ray cluster it did not start (ray_kwargs.ray_init.address / RAY_ADDRESS)")
    if nnodes > 1:
        blockers.append(f"trainer.nnodes={nnodes}")
    if gym_elsewhere:
        blockers.append(f"the Gym at {gym_elsewhere} (nemo_gym.head_url) calls the replicas from another host")
    if mode == "false":
        return ListenPlan(False, "nemo_gym.access.local_only=false: Ray's defaults (your own network policy)")
    if blockers:
        if mode == "true":
            raise AdapterConfigError(
                "nemo_gym.access.local_only=true but the run spans hosts: " + "; ".join(blockers) + ". Use auto"
            )
        return ListenPlan(False, "several hosts: " + "; ".join(blockers) + "; Ray's token refuses other clients")
    if environ.get(LOCAL_ONLY_VAR, "0") not in ("0", "false", "False"):
        if mode == "true":
            raise AdapterConfigError(
                f"nemo_gym.access.local_only=true but {LOCAL_ONLY_VAR}={environ[LOCAL_ONLY_VAR]} is set in the environment"
            )
        return ListenPlan(False, f"{LOCAL_ONLY_VAR}={environ[LOCAL_ONLY_VAR]} set in the environment: Ray's defaults")
    return ListenPlan(True, "everything runs on this host: Ray and every server bind 127.0.0.1", dict(LOCAL_ONLY_ENV))


def ray_token_env(environ: Mapping[str, str]) -> dict[str, str]:
    """A per-run Ray token for a cluster the recipe starts (module docstring), unless you configured Ray's token
    auth yourself (any of :data:`RAY_AUTH_VARS` set): then ``{}``."""
    if any(v in environ for v in RAY_AUTH_VARS):
        return {}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def ray_exporters_env(environ: Mapping[str, str], enabled: bool = False) -> dict[str, str]:
    """What starts a Ray without its metrics exporters (module docstring), unless ``enabled``
    (``nemo_gym.access.ray_dashboard``) or a variable is set in ``environ`` already (yours wins)."""
    if enabled:
        return {}
    return {k: v for k, v in RAY_EXPORTERS_OFF_ENV.items() if k not in environ}
