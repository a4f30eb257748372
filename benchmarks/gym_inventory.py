#!/usr/bin/env python
"""Which of NeMo Gym 0.7's stock resources servers can run here, read from their files alone (no import, no install).

Used by ``benchmarks/gym_catalogue.py`` (the catalogue sweep) for its list of candidates and, for every environment that
cannot run on a CPU machine without network, keys or containers, the first reason it cannot. Per
``resources_servers/<env>`` it reads:

* ``data/example.jsonl``: rows, rows with image/audio input (a multimodal policy), rows without
  ``responses_create_params`` (materialized task rows);
* every ``configs/*.yaml`` (and the configs they include): agents and the datasets they declare, servers referenced
  but not defined (a judge or user model that is not the policy), ``${key}`` interpolations nobody defines, required
  ``${oc.env:VAR}``, ``sandbox_provider``, model servers of an external API, a local vLLM or a literal remote URL,
  a description saying "not a standalone server";
* the requirements of the resources server and of the agent and environment server the config uses (not on PyPI:
  git/URL/local; ``nemo-gym[sandbox]``; torch/vllm/tensorflow/jax);
* the entrypoint and the local modules it imports (``ast``): containers/sandboxes, network at run time, downloads at
  start (hub, ``load_dataset``, ``nltk.download``), with a hand-read allow-list (:data:`NETWORK_OK`).

The config judged for an environment: ``gym.catalogue.bundled_env``'s (what ``collect --env`` starts) when it is
runnable, else the best other one (declares the examples, defines the agent the rows name, fewest external
references, ``<env>.yaml``). The sweep is the ground truth; what only running finds (an empty PyPI package, a
download inside a library at start, data files not shipped) is in its output, not here.

    .venv/bin/python benchmarks/gym_inventory.py [--json inventory.json]      # a summary; the records as JSON
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nemo_gym_adapter.gym import server_venvs  # noqa: E402
from nemo_gym_adapter.gym.catalogue import bundled_env, config_needs, load_config_tree  # noqa: E402

# Network hits read by hand and found harmless for the example rows (server: why).
NETWORK_OK = {
    "toolsandbox": "only its RapidAPI search tools reach the network (they need RAPID_API_KEY); the sweep runs offline",
    "image_tools": "requests.get only for http image refs; the example rows carry data: URLs",
    "verifif": "https://api.openai.com is only a default when no judge URL is set (its config sets one)",
}
KEYWORDS: dict[str, list[str]] = {
    "container": [r"\bdocker\b", r"apptainer", r"singularity", r"\bpodman\b", r"\be2b\b", r"daytona", r"opensandbox",
                  r"sandbox_client", r"SandboxProvider", r"\bkubernetes\b", r"wait_for_sandbox", r"sandbox_host",
                  r"NEMO_SKILLS_SANDBOX"],
    "network": [r"urlopen\(", r"requests\.(get|post)\(", r"https://(?!github\.com/NVIDIA)[a-z0-9.-]+\.[a-z]{2,}/",
                r"tavily", r"serpapi", r"google_search", r"playwright"],
    "download": [r"snapshot_download", r"hf_hub_download", r"load_dataset\(", r"from_pretrained\(", r"nltk\.download",
                 r"spacy\.load", r"git clone"],
}  # fmt: skip
HEAVY = ("torch", "torchvision", "vllm", "tensorflow", "jax")


@dataclass
class EnvRecord:
    """One stock resources server: the config and agent to run it with, and whether it can run here (and why not)."""

    env: str
    config: str = ""
    agent: str = ""
    agent_impl: str = ""
    env_server_impl: str = ""
    example_rows: int = 0
    requirements: list[str] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)
    via_env: bool = False  # the config is what `collect --env <env>` starts (else --config-path/--data/--agent)

    @property
    def runnable(self) -> bool:
        return not self.blockers

    @property
    def reason(self) -> str:
        return " | ".join(self.blockers)


def _scan(files: list[Path], root: Path, name: str) -> list[str]:
    """``<category>: <file>:<match>`` keyword hits in the code (comments and docstrings left out)."""
    hits = []
    for path in files:
        text = "\n".join(x for x in path.read_text(errors="replace").splitlines() if not x.lstrip().startswith("#"))
        text = re.sub(r"(?s)\"\"\".*?\"\"\"", "", text)
        for category, patterns in KEYWORDS.items():
            if category != "container" and name in NETWORK_OK:
                continue
            for pattern in patterns:
                m = re.search(pattern, text, flags=re.IGNORECASE)
                if m:
                    hits.append(f"{category}: {path.relative_to(root)}:{m.group(0)[:40]}")
    return hits


def _sources(server_dir: Path, entry: str) -> list[Path]:
    """The entrypoint and the local modules it imports, transitively (never tests)."""
    todo, seen = [server_dir / entry], []
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.append(path)
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" if node.module else a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            prefix = f"{server_dir.parent.name}.{server_dir.name}."
            for name in filter(None, names):
                rel = Path(*(name[len(prefix) :] if name.startswith(prefix) else name).split("."))
                if not rel.name:
                    continue
                for cand in (server_dir / rel.with_suffix(".py"), server_dir / rel / "__init__.py"):
                    if cand.is_file() and "tests" not in cand.relative_to(server_dir).parts:
                        todo.append(cand)
    return seen


def _config_blockers(root: Path, path: Path, env: str) -> tuple[list[str], dict]:
    """(why this config cannot run here, its parsed data merged with what it includes): ``gym.catalogue.config_needs``
    -- what ``collect --env`` ranks configs by -- with no environment variable set (the sweep runs without keys)."""
    return config_needs(root, path, environ={"PATH": os.defpath}), load_config_tree(root, path)


def _impl_blockers(root: Path, rel: str, entry: str) -> tuple[list[str], list[str]]:
    """(why this server implementation cannot run here, its PyPI requirements)."""
    server_dir = root / rel
    if not server_dir.is_dir():
        return [f"{rel} is not shipped"], []
    try:
        reqs = server_venvs.read_requirements(server_dir)
    except FileNotFoundError:
        reqs = []
    raw = (server_dir / "requirements.txt").read_text() if (server_dir / "requirements.txt").exists() else ""
    blockers = []
    non_pypi = [r for r in reqs if "git+" in r or re.match(r"^(https?://|\.|/)", r) or " @ " in r]
    if non_pypi:
        blockers.append(f"requirements not on PyPI ({server_dir.name}): {'; '.join(non_pypi)}")
    if "nemo-gym[sandbox]" in raw.replace("_", "-"):
        blockers.append(f"needs a container/sandbox runtime (nemo-gym[sandbox], {server_dir.name})")
    heavy = [r for r in reqs if server_venvs.canonical(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) in HEAVY]
    if heavy:
        blockers.append(f"heavy requirements ({server_dir.name}): {'; '.join(heavy)}")
    hits = _scan(_sources(server_dir, entry), server_dir, server_dir.name)
    if any(h.startswith("container") for h in hits):
        blockers.append(
            f"needs a container/sandbox runtime ({'; '.join(h for h in hits if h.startswith('container'))})"
        )
    net = [h for h in hits if not h.startswith("container")]
    if net:
        blockers.append(f"network at start or run ({server_dir.name}): {'; '.join(net[:3])}")
    return blockers, [r for r in reqs if r not in non_pypi]


def _example_blockers(example: Path) -> tuple[list[str], int]:
    if not example.is_file():
        return ["no data/example.jsonl"], 0
    lines = [x for x in example.read_text(encoding="utf-8-sig").splitlines() if x.strip()]
    media = sum(bool(re.search(r'"type":\s*"input_(image|audio|file)"|"data:(image|audio)/', x)) for x in lines)
    tasks = sum('"responses_create_params"' not in x for x in lines)
    blockers = [f"multimodal rows ({media}/{len(lines)} carry image/audio input): needs a vision/audio policy"] * bool(
        media
    )
    if tasks:
        blockers.append(f"{tasks} materialized task rows (no responses_create_params): the adapter refuses them")
    return blockers, len(lines)


def _candidates(root: Path, env: str) -> list[tuple[Path, str, str]]:
    """(config, agent, impl) to judge, in order: bundled_env's (what ``collect --env`` starts), then every agent of
    every config (``<env>.yaml`` first) that the example rows can reach: one they name, or any when they name none."""
    import yaml

    from nemo_gym_adapter.gym.catalogue import _row_agents

    out = []
    try:
        b = bundled_env(root, env)
        out.append((root / b.config, b.agent, b.agent_impl))
    except Exception:  # noqa: BLE001 -- no config declares the examples: judged from the others
        pass
    named = _row_agents(root / "resources_servers" / env / "data" / "example.jsonl")
    for path in sorted((root / "resources_servers" / env / "configs").glob("*.yaml"), key=lambda p: p.stem != env):
        data = yaml.safe_load(path.read_text()) or {}
        for name, block in data.items():
            agents = block.get("responses_api_agents") if isinstance(block, dict) else None
            for impl in agents if isinstance(agents, dict) else ():
                if not named or name in named:
                    out.append((path, str(name), str(impl)))
    return list(dict.fromkeys(out))


def analyse(root: Path, env: str) -> EnvRecord:
    """The record of one environment (see the module docstring)."""
    example_blockers, n_rows = _example_blockers(root / "resources_servers" / env / "data" / "example.jsonl")
    candidates = _candidates(root, env)
    if not candidates:
        return EnvRecord(env, example_rows=n_rows, blockers=["no agent in its configs (benchmark or resources only)"])
    best: EnvRecord | None = None
    for i, (path, agent, impl) in enumerate(candidates):
        rec = EnvRecord(env, str(path.relative_to(root)), agent, impl, example_rows=n_rows, via_env=i == 0)
        cfg_blockers, data = _config_blockers(root, path, env)
        env_servers = sorted(
            {i for v in data.values() if isinstance(v, dict) for i in v.get("environment_servers", {})}
        )
        rec.env_server_impl = ",".join(env_servers)
        entry = next((str(b.get("entrypoint")) for v in data.values() if isinstance(v, dict)
                      for b in (v.get("resources_servers") or {}).values() if isinstance(b, dict) and b.get("entrypoint")),
                     "app.py")  # fmt: skip
        rec.blockers = example_blockers + cfg_blockers
        for rel, e in [(f"resources_servers/{env}", entry), (f"responses_api_agents/{impl}", "app.py")] + [
            (f"environment_servers/{s}", "app.py") for s in env_servers
        ]:
            more, reqs = _impl_blockers(root, rel, e)
            rec.blockers += more
            rec.requirements += [r for r in reqs if r not in rec.requirements]
        rec.blockers = list(dict.fromkeys(rec.blockers))
        if rec.runnable:
            return rec
        best = best or rec
    assert best is not None
    return best


def inventory(root: Path) -> list[EnvRecord]:
    """Every stock resources server under Gym's package root ``root``."""
    envs = sorted(p.name for p in (root / "resources_servers").iterdir() if (p / "configs").is_dir())
    return [analyse(root, env) for env in envs]


def main(argv: list[str] | None = None) -> int:
    from nemo_gym_adapter.gym.launch import gym_package_root
    from nemo_gym_adapter.runtime import paths

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write every record as JSON")
    args = ap.parse_args(argv)
    records = inventory(gym_package_root(paths.gym_venv()))
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "reason": r.reason} for r in records], indent=1))
    runnable = [r for r in records if r.runnable]
    print(
        f"{len(records)} stock resources servers: {len(runnable)} candidates, {len(records) - len(runnable)} cannot run here"
    )
    for reason, n in Counter(
        r.blockers[0].split(":")[0].split(" (")[0] for r in records if not r.runnable
    ).most_common():
        print(f"  {n:3d}  {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
