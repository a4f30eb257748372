"""One HTTP GET as the library's probes read it: an answer is a status and a body; anything else is "no answer".

Three places ask a server whether it is there -- a started process's readiness wait (``runtime.procs``), Gym's
health and list reads (``gym.head``), the check that every Gym server refuses a request without the run's key
(``access.gym_guard``) -- and all three must read a non-HTTP reply as "no answer": before a server binds a port in the
kernel's ephemeral range (Gym's ports are), a probe can connect to itself and read its own request line back
(``BadStatusLine: GET /health HTTP/1.1``, seen in a unit run with both cores busy). ``http.client`` raises that as an
``HTTPException``, not an ``OSError``, so it escaped every ``except OSError`` and failed a start-up. Stdlib only.
"""

from __future__ import annotations

import http.client
import urllib.error
import urllib.request
from collections.abc import Mapping


def http_get(
    url: str, headers: Mapping[str, str] | None = None, timeout: float = 5.0, limit: int | None = None
) -> tuple[int, bytes]:
    """GET ``url``: (status, body) -- an error status is an answer too --, reading at most ``limit`` bytes of the body
    (None: all of it). Raises ``OSError`` when nothing answers in HTTP: no listener, or one that answers something
    else (a ``ConnectionError`` naming the URL and what was read)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=dict(headers or {})), timeout=timeout) as r:
            return r.status, r.read() if limit is None else r.read(limit)
    except urllib.error.HTTPError as e:
        return e.code, e.read() if limit is None else e.read(limit)
    except http.client.HTTPException as e:
        raise ConnectionError(f"{url}: not an HTTP answer ({type(e).__name__}: {e})") from e
