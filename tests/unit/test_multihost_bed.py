"""The multi-host bed's pure parts (the bed itself runs in tests/integration/gym/test_multihost*.py)."""

from __future__ import annotations

from tests.support.hostnet import _NAME, Host, Leftovers


def test_a_host_in_a_namespace_runs_commands_through_ip_netns_exec():
    assert Host(2, "10.77.0.2", "ngv42h2").command(["ray", "start"]) == [
        "ip",
        "netns",
        "exec",
        "ngv42h2",
        "ray",
        "start",
    ]
    assert Host(1, "10.77.0.1", None).command(["ray", "start"]) == ["ray", "start"]
    assert Host(3, "10.77.0.3", "ngv42h3").name == "host3"


def test_leftovers_are_falsy_only_when_nothing_was_left():
    assert not Leftovers()
    assert not Leftovers(pids={"host2": []})
    assert Leftovers(pids={"host2": [123]}) and Leftovers(namespaces=["ngv42h2"]) and Leftovers(links=["ngv42br"])


def test_only_the_beds_own_names_are_swept_and_they_carry_the_owner_pid():
    for name in ("ngv42h2", "ngv42br", "ngv42v3"):
        assert _NAME.match(name).group(1) == "42"
    for name in ("eth0", "ngv0", "ngvbr", "ngv42p2", "docker0", "ngv42h2x"):
        assert _NAME.match(name) is None
