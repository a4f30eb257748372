"""What a Gym's rows pass through (``nemo_gym_adapter.gym.probes.Topology``), from a hand-written Gym config.

The probes themselves are exercised against real servers in ``tests/integration/gym/test_server_down.py``; the policy
acting on their answers in ``tests/unit/gym/test_liveness.py`` (whose two-agent config this reuses).
"""

from __future__ import annotations

from nemo_gym_adapter.data.routing import GymRoutes
from nemo_gym_adapter.gym.probes import Topology
from tests.unit.gym.test_liveness import two_env_config


def test_topology_names_every_server_an_agents_rows_pass_through():
    config = two_env_config()
    top = Topology.from_gym(config, GymRoutes.from_config(config), head_host="10.9.9.9")
    assert top.needs["agent_a"] == ("agent_a_environment_server", "agent_a", "res_a", "policy")
    assert top.needs["agent_b"] == ("agent_b_environment_server", "agent_b", "policy")
    assert top.replicas == {"policy": ("10.0.0.1:8000", "10.0.0.2:8000")}
    assert top.servers["10.0.0.1:8000"].url == "http://10.0.0.1:8000/health"
    assert top.servers["policy"].url == "http://10.9.9.9:9400"  # a wildcard bind is reached on the head's host
    assert top.models_of("agent_b") == ["policy"]
