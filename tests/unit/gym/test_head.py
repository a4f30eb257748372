"""gym/head.py's HTTP reads: what counts as an answer."""

from __future__ import annotations

import threading

import pytest

from nemo_gym_adapter.gym.head import answers, http_get
from tests.support.raw_http import ECHO, replying_server


def _one_shot_server(reply: bytes | None) -> tuple[str, threading.Thread]:
    """One connection answered with ``reply`` (``ECHO``: the request itself, what a socket connected to itself reads --
    the port not yet bound, in the ephemeral range)."""
    port, t = replying_server([reply])
    return f"http://127.0.0.1:{port}/health", t


def test_a_socket_that_echoes_the_request_is_no_answer_and_says_so_as_an_oserror():
    url, t = _one_shot_server(ECHO)
    with pytest.raises(OSError, match=r"not an HTTP answer \(BadStatusLine: GET /health HTTP/1.1"):
        http_get(url, timeout=3.0)
    t.join(5)
    url, t = _one_shot_server(ECHO)
    assert answers(url) is False  # readiness probes see "not up yet", not an exception
    t.join(5)


def test_control_an_http_answer_counts_whatever_its_status():
    url, t = _one_shot_server(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno")
    assert http_get(url, timeout=3.0) == (503, b"no")
    t.join(5)
    url, t = _one_shot_server(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
    assert answers(url) is True
    t.join(5)
