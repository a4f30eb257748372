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
The live agent lookup for ``/run`` is the rollout client's job; this module gives the dataset and metrics one
stable name per row and rejects malformed routing up front.
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from typing import Any

from nemo_gym_adapter.errors import DatasetError


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
