"""Where the run listens: loopback exactly when the whole run is on one host, and a Ray token of its own."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.access import listen
from nemo_gym_adapter.errors import AdapterConfigError


@pytest.mark.parametrize(
    ("address", "environ", "recorded", "own"),
    [
        ("local", {"RAY_ADDRESS": "10.0.0.1:6379"}, "10.0.0.1:6379", True),
        (None, {}, None, True),
        (None, {"RAY_ADDRESS": "10.0.0.1:6379"}, None, False),
        (None, {}, "127.0.0.1:6379", False),  # a `ray start` on this machine: ray.init() would join it
        ("auto", {}, None, True),
        ("10.0.0.1:6379", {}, None, False),
    ],
)
def test_starts_own_ray(address, environ, recorded, own):
    assert listen.starts_own_ray(address, environ, recorded) is own


def test_one_host_is_local_only_with_rays_one_machine_mode():
    plan = listen.plan("auto", own_ray=True, nnodes=1, gym_elsewhere=None, environ={})
    assert plan.local_only and plan.env == {listen.LOCAL_ONLY_VAR: "0"}


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"own_ray": False}, "did not start"),
        ({"nnodes": 2}, "trainer.nnodes=2"),
        ({"gym_elsewhere": "10.0.0.4"}, "10.0.0.4"),
    ],
)
def test_several_hosts_keep_rays_defaults_and_true_names_why_it_cannot(kw, fragment):
    args = {"own_ray": True, "nnodes": 1, "gym_elsewhere": None, "environ": {}, **kw}
    plan = listen.plan("auto", **args)
    assert not plan.local_only and not plan.env and fragment in plan.reason
    with pytest.raises(AdapterConfigError, match=f"nemo_gym.access.local_only=true.*{fragment}"):
        listen.plan("true", **args)


def test_false_and_a_users_own_setting_are_respected():
    off = listen.plan("false", own_ray=True, nnodes=1, gym_elsewhere=None, environ={})
    assert not off.local_only and not off.env
    users = listen.plan("auto", own_ray=True, nnodes=1, gym_elsewhere=None, environ={listen.LOCAL_ONLY_VAR: "1"})
    assert not users.local_only and "set in the environment" in users.reason
    with pytest.raises(AdapterConfigError, match="local_only"):
        listen.plan("sometimes", own_ray=True, nnodes=1, gym_elsewhere=None, environ={})


def test_a_ray_the_recipe_starts_gets_its_own_token_unless_you_configured_one():
    a, b = listen.ray_token_env({}), listen.ray_token_env({})
    assert a["RAY_AUTH_MODE"] == "token" and len(a["RAY_AUTH_TOKEN"]) == 64 and a != b
    for var in listen.RAY_AUTH_VARS:
        assert listen.ray_token_env({var: "x"}) == {}


def test_rays_metrics_exporters_are_off_unless_asked_for_and_a_users_own_setting_wins():
    off = listen.ray_exporters_env({})
    assert off == {
        "RAY_enable_metrics_collection": "0",
        "DASHBOARD_METRIC_PORT": "65536",
        "AUTOSCALER_METRIC_PORT": "65536",
    }
    assert listen.ray_exporters_env({}, enabled=True) == {}  # nemo_gym.access.ray_dashboard: Ray's defaults
    assert "DASHBOARD_METRIC_PORT" not in listen.ray_exporters_env({"DASHBOARD_METRIC_PORT": "9999"})


def test_the_port_that_turns_rays_fixed_port_exporters_off_is_one_no_socket_binds():
    """What Ray's monitor and dashboard do with :data:`listen.NO_PORT` (``prometheus_client.start_http_server``, inside
    their own ``try``): the bind fails, nothing listens. The control: port 0 binds (an ephemeral port)."""
    import socket

    with pytest.raises(OverflowError), socket.socket() as s:
        s.bind(("127.0.0.1", int(listen.NO_PORT)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        assert s.getsockname()[1] > 0
