"""``tests.support.listeners``: the listeners a process holds, and what each answers a stranger -- the helpers the
run-wide checks rest on (tests/e2e/test_recipe_cpu_multi_env.py, tests/integration/test_collect.py), held to real
sockets here: an open HTTP server is caught (the control: a knock can fail a test), a guarded app's 401 is told
apart as ours, a socket that speaks no HTTP is no answer."""

from __future__ import annotations

import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.listeners import KNOCKS, Listener, knock, listeners_of


class _Open(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        body = b"ray_node_cpu_count 2\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def open_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Open)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def binary_socket():
    """A listener that answers any connection with bytes that are not HTTP and closes (as gRPC or ZMQ would)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    halt = threading.Event()

    def serve() -> None:
        while not halt.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f")

    threading.Thread(target=serve, daemon=True).start()
    yield sock
    halt.set()
    sock.close()


def test_this_processs_listeners_are_found_and_an_open_server_is_caught(open_server, binary_socket):
    ports = {open_server.server_address[1], binary_socket.getsockname()[1]}
    found = [item for item in listeners_of([os.getpid()]) if item.port in ports]
    assert {item.port for item in found} == ports and {item.scope for item in found} == {"loopback"}
    knocks = {k.listener.port: k for k in knock(found)}
    wide_open = knocks[open_server.server_address[1]]
    assert wide_open.opened and wide_open.answers == ("200",) * len(KNOCKS) and not wide_open.ours
    binary = knocks[binary_socket.getsockname()[1]]
    assert not binary.opened and all(a.startswith("no HTTP") for a in binary.answers), binary.answers


def test_a_guarded_app_answers_401_and_is_told_apart_as_ours():
    """A Starlette app behind access.guard (the rollout servers' and Gym's guard), served by uvicorn."""
    uvicorn = pytest.importorskip("uvicorn")
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from nemo_gym_adapter.access import guard

    app = Starlette(
        routes=[Route("/{path:path}", lambda request: PlainTextResponse("served"), methods=["GET", "POST"])]
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            thread.join(0.05)
        target = [Listener("127.0.0.1", sock.getsockname()[1], os.getpid(), "app")]
        assert knock(target)[0].opened  # the control: unguarded, it serves a stranger
        guard.install_guard(["run-key"])
        [guarded] = knock(target)
        assert guarded.answers == ("401",) * len(KNOCKS) and guarded.ours and not guarded.opened
    finally:
        guard.remove_guard()
        server.should_exit = True
        thread.join(10)
        sock.close()
