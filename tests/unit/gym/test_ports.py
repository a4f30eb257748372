"""Unit tests of nemo_gym_adapter.gym.ports: the band Gym's servers draw their ports from (outside Ray's CLI worker
ports and the kernel's ephemeral range) and what a lost port looks like in Gym's launcher log."""

from __future__ import annotations

import socket

import pytest

from nemo_gym_adapter.errors import GymServerError
from nemo_gym_adapter.gym.ports import (
    GYM_DEFAULT_PORTS,
    RAY_CLI_WORKER_PORTS,
    ephemeral_port_range,
    free_port_in,
    port_collisions,
    safe_port_range,
)


@pytest.mark.parametrize(
    ("ephemeral", "band"),
    [
        ((32768, 60999), (20000, 32767)),  # Linux's default
        ((15000, 30000), (30001, 65535)),  # a node that moved it: the widest gap left
        ((49152, 65535), (20000, 49151)),  # IANA's range (BSD-style)
        ((1024, 65535), GYM_DEFAULT_PORTS),  # everything ephemeral: no gap, Gym's own default (the retry covers it)
        ((20500, 65535), (1024, 10001)),  # gaps of 1024-10001 and 20000-20499: the widest
        ((1500, 65535), GYM_DEFAULT_PORTS),  # the only gap, 1024-1499, is too narrow to draw from
    ],
)
def test_the_safe_band_avoids_rays_worker_ports_and_the_ephemeral_range(ephemeral, band):
    low, high = safe_port_range(ephemeral)
    assert (low, high) == band
    if band != GYM_DEFAULT_PORTS:
        assert high < RAY_CLI_WORKER_PORTS[0] or low > RAY_CLI_WORKER_PORTS[1]
        assert high < ephemeral[0] or low > ephemeral[1]


def test_the_ephemeral_range_is_read_from_proc_with_linuxs_default_as_fallback(tmp_path):
    f = tmp_path / "ip_local_port_range"
    f.write_text("40000\t50000\n")
    assert ephemeral_port_range(f) == (40000, 50000)
    assert ephemeral_port_range(tmp_path / "missing") == (32768, 60999)
    f.write_text("garbage")
    assert ephemeral_port_range(f) == (32768, 60999)


def test_free_port_in_a_band_is_free_and_in_it_and_a_full_band_is_an_error():
    port = free_port_in("127.0.0.1", 20000, 32767)
    assert 20000 <= port <= 32767
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        busy = taken.getsockname()[1]
        with pytest.raises(GymServerError, match=f"no free port in {busy}-{busy}"):
            free_port_in("127.0.0.1", busy, busy, tries=3)


def test_port_collisions_name_the_server_and_port_from_gyms_log():
    log = (
        "(agent_a) INFO:     Application startup complete.\n"
        "(agent_a) ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 23456): "
        "address already in use\n"
        "(policy_model) INFO:     Uvicorn running on http://127.0.0.1:23457 (Press CTRL+C to quit)\n"
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 24000): address already in use\n"
    )
    assert port_collisions(log) == [("agent_a", 23456), ("head server", 24000)]
    assert port_collisions("(agent_a) INFO: Uvicorn running on http://127.0.0.1:1") == []
    assert port_collisions("(agent_a) OSError: [Errno 98] Address already in use") == []  # no port named: not ours
