"""Gym's token-ID capture config as the adapter reads it (``nemo_gym_adapter.gym.capture``, issue 19)."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.errors import AdapterConfigError
from nemo_gym_adapter.gym.capture import capture_dir, retire


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({}, None),
        ({"token_id_capture": {"enabled": False, "dir": "/c"}}, None),
        ({"token_id_capture": {"enabled": True, "dir": "/c"}}, "/c"),
        ({"token_id_capture": {"enabled": True}, "model_call_capture_dir": "/m"}, "/m"),  # Gym's fallback
        ({"token_id_capture": {"enabled": True, "dir": "/c", "sink": "pkg:Sink"}}, None),  # not Gym's file store
        ({"token_id_capture": {"enabled": True, "dir": "/c", "external_staging": False}}, "/c"),
    ],
)
def test_capture_dir(config, expected):
    assert capture_dir(config) == expected


@pytest.mark.parametrize("enabled", [True, False])
def test_external_staging_is_refused_naming_the_key(enabled):
    config = {"token_id_capture": {"enabled": enabled, "external_staging": True, "dir": "/c"}}
    with pytest.raises(AdapterConfigError, match=r"token_id_capture\.external_staging"):
        capture_dir(config)


def test_retire_removes_only_the_named_rollouts_files(tmp_path):
    for rollout in ("a", "b"):
        for suffix in (".tokens.jsonl", ".tokens.intents", ".tokens.state.json", ".tokens.lock"):
            (tmp_path / f"{rollout}{suffix}").write_text("{}")
    assert retire(str(tmp_path), ["a", "missing"]) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"b.tokens.{s}" for s in ("jsonl", "intents", "state.json", "lock")
    )
    assert retire(None, ["b"]) == 0


def test_a_gyms_routes_carry_its_capture_dir_and_refuse_external_staging():
    """Through the head server, as the managers and ``collect`` build their routes (start-up)."""
    from nemo_gym_adapter.gym.head import GymHead
    from tests.support.fake_gym import FakeHeadServer, gym_config_for

    config = gym_config_for(("agent_a", "http://127.0.0.1:1"))
    config["token_id_capture"] = {"enabled": True, "dir": "/capture"}
    head = FakeHeadServer(config, instances=[])
    try:
        assert GymHead(head.url).routes().capture_dir == "/capture"
        head.config = {**config, "token_id_capture": {"enabled": True, "external_staging": True}}
        with pytest.raises(AdapterConfigError, match="external_staging"):
            GymHead(head.url).routes()
    finally:
        head.stop()
