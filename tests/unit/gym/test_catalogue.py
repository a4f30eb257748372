"""Bundled Gym environments as Gym links them: the config and agent that declare an environment's example rows, and
those rows routed by the declaration (fake Gym trees, and Gym 0.7's own files where the Gym venv is installed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.gym.catalogue import BundledEnv, bundled_env, config_needs, declared_rows
from nemo_gym_adapter.runtime import paths

AGENT_YAML = """{agent}:
  responses_api_agents:
    {impl}:
      datasets:
      - name: example
        type: example
        jsonl_fpath: resources_servers/{env}/data/example.jsonl
"""


def _env_tree(root: Path, name: str, configs: dict[str, str], rows: list[dict] | None = None) -> Path:
    (root / "resources_servers" / name / "configs").mkdir(parents=True)
    (root / "resources_servers" / name / "data").mkdir()
    for fname, text in configs.items():
        (root / "resources_servers" / name / "configs" / fname).write_text(text)
    example = root / "resources_servers" / name / "data" / "example.jsonl"
    example.write_text("".join(json.dumps(r) + "\n" for r in rows or []))
    return root


def test_the_config_and_agent_that_declare_the_examples_are_found_whatever_their_names(tmp_path):
    # blackjack-like: configs/<env>.yaml exists, but its agent is not <env>_simple_agent
    _env_tree(tmp_path, "cards", {"cards.yaml": AGENT_YAML.format(agent="cards_gym_agent", impl="gymnasium_agent",
                                                                    env="cards")})  # fmt: skip
    b = bundled_env(tmp_path, "cards")
    assert (b.config, b.agent, b.agent_impl) == ("resources_servers/cards/configs/cards.yaml", "cards_gym_agent",
                                                 "gymnasium_agent")  # fmt: skip
    assert b.example == tmp_path / "resources_servers/cards/data/example.jsonl"
    # equivalence_rule-like: no configs/<env>.yaml at all; the config declaring the examples wins
    _env_tree(tmp_path, "duel", {"v2.yaml": "x: {}\n", "v3.yaml": AGENT_YAML.format(agent="v3", impl="simple_agent",
                                                                                    env="duel")})  # fmt: skip
    assert bundled_env(tmp_path, "duel").config == "resources_servers/duel/configs/v3.yaml"


def test_an_environment_without_declared_examples_names_its_configs_and_the_flags(tmp_path):
    _env_tree(tmp_path, "bare", {"a.yaml": "x: {}\n"})
    with pytest.raises(AdapterConfigError, match=r"none of \['a.yaml'\] declares .*--config-path.*--agent"):
        bundled_env(tmp_path, "bare")
    with pytest.raises(AdapterConfigError, match="no bundled Gym environment"):
        bundled_env(tmp_path, "ghost")


def test_rows_naming_another_agent_are_routed_by_the_declaration_line_for_line(tmp_path, caplog):
    # structured_outputs: its examples carry agent_ref structured_outputs_v4_simple_agent (another config's agent)
    rows = [
        {"responses_create_params": {"input": "a"}, "agent_ref": {"name": "old_agent"}},
        {"responses_create_params": {"input": "b"}, "agent_ref": "new_agent"},
        {"responses_create_params": {"input": "c"}},
    ]
    _env_tree(tmp_path, "so", {"so_json.yaml": AGENT_YAML.format(agent="new_agent", impl="simple_agent", env="so")},
              rows)  # fmt: skip
    env = bundled_env(tmp_path, "so")
    out = declared_rows(env, tmp_path / "run")
    assert out != env.example and "old_agent" in caplog.text  # rewritten, and said so
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert got[0] == {"responses_create_params": {"input": "a"}, "task_source": "new_agent"}  # as Gym's collate
    assert got[1:] == rows[1:]  # the others as they were, on the same lines
    fine = BundledEnv("so", env.config, "new_agent", "simple_agent", tmp_path / "fine.jsonl")
    fine.example.write_text("".join(json.dumps(r) + "\n" for r in rows[1:]))
    assert declared_rows(fine, tmp_path / "run") == fine.example  # nothing to re-route: the file itself


GYM_ROOT = next(paths.gym_venv().glob("lib/python3*/site-packages/resources_servers"), None)


@pytest.mark.skipif(GYM_ROOT is None, reason="needs the Gym venv (scripts/setup.sh)")
@pytest.mark.parametrize(
    ("name", "config", "agent"),
    [
        ("blackjack", "blackjack.yaml", "blackjack_gymnasium_agent"),
        ("equivalence_rule", "lc.yaml", "lc_equivalence_rule_simple_agent"),
        ("structured_outputs", "structured_outputs_json.yaml", "structured_outputs_simple_agent"),
        ("terminal_multi_harness", "terminal_multi_harness_codex.yaml", "terminal_multi_harness_codex_agent"),
        ("format_verification", "freeform_formatting.yaml", "freeform_formatting_simple_agent"),
        ("example_single_tool_call", "example_single_tool_call.yaml", "example_single_tool_call_simple_agent"),
        # its examples are declared only by Claude Code and Codex harness configs (keys, CLIs): its own simple agent
        ("reasoning_gym", "reasoning_gym.yaml", "reasoning_gym_simple_agent"),
    ],
)
def test_gyms_own_environments_resolve_as_gym_declares_them(name, config, agent):
    assert GYM_ROOT is not None
    b = bundled_env(GYM_ROOT.parent, name)
    assert (Path(b.config).name, b.agent) == (config, agent)


def test_the_agent_the_rows_name_breaks_ties_and_stands_in_for_a_missing_declaration(tmp_path):
    named = [{"responses_create_params": {"input": "a"}, "agent_ref": {"name": "b_agent"}}]
    two = {f"{x}.yaml": AGENT_YAML.format(agent=f"{x}_agent", impl="simple_agent", env="multi") for x in "ab"}
    _env_tree(tmp_path, "multi", two, named)  # terminal_multi_harness: several configs declare the examples
    assert bundled_env(tmp_path, "multi").agent == "b_agent"
    plain = "b_agent:\n  responses_api_agents:\n    simple_agent: {}\n"
    _env_tree(tmp_path, "undeclared", {"a.yaml": "x: {}\n", "b.yaml": plain}, named)  # format_verification
    assert (bundled_env(tmp_path, "undeclared").config, bundled_env(tmp_path, "undeclared").agent) == (
        "resources_servers/undeclared/configs/b.yaml",
        "b_agent",
    )


HARNESS_YAML = """{agent}:
  responses_api_agents:
    {impl}:
      model: {model}
      model_server: {{type: responses_api_models, name: policy_model}}
      datasets:
      - {{name: example, type: example, jsonl_fpath: resources_servers/{env}/data/example.jsonl}}
"""


def test_a_config_that_needs_something_from_outside_gives_way_to_one_that_needs_nothing(tmp_path):
    """reasoning_gym-like: the configs that declare the examples need a key nobody sets or a program that is not
    installed; the environment's own config (its simple agent, no declaration) can take the rows and needs nothing."""
    cli = tmp_path / "responses_api_agents" / "cli_agent"
    cli.mkdir(parents=True)
    (cli / "app.py").write_text('import subprocess\nsubprocess.run(["ngv-no-such-cli-xyz", "--version"])\n')
    configs = {
        "rg_harness.yaml": HARNESS_YAML.format(
            agent="rg_harness", impl="harness_agent", model="${vendor_model}", env="rg"
        ),
        "rg_cli.yaml": HARNESS_YAML.format(agent="rg_cli", impl="cli_agent", model="${policy_model_name}", env="rg"),
        "rg_env.yaml": HARNESS_YAML.format(agent="rg_env", impl="simple_agent", model="${oc.env:NGV_TOKEN}", env="rg"),
    }
    _env_tree(tmp_path, "rg", configs, [{"responses_create_params": {"input": "q"}}])
    root = tmp_path
    assert config_needs(root, root / "resources_servers/rg/configs/rg_harness.yaml") == [
        "external service: keys not defined (${vendor_model})"
    ]
    assert config_needs(root, root / "resources_servers/rg/configs/rg_cli.yaml") == [
        "programs not installed: ngv-no-such-cli-xyz (its agent runs them)"
    ]
    env_cfg = root / "resources_servers/rg/configs/rg_env.yaml"
    assert config_needs(root, env_cfg, environ={}) == ["external service: environment variables NGV_TOKEN"]
    assert config_needs(root, env_cfg, environ={"NGV_TOKEN": "x"}) == []
    # every declaring config needs something: the first one is kept, and what it needs is named
    b = bundled_env(root, "rg", environ={})
    assert (b.agent, b.needs) == ("rg_cli", ("programs not installed: ngv-no-such-cli-xyz (its agent runs them)",))
    assert bundled_env(root, "rg", environ={"NGV_TOKEN": "x"}).agent == "rg_env"  # declares, needs nothing
    (root / "resources_servers/rg/configs/rg.yaml").write_text(
        "rg_simple_agent:\n  responses_api_agents:\n    simple_agent: {}\n"
    )
    b = bundled_env(root, "rg", environ={})  # declares nothing, but the rows name no agent: it can take them
    assert (b.config, b.agent, b.needs) == ("resources_servers/rg/configs/rg.yaml", "rg_simple_agent", ())
