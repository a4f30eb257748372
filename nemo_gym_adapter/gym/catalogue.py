"""NeMo Gym's bundled environments as Gym itself links them: which config to start and which agent runs the rows.

Gym 0.7 links rows to an agent by a *declaration*, not by a naming rule: an agent's config lists the datasets it runs
(``<agent>: {responses_api_agents: {<impl>: {datasets: [{jsonl_fpath: ...}]}}}``), and Gym's collate step routes every
row of a declared file to the declaring agent (it strips a row's legacy ``agent_ref`` and stamps ``task_source`` =
the declaring instance, warning once per file: ``nemo_gym/train_data_utils.py``). Of Gym 0.7's runnable stock
environments, 7 have no ``configs/<env>.yaml`` and 16 no agent called ``<env>_simple_agent``; one
(``structured_outputs``) ships example rows whose ``agent_ref`` names an agent of another config.

* :func:`bundled_env`: ``resources_servers/<name>``'s config (``<name>.yaml`` first) whose agent declares its
  ``data/example.jsonl``, and that agent -- what ``collect --env <name>`` starts. A config that needs something this
  machine does not give it (:func:`config_needs`: a key nobody sets, an API, a program not installed) gives way to
  one that needs nothing: another config declaring the rows, else one whose agent can take them (they name no agent,
  or this one); when every candidate needs something, the declaring one is kept and its needs are named;
* :func:`config_needs`: what a config needs from outside: ``${key}`` interpolations no config defines, unset
  ``${oc.env:VAR}``, servers referenced and not defined (a judge, a user model), model servers of an external API or
  at a remote URL, a sandbox, a program its agent runs that is not installed (Gym 0.7's ``reasoning_gym`` declares its
  examples only for Claude Code and Codex harnesses: ``${anthropic_model_name}`` or the ``claude``/``codex`` CLIs);
* :func:`declared_rows`: that file as Gym's collate would hand it out (rows naming another agent re-routed to the
  declaring one, with a warning), written next to the caller's other run files only when a row needs it.

Reads Gym's files only (never imports ``nemo_gym``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_gym_adapter.errors import AdapterConfigError

logger = logging.getLogger(__name__)

TASK_SOURCE_KEY = "task_source"  # Gym 0.7's routing stamp: the declaring instance (routing.env_name_of reads it)
SERVER_TYPES = ("resources_servers", "responses_api_agents", "responses_api_models", "environment_servers")
# Keys Gym's global config defines (policy_* from the adapter's launch spec), never "needed" from the user.
GYM_KEYS = frozenset(
    {"policy_base_url", "policy_api_key", "policy_model_name", "default_host", "head_server", "uv_venv_dir"}
)
EXTERNAL_MODEL_IMPLS = {
    "openai_model": "an external API", "azure_openai_model": "an external API", "litellm_model": "an external API",
    "inference_provider": "an external API", "switchyard_model": "an external API",
    "local_vllm_model": "a local vLLM (GPU, hub download)", "local_vllm_model_proxy": "a local vLLM (GPU, hub download)",
    "genrm_model": "a local vLLM (GPU, hub download)",
}  # fmt: skip
_INTERP = re.compile(r"\$\{([^{}]+)\}")
# argv[0] as a literal in an agent's code: subprocess.run(["claude", ...]), create_subprocess_exec("codex", ...).
_PROGRAM = re.compile(
    r"""(?:subprocess\.(?:run|Popen|call|check_call|check_output)\(\s*\[|create_subprocess_exec\()\s*["']([\w.+-]+)["']"""
)


@dataclass(frozen=True)
class BundledEnv:
    """A bundled Gym environment as its own config declares it: the config to start (Gym-relative), the agent
    instance that declares ``data/example.jsonl`` and its implementation, and that file."""

    name: str
    config: str
    agent: str
    agent_impl: str
    example: Path
    needs: tuple[str, ...] = ()  # what the config needs from outside (config_needs); () when nothing


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


def bundled_env(gym_root: Path, name: str, environ: Mapping[str, str] | None = None) -> BundledEnv:
    """Resolve a bundled environment from ``resources_servers/<name>/configs/*.yaml`` (``<name>.yaml`` first, then by
    file name). Candidates, in order: the configs one of whose agents declares
    ``resources_servers/<name>/data/example.jsonl`` (the agent the example rows name first, when several declare it:
    ``terminal_multi_harness``); the configs that define the agent the rows name (``format_verification``, where no
    config declares the file); when the rows name no agent, every agent of every config (``reasoning_gym``, whose
    declaring configs all need an external harness). The first candidate that needs nothing from outside
    (:func:`config_needs`, ``environ`` for ``${oc.env:...}``: default ``os.environ``) wins; when every one needs
    something, the first, with its needs in ``BundledEnv.needs`` (the caller names them).

    Raises:
        AdapterConfigError: no such environment, or no candidate (naming the configs found and what takes over:
            ``collect --config-path`` with ``--agent``).
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
        defined += [(path, agent, impl) for agent, impl in _agents(data) if not named or agent in named]
    ranked = sorted(declared, key=lambda c: c[1] not in named)  # stable: config order within each
    candidates = list(dict.fromkeys(ranked + defined))  # defined: agents that can take the rows
    if not candidates:
        raise AdapterConfigError(
            f"--env {name}: none of {[p.name for p in configs]} declares {example} for an agent or defines the agent "
            f"its rows name; start one with --config-path resources_servers/{name}/configs/<config>.yaml and name the "
            "agent for rows without agent_ref with --agent"
        )
    needs = {c: tuple(config_needs(gym_root, c[0], environ=environ)) for c in candidates}
    path, agent, impl = next((c for c in candidates if not needs[c]), candidates[0])
    return BundledEnv(
        name, str(path.relative_to(gym_root)), agent, impl, gym_root / example, needs[(path, agent, impl)]
    )


def load_config_tree(gym_root: Path, path: Path) -> dict[str, Any]:
    """One Gym config merged over the configs it includes (``config_paths``, Gym-relative), as Gym merges them."""
    merged: dict[str, Any] = {}
    for _, data in reversed(_config_files(gym_root, path)):
        merged = {**merged, **data}
    return merged


def _config_files(gym_root: Path, path: Path, seen: set[Path] | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(text, parsed data) of ``path`` and of every config it includes, transitively, the includer first."""
    import yaml

    seen = seen if seen is not None else set()
    seen.add(path)
    text = path.read_text()
    data = yaml.safe_load(text) or {}
    data = data if isinstance(data, dict) else {}
    out = [(text, data)]
    for inc in data.get("config_paths") or []:
        inc_path = gym_root / str(inc)
        if inc_path.is_file() and inc_path not in seen:
            out += _config_files(gym_root, inc_path, seen)
    return out


def config_needs(gym_root: Path, path: Path, *, environ: Mapping[str, str] | None = None) -> list[str]:
    """What the Gym config at ``path`` needs from outside this machine and Gym (one line each; ``[]``: nothing).

    Read from the config and what it includes, never run: servers it references that no config defines (other than
    the policy), ``${key}`` interpolations nobody defines (Gym's own keys aside), ``${oc.env:VAR}`` without a default
    whose ``VAR`` is not in ``environ`` (default ``os.environ``; ``{}``: every one counts), a sandbox provider, a
    description saying it is not a standalone server, model servers of an external API or at a remote URL, and the
    programs its agents run (a literal ``argv[0]`` in their code) that are neither on ``PATH`` nor in Gym's venv.
    """
    environ = os.environ if environ is None else environ
    text = "\n".join(t for t, _ in _config_files(gym_root, path))
    data = load_config_tree(gym_root, path)
    needs: list[str] = []
    instances = {n for n, v in data.items() if isinstance(v, dict) and set(v) & set(SERVER_TYPES)}
    refs = {v["name"] for v in _walk_dicts(data) if v.get("type") in SERVER_TYPES and isinstance(v.get("name"), str)}
    missing = sorted(refs - instances - {"policy_model", "???"})  # ???: OmegaConf's MISSING, filled by the includer
    if missing:
        needs.append(f"external service: servers not defined ({', '.join(missing)})")
    keys = {e.strip() for e in _INTERP.findall(text)}
    undefined = sorted(
        k for k in keys if ":" not in k and not k.startswith("oc.") and k not in data and k not in GYM_KEYS
    )
    if undefined:
        needs.append("external service: keys not defined (" + ", ".join(f"${{{k}}}" for k in undefined) + ")")
    required_env = sorted(k[len("oc.env:") :] for k in keys if k.startswith("oc.env:") and "," not in k)
    unset = [v for v in required_env if v not in environ]
    if unset:
        needs.append(f"external service: environment variables {', '.join(unset)}")
    if "sandbox_provider" in text or "sandbox_config" in text:
        needs.append("needs a container/sandbox runtime (sandbox_provider in its config)")
    if re.search(r"description:.*not a standalone server", text, re.I):
        needs.append("a base class, not a standalone server (its config says so)")
    for name, block in data.items():
        models = block.get("responses_api_models") if isinstance(block, dict) else None
        for impl, body in models.items() if isinstance(models, dict) else ():
            if impl in EXTERNAL_MODEL_IMPLS:
                needs.append(f"external service: model server {name} is {EXTERNAL_MODEL_IMPLS[impl]}")
            url = body.get("base_url") if isinstance(body, dict) else None
            for u in [url] if isinstance(url, str) else url if isinstance(url, list) else []:
                if isinstance(u, str) and u.startswith("http") and not re.match(r"https?://(127\.|localhost)", u):
                    needs.append(f"external service: model server {name} at {u}")
    programs = sorted({p for _, impl in _agents(data) for p in _programs(gym_root / "responses_api_agents" / impl)})
    venv_bin = (
        gym_root.parents[2] / "bin" if len(gym_root.parents) > 2 else gym_root
    )  # <venv>/lib/python3.x/site-packages
    search = os.pathsep.join([str(venv_bin), environ.get("PATH", os.defpath)])
    absent = [p for p in programs if shutil.which(p, path=search) is None]
    if absent:
        needs.append(f"programs not installed: {', '.join(absent)} (its agent runs them)")
    return needs


def _programs(impl_dir: Path) -> set[str]:
    """Programs an agent implementation runs by name (a literal ``argv[0]`` in its code; tests left out)."""
    found: set[str] = set()
    for src in impl_dir.glob("*.py") if impl_dir.is_dir() else ():
        found |= set(_PROGRAM.findall(src.read_text(errors="replace")))
    return found


def _walk_dicts(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        return [node, *(d for v in node.values() for d in _walk_dicts(v))]
    if isinstance(node, list):
        return [d for v in node for d in _walk_dicts(v)]
    return []


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
