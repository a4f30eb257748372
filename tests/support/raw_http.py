"""A loopback listener that answers raw bytes: what a probe meets before a server binds its port."""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence

ECHO = None  # a reply of ECHO sends the request back: what a socket connected to itself reads


def replying_server(replies: Sequence[bytes | None]) -> tuple[int, threading.Thread]:
    """Listen on a free loopback port; answer one connection per entry of ``replies`` (each reads the request, then
    sends the bytes, or the request itself for :data:`ECHO`), then close. Returns the port and the serving thread."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(len(replies))

    def serve() -> None:
        for reply in replies:
            conn, _ = srv.accept()
            with conn:
                request = conn.recv(65536)
                conn.sendall(request if reply is ECHO else reply)
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return srv.getsockname()[1], t
