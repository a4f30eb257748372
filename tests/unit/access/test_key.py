"""The run's rollout key: where it comes from, that it is never shown, and what an attached Gym needs. (Its
publication through Ray's KV runs in tests/integration/recipe/test_agent_loop_manager.py, with real Ray.)"""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from nemo_gym_adapter.access import key as access_key
from nemo_gym_adapter.config import NemoGymConfig
from nemo_gym_adapter.errors import AdapterConfigError


def test_generated_keys_are_long_random_and_never_shown():
    a, b = access_key.generate(), access_key.generate()
    value = a.value.get_secret_value()
    assert a.source == "generated" and len(value) >= 43 and a.value != b.value
    assert value not in repr(a) and value not in str(a) and value not in f"{a}"
    assert a.header == {"Authorization": f"Bearer {value}"}


def test_a_key_chosen_in_the_environment_wins():
    chosen = access_key.driver_key({access_key.ENV: "my-key"})
    assert (chosen.value.get_secret_value(), chosen.source) == ("my-key", "env")
    assert access_key.driver_key({}).source == "generated"


@pytest.mark.parametrize("value", ["", "   ", " padded "])
def test_a_blank_or_padded_key_is_refused_naming_the_variable(value):
    with pytest.raises(AdapterConfigError, match=access_key.ENV):
        access_key.from_env({access_key.ENV: value})


def test_without_ray_one_key_per_process(monkeypatch):
    monkeypatch.delenv(access_key.ENV, raising=False)
    monkeypatch.setattr(access_key, "_CACHE", {})
    monkeypatch.setattr(access_key, "_connected", lambda: False)
    first = access_key.for_this_job()
    assert access_key.for_this_job() is first and access_key.fetch() is first


def _gym(**kw) -> NemoGymConfig:
    return NemoGymConfig.model_validate({"config_paths": ["a.yaml"], **kw})


def test_policy_key_is_the_run_key_or_the_configured_one(monkeypatch):
    monkeypatch.setattr(access_key, "_CACHE", {access_key._LOCAL: access_key.RunKey(SecretStr("k"), "generated")})
    monkeypatch.setattr(access_key, "_connected", lambda: False)
    assert access_key.policy_key(_gym()).get_secret_value() == "k"
    off = _gym(access={"require_key": False}, policy_api_key="sk-x")
    assert access_key.rollout_key(off) is None and access_key.policy_key(off).get_secret_value() == "sk-x"


def test_attaching_with_a_generated_key_is_refused_naming_both_ways_out(monkeypatch):
    monkeypatch.setattr(access_key, "_CACHE", {access_key._LOCAL: access_key.generate()})
    monkeypatch.setattr(access_key, "_connected", lambda: False)
    attached = NemoGymConfig.model_validate({"head_url": "http://10.0.0.4:11000"})
    with pytest.raises(AdapterConfigError) as info:
        access_key.rollout_key(attached)
    assert access_key.ENV in str(info.value) and "require_key=false" in str(info.value)
    monkeypatch.setattr(access_key, "_CACHE", {access_key._LOCAL: access_key.RunKey(SecretStr("mine"), "env")})
    assert access_key.rollout_key(attached).value.get_secret_value() == "mine"
