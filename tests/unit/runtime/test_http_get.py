"""runtime/http_get.py: what counts as an answer (a raw loopback listener stands in for a server)."""

from __future__ import annotations

import pytest

from nemo_gym_adapter.runtime.http_get import http_get
from tests.support.raw_http import ECHO, replying_server


def test_an_echoed_request_is_no_answer_and_the_body_limit_holds():
    port, t = replying_server(
        [ECHO, b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 10\r\nConnection: close\r\n\r\n0123456789"]
    )
    url = f"http://127.0.0.1:{port}/"
    with pytest.raises(ConnectionError, match=r"not an HTTP answer \(BadStatusLine: GET / HTTP/1.1"):
        http_get(url, timeout=3.0)
    assert http_get(url, {"X-Test": "1"}, timeout=3.0, limit=4) == (401, b"0123")  # an error status is an answer
    t.join(5)
