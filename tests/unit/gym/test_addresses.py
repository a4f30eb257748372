"""Replica addresses, Gym's bind host and the attached Gym's policy URLs (pure rules; the multi-host integration test
runs them across real hosts)."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.errors import AdapterConfigError, GymServerError, ServerError
from nemo_gym_adapter.gym.addresses import (
    LOOPBACK,
    ReplicaEndpoint,
    check_policy_urls,
    check_replica_endpoints,
    choose_gym_host,
    host_port,
    is_local,
    is_loopback,
    local_addresses,
    policy_urls,
    route_source_address,
)

HEAD = "10.0.0.1"
HERE = {HEAD, "127.0.0.1"}  # this host's interface addresses, as local_addresses() would return them


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("127.0.0.1", True),
        ("127.0.0.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("10.0.0.1", False),
        ("node-3", False),
        ("0.0.0.0", False),
    ],
)
def test_is_loopback(host, expected):
    assert is_loopback(host) is expected


def test_host_port_brackets_ipv6_like_verl():
    assert host_port("10.0.0.2", 8000) == "10.0.0.2:8000"
    assert host_port("fd00::2", 8000) == host_port("[fd00::2]", 8000) == "[fd00::2]:8000"
    ep = ReplicaEndpoint("vllm_server_0_0", "fd00::2", 8000, "fd00::2")
    assert ep.url == "http://[fd00::2]:8000/v1"


def test_local_addresses_include_loopback_and_route_source_is_local():
    local = local_addresses()
    assert "127.0.0.1" in local
    assert route_source_address("127.0.0.1") == "127.0.0.1"
    assert is_local("127.0.0.5", local) and not is_local("203.0.113.9", local)


# ------------------------------------------------------------------------------------------------ replica endpoints


def test_replicas_at_their_own_nodes_pass():
    eps = [
        ReplicaEndpoint("vllm_server_0_0", "10.0.0.2", 8000, "10.0.0.2"),
        ReplicaEndpoint("vllm_server_1_0", "10.0.0.3", 8000, "10.0.0.3"),
        ReplicaEndpoint("vllm_server_2_0", HEAD, 8001, HEAD),
    ]  # one on the trainer's own node: fine
    assert check_replica_endpoints(eps, this_node_ip=HEAD) == []


@pytest.mark.parametrize("advertised", [HEAD, "127.0.0.1", "localhost"])
def test_remote_replica_advertising_the_head_or_loopback_is_refused_naming_actor_and_node(advertised):
    eps = [
        ReplicaEndpoint("vllm_server_0_0", "10.0.0.2", 8000, "10.0.0.2"),
        ReplicaEndpoint("vllm_server_1_0", advertised, 8000, "10.0.0.3"),
    ]
    with pytest.raises(ServerError, match=r"vllm_server_1_0 runs on node 10\.0\.0\.3 but advertises") as e:
        check_replica_endpoints(eps, this_node_ip=HEAD)
    assert "vllm_server_0_0" not in str(e.value)


def test_loopback_nodes_of_one_machine_are_still_distinct_hosts():
    """The bed's fallback: hosts are 127.77.0.1..3 in one namespace; a replica of .2 at the head's is wrong."""
    ok = ReplicaEndpoint("vllm_server_0_0", "127.77.0.2", 8000, "127.77.0.2")
    assert check_replica_endpoints([ok], this_node_ip="127.77.0.1") == []
    with pytest.raises(ServerError, match="advertises 127.77.0.1:8000"):
        check_replica_endpoints([ReplicaEndpoint("vllm_server_0_0", "127.77.0.1", 8000, "127.77.0.2")], "127.77.0.1")


def test_two_replicas_sharing_an_address_are_refused():
    eps = [
        ReplicaEndpoint("vllm_server_0_0", "10.0.0.2", 8000, "10.0.0.2"),
        ReplicaEndpoint("vllm_server_1_0", "10.0.0.2", 8000, "10.0.0.2"),
    ]
    with pytest.raises(ServerError, match="vllm_server_1_0 and vllm_server_0_0 both advertise 10.0.0.2:8000"):
        check_replica_endpoints(eps, this_node_ip=HEAD)


def test_another_name_for_a_remote_node_is_only_a_warning():
    eps = [
        ReplicaEndpoint("vllm_server_0_0", "node-2.cluster", 8000, "10.0.0.2"),
        ReplicaEndpoint("vllm_server_1_0", "10.0.0.3", 8000, None),
    ]  # node unknown: nothing to compare
    (warning,) = check_replica_endpoints(eps, this_node_ip=HEAD)
    assert "vllm_server_0_0 runs on node 10.0.0.2 and advertises node-2.cluster:8000" == warning


# ------------------------------------------------------------------------------------------------ Gym's host


def test_gym_listens_on_loopback_when_everything_is_on_this_host():
    choice = choose_gym_host(None, node_ip=HEAD, replicas=[HEAD, "127.0.0.1"], local=HERE)
    assert choice.host == LOOPBACK and "everything is on this host" in choice.reason


def test_remote_replicas_do_not_move_gym_off_loopback_and_the_log_says_why():
    choice = choose_gym_host(None, node_ip=HEAD, replicas=["10.0.0.2", "10.0.0.3"], local=HERE)
    assert choice.host == LOOPBACK
    assert "['10.0.0.2', '10.0.0.3']" in choice.reason and "never call" in choice.reason


def test_gym_listens_on_the_host_address_when_another_host_calls_it():
    choice = choose_gym_host(None, callers=["10.0.0.7", HEAD], node_ip=HEAD, local=HERE)
    assert choice.host == HEAD and choice.reason == "called from other hosts ['10.0.0.7']"
    assert choose_gym_host(None, callers=["127.0.0.1", HEAD], node_ip=HEAD, local=HERE).host == LOOPBACK


def test_explicit_host_wins_and_an_unreachable_node_address_is_a_config_error():
    assert choose_gym_host("0.0.0.0", callers=["10.0.0.7"], node_ip=HEAD, local=HERE).host == "0.0.0.0"
    with pytest.raises(AdapterConfigError, match=r"nemo_gym.host: Gym must be reachable from \['10.0.0.7'\]"):
        choose_gym_host(None, callers=["10.0.0.7"], node_ip="127.0.0.1", local=HERE)


# ------------------------------------------------------------------------------------------------ attach


def test_attached_gym_must_call_exactly_these_replicas():
    replicas = ["http://10.0.0.2:8000/v1", "http://10.0.0.3:8000/v1"]
    check_policy_urls(["10.0.0.3:8000", "http://10.0.0.2:8000/v1/"], replicas, "http://10.0.0.9:11000")
    for wrong in (["http://10.0.0.2:8000/v1"], ["http://10.0.0.1:8000/v1", "http://10.0.0.3:8000/v1"], None):
        with pytest.raises(GymServerError, match=r"start that Gym with \+policy_base_url=\[http://10.0.0.2:8000/v1,"):
            check_policy_urls(wrong, replicas, "http://10.0.0.9:11000")


def test_the_policy_urls_of_a_gym_are_its_policy_base_url_and_the_model_servers_calling_it():
    two = ["http://10.0.0.2:8000/v1", "http://10.0.0.3:8000/v1"]
    ours = {  # what gym.launch writes for two replicas: one string, the list to the policy's model server
        "policy_base_url": two[0],
        "policy_model": {"responses_api_models": {"vllm_model": {"base_url": two}}},
        "judge_model": {"responses_api_models": {"vllm_model": {"base_url": "http://10.0.0.9:9000/v1"}}},
        "env": {"resources_servers": {"verifif": {"judge_base_url": two[0]}}},
    }
    assert policy_urls(ours) == two
    check_policy_urls(policy_urls(ours), two, "http://10.0.0.9:11000")
    gyms_cli = {"policy_base_url": ["10.0.0.2:8000", "10.0.0.3:8000"]}  # `+policy_base_url=[...]`, no model server
    assert policy_urls(gyms_cli) == two
    with pytest.raises(GymServerError, match="sends model calls to policy_base_url"):
        check_policy_urls(policy_urls(ours), [two[0]], "http://10.0.0.9:11000")
