"""NeMo Gym's bundled environments as Gym itself links them: which config to start and which agent runs the rows.

Gym 0.7 links rows to an agent by a *declaration*, not by a naming rule: an agent's config lists the datasets it runs
(``<agent>: {responses_api_agents: {<impl>: {datasets: [{jsonl_fpath: ...}]}}}``), and Gym's collate step routes every
row of a declared file to the declaring agent (it strips a row's legacy ``agent_ref`` and stamps ``task_source`` =
the declaring instance, warning once per file: ``nemo_gym/train_data_utils.py``). Of Gym 0.7's runnable stock
environments, 7 have no ``configs/<env>.yaml`` and 16 no agent called ``<env>_simple_agent``; one
(``structured_outputs``) ships example rows whose ``agent_ref`` names an agent of another config.

* :func:`bundled_env`: ``resources_servers/<name>``'s config (``<name>.yaml`` first) whose agent declares its
  ``data/example.jsonl``, and that agent -- what ``collect --env <name>`` starts;
* :func:`declared_rows`: that file as Gym's collate would hand it out (rows naming another agent re-routed to the
  declaring one, with a warning), written next to the caller's other run files only when a row needs it.

Reads Gym's files only (never imports ``nemo_gym``).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym_adapter.errors import AdapterConfigError

logger = logging.getLogger(__name__)

TASK_SOURCE_KEY = "task_source"  # Gym 0.7's routing stamp: the declaring instance (routing.env_name_of reads it)


@dataclass(frozen=True)
class BundledEnv:
    """A bundled Gym environment as its own config declares it: the config to start (Gym-relative), the agent
    instance that declares ``data/example.jsonl`` and its implementation, and that file."""

    name: str
    config: str
    agent: str
    agent_impl: str
    example: Path


def declaring_agents(data: Any, jsonl_fpath: str) -> list[tuple[str, str]]:
    """``(agent instance, implementation)`` of every agent in one parsed Gym config that declares ``jsonl_fpath``."""
    found = []
    for instance, block in data.items() if isinstance(data, dict) else ():
        agents = block.get("responses_api_agents") if isinstance(block, dict) else None
        for impl, body in agents.items() if isinstance(agents, dict) else ():
            datasets = body.get("datasets") if isinstance(body, dict) else None
            declared = [d.get("jsonl_fpath") for d in datasets or [] if isinstance(d, dict)]
            if jsonl_fpath in declared:
                found.append((str(instance), str(impl)))
    return found


def bundled_env(gym_root: Path, name: str) -> BundledEnv:
    """Resolve a bundled environment from ``resources_servers/<name>/configs/*.yaml`` (``<name>.yaml`` first, then by
    file name): the first config one of whose agents declares ``resources_servers/<name>/data/example.jsonl``,
    preferring the agent the example rows name when several declare it (``terminal_multi_harness``); when no config
    declares the file, the config that defines the agent its rows name (``format_verification``).

    Raises:
        AdapterConfigError: no such environment, or neither rule finds a config (naming the configs found and what
            takes over: ``collect --config-path`` with ``--agent``).
    """
    import yaml

    env_dir = gym_root / "resources_servers" / name
    configs = sorted((env_dir / "configs").glob("*.yaml"), key=lambda p: (p.stem != name, p.name))
    if not configs:
        raise AdapterConfigError(f"--env {name}: no bundled Gym environment {env_dir}/configs/*.yaml")
    example = f"resources_servers/{name}/data/example.jsonl"
    named = _row_agents(gym_root / example)
    declared: list[tuple[Path, str, str]] = []
    defined: list[tuple[Path, str, str]] = []
    for path in configs:
        data = yaml.safe_load(path.read_text()) or {}
        declared += [(path, agent, impl) for agent, impl in declaring_agents(data, example)]
        defined += [(path, agent, impl) for agent, impl in _agents(data) if agent in named]
    ranked = sorted(declared, key=lambda c: c[1] not in named) or defined  # stable: config order within each
    if ranked:
        path, agent, impl = ranked[0]
        return BundledEnv(name, str(path.relative_to(gym_root)), agent, impl, gym_root / example)
    raise AdapterConfigError(
        f"--env {name}: none of {[p.name for p in configs]} declares {example} for an agent or defines the agent its "
        f"rows name; start one with --config-path resources_servers/{name}/configs/<config>.yaml and name the agent "
        "for rows without agent_ref with --agent"
    )


def _agents(data: Any) -> list[tuple[str, str]]:
    """``(agent instance, implementation)`` of every agent one parsed Gym config defines."""
    found = []
    for instance, block in data.items() if isinstance(data, dict) else ():
        agents = block.get("responses_api_agents") if isinstance(block, dict) else None
        found += [(str(instance), str(impl)) for impl in agents] if isinstance(agents, dict) else []
    return found


def _row_agents(example: Path) -> set[str]:
    """The agents the rows of ``example`` name (``agent_ref``), if it exists."""
    names: set[str] = set()
    for line in example.read_text(encoding="utf-8-sig").splitlines() if example.is_file() else []:
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue
        named = _named_agent(row) if isinstance(row, dict) else None
        if named:
            names.add(named)
    return names


def declared_rows(env: BundledEnv, out_dir: Path) -> Path:
    """``env.example`` routed the way Gym's collate routes a declared dataset: every row to ``env.agent``.

    Rows that already name that agent (or carry no routing) are left as they are, and then so is the file (returned
    unchanged, so errors keep naming it). A row whose ``agent_ref`` or ``task_source`` names another agent loses it
    and gets ``task_source: <env.agent>``, as Gym does (with one warning per file); the file is then rewritten under
    ``out_dir`` line for line, so ``file:line`` in any later error still points at the same row."""
    lines = env.example.read_text(encoding="utf-8-sig").splitlines()
    rerouted: Counter[str] = Counter()
    out: list[str] = []
    for line in lines:
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            row = None  # the row check names it, with its line
        named = _named_agent(row) if isinstance(row, dict) else None
        if isinstance(row, dict) and named is not None and named != env.agent:
            rerouted[named] += 1
            row = {k: v for k, v in row.items() if k != "agent_ref"} | {TASK_SOURCE_KEY: env.agent}
            line = json.dumps(row)
        out.append(line)
    if not rerouted:
        return env.example
    logger.warning(
        "%s: %d row(s) name %s; routed to %s, the agent %s declares the file for (as Gym's collate does: routing "
        "comes from the config's declaration)",
        env.example, sum(rerouted.values()), sorted(rerouted), env.agent, env.config,
    )  # fmt: skip
    target = out_dir / env.name / "example.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(out) + "\n")
    return target


def _named_agent(row: dict[str, Any]) -> str | None:
    ref = row.get("agent_ref")
    if isinstance(ref, dict):
        ref = ref.get("name")
    if isinstance(ref, str):
        return ref
    source = row.get(TASK_SOURCE_KEY)
    return source if isinstance(source, str) else None
