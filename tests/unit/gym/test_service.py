"""``python -m nemo_gym_adapter.gym.service``: where a shared Gym listens is said, not guessed."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.gym.service import parse_args

BASE = ["--config-path", "a.yaml", "--policy-base-url", "http://10.0.0.2:8000/v1", "--policy-model-name", "/m"]


def test_either_the_attaching_hosts_or_an_explicit_host_is_required(capsys):
    with pytest.raises(SystemExit):
        parse_args(BASE)
    assert "--reachable-from" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args([*BASE, "--host", "0.0.0.0", "--reachable-from", "10.0.0.1"])


def test_repeated_flags_collect_every_replica_and_caller():
    args = parse_args(
        [
            *BASE,
            "--policy-base-url",
            "http://10.0.0.3:8000/v1",
            "--reachable-from",
            "10.0.0.1",
            "--reachable-from",
            "10.0.0.5",
            "--head-port",
            "11000",
        ]
    )
    assert args.policy_base_url == ["http://10.0.0.2:8000/v1", "http://10.0.0.3:8000/v1"]
    assert args.reachable_from == ["10.0.0.1", "10.0.0.5"] and args.head_port == 11000 and args.host is None
