"""Unit tests of ``agent_ref`` / ``task_source`` → environment name normalisation, and of ``GymRoutes``."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nemo_gym_adapter.data.routing import GymRoutes, agent_ref_name, env_name_of
from nemo_gym_adapter.errors import DatasetError, GymServerError
from tests.support.fake_gym import GYM_CONFIG, INSTANCES

NAMES = st.text(alphabet=st.characters(categories=["L", "N"], include_characters="_-."), min_size=1, max_size=40)


@given(NAMES)
def test_dict_and_string_agent_ref_normalise_to_the_same_name(name):
    assert env_name_of({"agent_ref": {"name": name}}) == env_name_of({"agent_ref": name}) == name


def test_agent_ref_dict_extras_are_ignored_and_row_not_modified():
    row = {"agent_ref": {"name": "weather_agent", "type": "responses_api_agents"}, "task_source": "other"}
    before = {"agent_ref": dict(row["agent_ref"]), "task_source": "other"}
    assert env_name_of(row) == "weather_agent"  # agent_ref wins over task_source, as in Gym
    assert row == before


def test_task_source_alone_mapped_or_verbatim():
    row = {"task_source": "example_single_tool_call"}
    assert env_name_of(row) == "example_single_tool_call"
    mapping = {"example_single_tool_call": "example_single_tool_call_simple_agent"}
    assert env_name_of(row, task_source_map=mapping) == "example_single_tool_call_simple_agent"


def test_null_agent_ref_falls_back_to_task_source():
    assert env_name_of({"agent_ref": None, "task_source": "self_contained_agent"}) == "self_contained_agent"


def test_default_only_when_nothing_routes():
    assert env_name_of({}, default="fallback") == "fallback"
    assert env_name_of({"agent_ref": "a"}, default="fallback") == "a"
    with pytest.raises(DatasetError, match=r"^d\.jsonl:9: row has neither agent_ref nor task_source"):
        env_name_of({}, where="d.jsonl:9")


def test_known_agents_with_suggestion():
    with pytest.raises(
        DatasetError, match=r"row: agent_ref names unknown agent 'math_agnt' \(did you mean 'math_agent'\?\)"
    ):
        env_name_of({"agent_ref": {"name": "math_agnt"}}, known_agents={"math_agent", "weather_agent"})
    with pytest.raises(DatasetError, match=r"task_source 'rs' → 'ghost'"):
        env_name_of({"task_source": "rs"}, known_agents={"math_agent"}, task_source_map={"rs": "ghost"})
    assert env_name_of({"task_source": "rs"}, known_agents={"a"}, task_source_map={"rs": "a"}) == "a"


@pytest.mark.parametrize(
    ("agent_ref", "message"),
    [
        ({}, "agent_ref must have a 'name' key, got keys []"),
        ({"nam": "a"}, "got keys ['nam'] (found 'nam': a typo?)"),
        ({"name": None}, "agent_ref.name must be a non-empty string, got NoneType None"),
        ({"name": "  "}, "agent_ref.name must be a non-empty string, got '  '"),
        (" a", "agent_ref has leading/trailing whitespace: ' a'"),
        (["a"], "agent_ref must be {'name': <agent>} or a string, got list"),
    ],
)
def test_malformed_agent_ref(agent_ref, message):
    with pytest.raises(DatasetError) as info:
        agent_ref_name(agent_ref, where="f.jsonl:3")
    assert str(info.value).startswith("f.jsonl:3: ") and message in str(info.value)


def test_malformed_task_source():
    with pytest.raises(DatasetError, match="task_source must be a non-empty string, got int 3"):
        env_name_of({"task_source": 3})
    with pytest.raises(DatasetError, match="task_source must be a non-empty string, got ''"):
        env_name_of({"task_source": ""})


# ------------------------------------------------------------------------------ GymRoutes: agent -> environment server


def test_routes_from_gym_config():
    routes = GymRoutes.from_config(GYM_CONFIG, INSTANCES, head_host="10.0.0.5")
    agent, route = routes.resolve({"agent_ref": {"name": "weather_simple_agent"}})
    # The row goes to the environment server fronting the agent, never to the agent's own port.
    assert (agent, route.server, route.run_url) == (
        "weather_simple_agent",
        "weather_environment_server",
        "http://10.0.0.5:9004/run",
    )
    # task_source naming the resources server resolves through the one agent that uses it.
    assert routes.resolve({"task_source": "weather"})[1].server == "weather_environment_server"
    assert routes.resolve({"task_source": "weather_simple_agent"})[0] == "weather_simple_agent"
    ambiguous = routes.resolve({"agent_ref": "twice"}, index=7)
    assert ambiguous.reason == "ambiguous_agent" and "env_1" in ambiguous.detail and "row 7" in ambiguous.detail
    assert routes.resolve({"task_source": "policy_model"}).reason == "unknown_agent"
    assert sorted(r.base_url for r in routes.servers_by_agent["twice"]) == [
        "http://10.0.0.5:9006",
        "http://10.0.0.7:9007",
    ]


def test_route_without_address_names_the_server():
    with pytest.raises(GymServerError, match="env_2"):
        GymRoutes.from_config(GYM_CONFIG)
