"""``tests.support.listeners``: the listeners a process holds, and what each answers a stranger -- the helpers the
run-wide checks rest on (tests/e2e/test_recipe_cpu_multi_env.py, tests/integration/test_collect.py), held to real
sockets here: an open HTTP server is caught (the control: a knock can fail a test), a guarded app's 401 is told
apart as ours, a socket that speaks no HTTP is no answer -- told apart without a request when it speaks first (ZMQ's
greeting), asked once when it stays silent -- and :class:`TreeListeners` lists and knocks once per trigger, on what
is new each time, with the run's progress around each round."""

from __future__ import annotations

import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.listeners import KNOCKS, NOT_ASKED, Listener, TreeListeners, knock, listeners_of


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


class _Raw:
    """A listener that speaks no HTTP, counting the connections it accepts and the bytes it was sent: ``greeting``
    sent first (ZMTP's signature, as a ZMQ socket does) or, None, silence (a ZMQ socket after a greeting not its own)."""

    def __init__(self, greeting: bytes | None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.greeting, self.accepted, self.received = greeting, 0, b""
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)
            if self.greeting is not None:
                conn.sendall(self.greeting)
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        try:
            while chunk := conn.recv(4096):
                self.received += chunk
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def binary_socket():
    """A listener that greets every connection in a binary protocol (ZMTP's signature) and then waits."""
    raw = _Raw(b"\xff\x00\x00\x00\x00\x00\x00\x00\x01\x7f")
    yield raw
    raw.close()


@pytest.fixture
def silent_socket():
    raw = _Raw(None)
    yield raw
    raw.close()


def test_this_processs_listeners_are_found_and_an_open_server_is_caught(open_server, binary_socket, silent_socket):
    ports = {open_server.server_address[1], binary_socket.port, silent_socket.port}
    found = [item for item in listeners_of([os.getpid()]) if item.port in ports]
    assert {item.port for item in found} == ports and {item.scope for item in found} == {"loopback"}
    knocks = {k.listener.port: k for k in knock(found, timeout_s=0.5)}
    wide_open = knocks[open_server.server_address[1]]
    assert wide_open.opened and wide_open.answers == ("200",) * len(KNOCKS) and not wide_open.ours
    assert wide_open.speaks_http
    # It greets first: told apart on its first word, no request sent, never connected to again.
    binary = knocks[binary_socket.port]
    assert not binary.opened and not binary.speaks_http
    assert binary.answers == ("no HTTP (speaks first: ZMTP greeting (ZMQ))",) * len(KNOCKS), binary.answers
    assert binary_socket.accepted == 1 and binary_socket.received == b""
    # It stays silent (a ZMQ socket sent a greeting not its own does): asked once, until the timeout, then let be.
    silent = knocks[silent_socket.port]
    assert not silent.opened and not silent.speaks_http
    assert silent.answers == ("no HTTP (timeout)", *[NOT_ASKED] * (len(KNOCKS) - 1)), silent.answers
    assert silent_socket.accepted == 1 and silent_socket.received.startswith(b"GET / HTTP/1.1")


def test_a_run_is_listed_and_knocked_at_each_trigger_on_what_is_new(tmp_path, open_server, binary_socket):
    """TreeListeners on this process: the first trigger lists (and knocks) what listens then, the second only what
    came after it; each round carries the run's progress before and after."""
    log, step = tmp_path / "run.log", [0]
    log.write_text("")
    ours = {open_server.server_address[1], binary_socket.port}
    watch = TreeListeners(
        os.getpid(),
        log,
        ["step 1 begins", lambda: step[0] >= 2],
        interval_s=0.05,
        knock=True,
        progress=lambda: step[0],
    )
    watch.start()
    try:
        log.write_text("step 1 begins\n")
        for _ in range(600):
            if watch.rounds or not watch.is_alive():
                break
            watch.join(0.05)
        later = _Raw(b"\x16\x03\x01")  # opened between the two triggers (it speaks first: no wait)
        step[0] = 2
        watch.join(30)
    finally:
        watch.stop()
    try:
        first, second = watch.rounds
        assert ours <= {item.port for item in first.found} and later.port not in {i.port for i in first.found}
        assert later.port in {item.port for item in second.found}
        assert not ours & {item.port for item in second.found}  # not knocked twice
        assert first.before == 0 and second.after == 2
        assert [k.listener.port for k in watch.knocks or []].count(open_server.server_address[1]) == 1
        assert any(k.opened for k in first.knocks or [])  # the open server, caught
    finally:
        later.close()


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


def test_a_grpc_server_is_told_apart_by_its_http2_preface():
    """Ray's GCS, raylets and workers serve gRPC: an HTTP/2 server that sends its SETTINGS frame first (named, no
    request sent); their guard is Ray's token, not an HTTP status."""
    grpc = pytest.importorskip("grpc")
    from concurrent import futures

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        [answered] = knock([Listener("127.0.0.1", port, os.getpid(), "grpc")], timeout_s=0.5)
    finally:
        server.stop(0)
    assert answered.answers == ("no HTTP (speaks first: HTTP/2 SETTINGS (gRPC))",) * len(KNOCKS), answered.answers
    assert not answered.opened and not answered.speaks_http
