"""Network addresses across hosts: where each vLLM replica answers, where Gym listens, what an attached Gym calls.

Who calls whom (a Ray cluster of several nodes; see docs/CLUSTER.md)::

    rollout client (the trainer process that starts or attaches to Gym) --HTTP--> Gym's environment/agent servers
    Gym's agent and environment servers --HTTP--> each other and Gym's model server (same launcher, same host)
    Gym's model server (vllm_model) --HTTP--> every vLLM replica, at the address in Gym's ``policy_base_url``

So a replica's address must be its *own* host's (verl's server binds the node IP Ray gave its node, not loopback), and
Gym must listen where its callers are: a Gym the trainer starts is called only from the trainer's host -- the
replicas never call Gym -- so it listens on loopback unless told otherwise; a Gym that trainers on other hosts attach
to must listen on an address they can route to.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym_adapter.errors import AdapterConfigError, GymServerError, ServerError

LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and any loopback IP (127.0.0.0/8, ::1)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def local_addresses() -> set[str]:
    """Every IP address of this host's interfaces (in this network namespace)."""
    import psutil

    return {
        a.address.split("%")[0]
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family in (socket.AF_INET, socket.AF_INET6)
    }


def is_local(host: str, local: set[str] | None = None) -> bool:
    """True when ``host`` is this host: loopback or one of its interface addresses."""
    return is_loopback(host) or host.strip("[]") in (local if local is not None else local_addresses())


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets (how verl keys its replicas)."""
    host = host.strip("[]")
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def route_source_address(peer: str) -> str:
    """The local address the kernel would use to reach ``peer`` (no packet is sent): this host's address as ``peer``
    sees it, the right one to listen on for it when the host has several."""
    family = socket.AF_INET6 if ":" in peer.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((peer.strip("[]"), 9))
        return s.getsockname()[0]


# ------------------------------------------------------------------------------------------------ replicas


@dataclass(frozen=True)
class ReplicaEndpoint:
    """One vLLM replica's HTTP entry point: its server actor, the address it advertises, and the IP of the Ray node
    the actor runs on (``None`` if Ray did not say)."""

    actor: str
    host: str
    port: int
    node_ip: str | None = None

    @property
    def address(self) -> str:
        return host_port(self.host, self.port)

    @property
    def url(self) -> str:
        """What Gym's ``policy_base_url`` gets for this replica."""
        return f"http://{self.address}/v1"


def replica_endpoints(actors: Mapping[str, Any], timeout: float = 60.0) -> list[ReplicaEndpoint]:
    """The HTTP endpoint of each server actor (``get_server_address``) and the IP of the Ray node it runs on (from
    Ray's node table, not from the actor: a second source for :func:`check_replica_endpoints`). Actors without an
    HTTP address (non-zero node ranks of a multi-node replica) are skipped."""
    import logging

    import ray

    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    out = []
    for name, handle in actors.items():
        try:
            host, port = ray.get(handle.get_server_address.remote(), timeout=timeout)
        except Exception as e:  # a non-zero node rank of a multi-node replica serves no HTTP
            logging.getLogger(__name__).info("server actor %s has no HTTP address (%s); not a replica entry", name, e)
            continue
        node_id = ray.get(handle.__ray_call__.remote(_actor_node_id), timeout=timeout)
        out.append(ReplicaEndpoint(actor=name, host=str(host).strip("[]"), port=int(port), node_ip=nodes.get(node_id)))
    return out


def _actor_node_id(actor_self: Any) -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def check_replica_endpoints(endpoints: Sequence[ReplicaEndpoint], this_node_ip: str) -> list[str]:
    """Refuse replica addresses Gym could not reach; return warnings for merely unusual ones.

    A replica on another node that advertises a loopback address or this node's address points Gym's model server at
    the wrong host (``ServerError`` naming the actor, its node and the address); so do two replicas sharing one
    address. An address that differs from the node's IP otherwise (a hostname, a second interface) is a warning.
    """
    problems: list[str] = []
    warnings: list[str] = []
    seen: dict[str, str] = {}
    for ep in endpoints:
        if ep.address in seen:
            problems.append(f"{ep.actor} and {seen[ep.address]} both advertise {ep.address}")
        seen[ep.address] = ep.actor
        if ep.node_ip is None or ep.host == ep.node_ip:
            continue
        if ep.node_ip != this_node_ip and (is_loopback(ep.host) or ep.host == this_node_ip):
            problems.append(
                f"{ep.actor} runs on node {ep.node_ip} but advertises {ep.address} "
                f"({'loopback' if is_loopback(ep.host) else 'the address of this node, ' + this_node_ip})"
            )
        else:
            warnings.append(f"{ep.actor} runs on node {ep.node_ip} and advertises {ep.address}")
    if problems:
        raise ServerError(
            "vLLM replica addresses Gym could not reach:\n  " + "\n  ".join(problems) + "\nEach replica must advertise"
            " its own node's address (Ray's --node-ip-address of that node); check how its Ray node was started."
        )
    return warnings


# ------------------------------------------------------------------------------------------------ Gym's host


@dataclass(frozen=True)
class HostChoice:
    """Where Gym listens, and why (for the log)."""

    host: str
    reason: str


def choose_gym_host(
    explicit: str | None,
    callers: Iterable[str] = (),
    node_ip: str | None = None,
    replicas: Iterable[str] = (),
    local: set[str] | None = None,
) -> HostChoice:
    """Gym's bind host (its ``default_host`` and head server host): loopback unless a caller is on another host.

    ``callers``: hosts other than this one's own processes that will call Gym's servers (trainers attaching to it,
    rollout workers elsewhere); the process starting Gym and Gym's own servers are always on this host. ``node_ip``:
    this host's address for the others (required when a caller is remote). ``replicas``: the vLLM replicas' hosts,
    only for the reason: Gym calls them, they never call Gym, so they do not decide where it listens.
    ``explicit`` (``nemo_gym.host``) wins.
    """
    if explicit:
        return HostChoice(explicit, "set by nemo_gym.host")
    local = local if local is not None else local_addresses()
    remote = sorted({h for h in callers if not is_local(h, local)})
    if remote:
        if not node_ip or is_loopback(node_ip):
            raise AdapterConfigError(
                f"nemo_gym.host: Gym must be reachable from {remote} but this host's address is {node_ip!r}; "
                "set nemo_gym.host to an address those hosts can reach"
            )
        return HostChoice(node_ip, f"called from other hosts {remote}")
    elsewhere = sorted({h.strip("[]") for h in replicas if not is_local(h, local)})
    if elsewhere:
        why = (
            f"only this host calls Gym's servers; the vLLM replicas on {elsewhere} are called by Gym and never call "
            "it, so none of them needs to reach Gym"
        )
    else:
        why = "everything is on this host (trainer, Gym's servers, vLLM replicas)"
    return HostChoice(LOOPBACK, why)


def _norm_url(url: Any) -> str:
    url = str(url).strip().rstrip("/")
    url = url if "://" in url else f"http://{url}"
    return url if url.endswith("/v1") else f"{url}/v1"


def _urls(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else [str(u) for u in value] if isinstance(value, list) else []


def policy_urls(config: Mapping[str, Any]) -> list[str]:
    """Where a running Gym (its resolved global config) sends policy calls: ``policy_base_url`` (one string, as Gym's
    CLI and :mod:`~nemo_gym_adapter.gym.launch` set it, or a list) and every URL of each model server whose
    ``base_url`` includes it (given several replicas, the policy's model servers get the whole list), in order."""
    policy = _urls(config.get("policy_base_url"))
    out = dict.fromkeys(map(_norm_url, policy))
    for block in config.values():
        models = block.get("responses_api_models") if isinstance(block, Mapping) else None
        for server in models.values() if isinstance(models, Mapping) else ():
            urls = [_norm_url(u) for u in _urls(server.get("base_url") if isinstance(server, Mapping) else None)]
            if any(u in out for u in urls):
                out.update(dict.fromkeys(urls))
    return list(out)


def check_policy_urls(configured: Any, replica_urls: Sequence[str], head_url: str) -> None:
    """An attached Gym must send its model calls to this trainer's replicas, all of them and nothing else.

    ``configured``: the URLs the attached Gym calls for the policy (:func:`policy_urls`; a URL or a list). Raises
    ``GymServerError`` naming both lists and the fix otherwise (a Gym calling other servers would train on another
    model's rollouts).
    """
    got = _urls(configured)
    if sorted(map(_norm_url, got)) != sorted(map(_norm_url, replica_urls)):
        raise GymServerError(
            f"the Gym at {head_url} sends model calls to policy_base_url={got}, but this trainer's vLLM replicas are "
            f"{list(replica_urls)}; start that Gym with +policy_base_url=[{','.join(replica_urls)}]"
        )
