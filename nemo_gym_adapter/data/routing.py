"""A Gym row's routing fields → one environment (agent) name.

Gym 0.7 rows name where they run in one of two ways (``nemo_gym/rollout_collection.py``,
``nemo_gym/train_data_utils.py``):

* ``agent_ref``: ``{"name": "<agent instance>", ...}`` or, in older/hand-written data, the bare string;
* ``task_source``: written by Gym 0.7's collate step, which *strips* ``agent_ref`` and stamps the name of the
  config instance that declared the dataset: normally a resources server (``example_single_tool_call``), or the
  agent itself for self-contained environments. Gym resolves it to an agent at dispatch time from the running
  config (a dataset ``agent:`` pin, the declaring agent, or the unique agent using that resources server).

Precedence is Gym's: ``agent_ref.name`` first, then ``task_source``. Without the running Gym config, a
``task_source`` can only be mapped through an explicit ``task_source_map`` (``{instance: agent}``); otherwise the
instance name itself is the environment name (exact for self-contained agents, a stable grouping key otherwise).
This module gives the dataset and metrics one stable name per row and rejects malformed routing up front
(:func:`env_name_of`), and -- once a Gym runs -- maps each agent to the environment server whose ``/run`` serves it
(:class:`GymRoutes`, what Gym 0.7's own collector computes): an environment server fronts every agent its config
references (Gym 0.7 puts an auto ``legacy_agent`` relay in front of any agent without one); its host and port come
from the head server's ``/global_config_dict_yaml``, with ``/server_instances`` as a fallback. Reading those two is
:class:`nemo_gym_adapter.gym.head.GymHead`'s (the one reader of a head server); this module only computes.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_gym_adapter.errors import DatasetError, GymServerError

# Why a row cannot be routed (also the rollout client's failure reasons for such rows).
UNKNOWN_AGENT = "unknown_agent"
AMBIGUOUS_AGENT = "ambiguous_agent"


def _suggest(name: str, known: Collection[str]) -> str:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _clean_name(value: Any, *, path: str, where: str) -> str:
    if not isinstance(value, str):
        raise DatasetError(f"{where}: {path} must be a non-empty string, got {type(value).__name__} {value!r}")
    if not value.strip():
        raise DatasetError(f"{where}: {path} must be a non-empty string, got {value!r}")
    if value != value.strip():
        # Gym matches names exactly; a stray space would route nowhere at run time.
        raise DatasetError(f"{where}: {path} has leading/trailing whitespace: {value!r}")
    return value


def agent_ref_name(agent_ref: Any, *, where: str = "row") -> str:
    """The agent name of an ``agent_ref`` in either form: ``{"name": "a"}`` → ``"a"``, ``"a"`` → ``"a"``.

    Raises:
        DatasetError: not a dict with a non-empty string ``name`` nor a non-empty string; names ``where``.
    """
    if isinstance(agent_ref, Mapping):
        if "name" not in agent_ref:
            close = difflib.get_close_matches("name", [str(k) for k in agent_ref], n=1)
            raise DatasetError(
                f"{where}: agent_ref must have a 'name' key, got keys {sorted(map(str, agent_ref))}"
                + (f" (found {close[0]!r}: a typo?)" if close else "")
            )
        return _clean_name(agent_ref["name"], path="agent_ref.name", where=where)
    if isinstance(agent_ref, str):
        return _clean_name(agent_ref, path="agent_ref", where=where)
    raise DatasetError(
        f"{where}: agent_ref must be {{'name': <agent>}} or a string, got {type(agent_ref).__name__} {agent_ref!r}"
    )


def env_name_of(
    row: Mapping[str, Any],
    *,
    where: str = "row",
    task_source_map: Mapping[str, str] | None = None,
    known_agents: Collection[str] | None = None,
    default: str | None = None,
) -> str:
    """The one environment (agent) name a Gym row routes to.

    Args:
        row: the dataset row (a mapping; not modified).
        where: context for error messages, e.g. ``"train.jsonl:12"``.
        task_source_map: ``{task_source: agent}`` from the Gym config, when known.
        known_agents: when given, the result must be one of these (typos are reported with a suggestion).
        default: name for rows with neither ``agent_ref`` nor ``task_source`` (Gym's ``+agent_name``).

    Returns:
        ``agent_ref``'s name; else the mapped ``task_source``; else the ``task_source`` itself; else ``default``.

    Raises:
        DatasetError: malformed ``agent_ref``/``task_source``, no routing at all, or a name not in ``known_agents``.
    """
    agent_ref = row.get("agent_ref")
    task_source = row.get("task_source")
    if agent_ref is not None:
        name = agent_ref_name(agent_ref, where=where)
        path = "agent_ref"
    elif task_source is not None:
        source = _clean_name(task_source, path="task_source", where=where)
        name = (task_source_map or {}).get(source, source)
        path = "task_source"
    elif default is not None:
        name, path = default, "default agent"
    else:
        raise DatasetError(
            f"{where}: row has neither agent_ref nor task_source, so it cannot be routed to an environment; "
            "add agent_ref: {'name': <agent>} (or re-collate with Gym 0.7 to get task_source), or configure a "
            "default agent"
        )
    if known_agents is not None and name not in known_agents:
        via = f" (task_source {task_source!r} → {name!r})" if path == "task_source" and name != task_source else ""
        hint = (
            "; map it with task_source_map={<task_source>: <agent>}"
            if path == "task_source" and name == task_source
            else ""
        )
        raise DatasetError(
            f"{where}: {path} names unknown agent {name!r}{via}{_suggest(name, known_agents)}; "
            f"known agents: {sorted(known_agents)}{hint}"
        )
    return name


@dataclass(frozen=True)
class Unroutable:
    """Why a row has no route: ``reason`` is ``unknown_agent`` or ``ambiguous_agent``; ``detail`` names the row."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Route:
    """Where an agent's rows go: the environment server (top-level config instance ``server``) fronting it."""

    server: str
    base_url: str

    @property
    def run_url(self) -> str:
        return f"{self.base_url}/run"


class GymRoutes:
    """Agent name → the environment server serving its ``/run``; built once per Gym, shared by every batch.

    Mirrors Gym 0.7's collector: an environment server fronts every agent its config references (fields whose
    value has ``type: responses_api_agents``, or ``agent_server`` without a type); a row routed by agent needs
    exactly one such server. ``task_source`` names the instance that declared the row's dataset: an agent
    itself, or a resources server whose dataset pins an ``agent:`` or that exactly one agent uses.
    ``capture_dir``: where Gym's token-ID capture files are, for the client to retire (``gym.capture``; None: off).
    """

    def __init__(
        self,
        servers_by_agent: Mapping[str, Sequence[Route]],
        task_sources: Mapping[str, str],
        capture_dir: str | None = None,
    ) -> None:
        self.servers_by_agent = {agent: tuple(routes) for agent, routes in servers_by_agent.items()}
        self.task_sources = dict(task_sources)
        self.capture_dir = capture_dir

    @classmethod
    def from_config(
        cls,
        global_config: Mapping[str, Any],
        server_instances: Sequence[Mapping[str, Any]] = (),
        head_host: str = "127.0.0.1",
    ) -> GymRoutes:
        """Build from Gym's global config dict and (optionally) the head server's ``/server_instances`` list."""
        instance_urls = {
            str(inst.get("process_name") or inst.get("config_path")): inst.get("url")
            for inst in server_instances
            if isinstance(inst, Mapping) and inst.get("url")
        }
        blocks = {str(name): block for name, block in global_config.items() if isinstance(block, Mapping)}
        servers_by_agent: dict[str, list[Route]] = {}
        for name, block in blocks.items():
            for inner in _inner_configs(block, "environment_servers"):
                route = Route(name, _base_url(name, inner, instance_urls.get(name), head_host))
                for field_name, ref in inner.items():
                    is_agent_ref = isinstance(ref, Mapping) and (
                        ref.get("type") == "responses_api_agents"
                        or (field_name == "agent_server" and not ref.get("type"))
                    )
                    if is_agent_ref and ref.get("name"):
                        servers_by_agent.setdefault(str(ref["name"]), []).append(route)
        return cls(servers_by_agent, _task_source_agents(blocks))

    @property
    def agents(self) -> list[str]:
        return sorted(self.servers_by_agent)

    def resolve(self, row: Mapping[str, Any], index: int = -1) -> tuple[str, Route] | Unroutable:
        """``(agent, route)`` for a row, or a failure record saying why it cannot be routed.

        The agent comes from :func:`routing.env_name_of` (``agent_ref`` first, then ``task_source`` through this
        Gym's map), so the dataset, the metrics and dispatch agree on one name per row.
        """
        try:
            agent = env_name_of(row, where=f"row {index}", task_source_map=self.task_sources)
        except DatasetError as e:
            return Unroutable(UNKNOWN_AGENT, f"{e} (agents: {self.agents})")
        routes = self.servers_by_agent.get(agent, ())
        if not routes:
            return Unroutable(
                UNKNOWN_AGENT,
                f"row {index}: agent {agent!r} is not fronted by any environment server of this Gym "
                f"(agents: {self.agents})",
            )
        if len(routes) > 1:
            names = sorted(r.server for r in routes)
            return Unroutable(AMBIGUOUS_AGENT, f"row {index}: agent {agent!r} is fronted by several servers {names}")
        return agent, routes[0]


def _inner_configs(block: Mapping[str, Any], server_type: str) -> list[Mapping[str, Any]]:
    """The implementation configs under ``<instance>.<server_type>.<impl>`` (normally exactly one)."""
    servers = block.get(server_type)
    if not isinstance(servers, Mapping):
        return []
    return [inner for inner in servers.values() if isinstance(inner, Mapping)]


def _base_url(name: str, inner: Mapping[str, Any], instance_url: str | None, head_host: str) -> str:
    host, port = inner.get("host"), inner.get("port")
    if port:
        # A wildcard bind address is not something to connect to: the server is on the head's machine.
        host = head_host if host in (None, "", "0.0.0.0", "::") else host
        return f"http://{host}:{port}"
    if instance_url:
        return str(instance_url).rstrip("/")
    raise GymServerError(f"environment server {name!r}: no host/port in the Gym config and no /server_instances url")


def _task_source_agents(blocks: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """task_source (declaring instance) → agent, for every instance that resolves to exactly one agent."""
    uses: dict[str, list[str]] = {}  # resources server → agents that use it
    for name, block in blocks.items():
        for inner in _inner_configs(block, "responses_api_agents"):
            ref = inner.get("resources_server")
            if isinstance(ref, Mapping) and ref.get("name"):
                uses.setdefault(str(ref["name"]), []).append(name)
    resolved: dict[str, str] = {}
    for name, block in blocks.items():
        if _inner_configs(block, "responses_api_agents"):
            resolved[name] = name
            continue
        for inner in _inner_configs(block, "resources_servers"):
            pins = {d["agent"] for d in inner.get("datasets") or [] if isinstance(d, Mapping) and d.get("agent")}
            candidates = sorted(pins) if pins else uses.get(name, [])
            if len(candidates) == 1:
                resolved[name] = str(candidates[0])
    return resolved
