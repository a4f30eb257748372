"""Unit tests of the trajectory's types (``nemo_gym_adapter.rollouts.trajectory``): ``TrajectoryConfig``'s checks."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.rollouts.trajectory import TrajectoryConfig


def test_config_errors_name_the_key():
    with pytest.raises(AdapterConfigError, match=r"trajectory\.contiguity='drop'"):
        TrajectoryConfig(prompt_length=4, response_length=4, contiguity="drop")  # type: ignore[arg-type]
    with pytest.raises(AdapterConfigError, match=r"trajectory\.response_length=0"):
        TrajectoryConfig(prompt_length=4, response_length=0)


def test_verifier_error_policies_must_name_agents_of_the_running_gym():
    policy = TrajectoryConfig(
        prompt_length=8, response_length=8, verifier_errors={"_default": "mask", "env_a": "reward0"}
    )
    policy.check_envs(["env_a", "env_b"])
    with pytest.raises(AdapterConfigError, match=r"verifier_errors: \['env_x'\] name no agent .*\['env_a'\]"):
        TrajectoryConfig(prompt_length=8, response_length=8, verifier_errors={"env_x": "reward0"}).check_envs(["env_a"])
