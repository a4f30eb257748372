"""Where a NeMo Gym ``/run`` error answer started: the environment's own code, the model backend, or the transport.

Gym's servers turn any uncaught exception into an HTTP 500 (``nemo_gym/server_utils.py``, the exception middleware):
a server whose call to an inner server failed answers ``Hit an exception in <Class>___<name> calling an inner server:
<the inner server's body>``, so a ``/run`` error carries one hop per server, outermost first, and the innermost body
is what the failing server said: its exception's ``repr``, or a FastAPI ``{"detail": ...}`` for an ``HTTPException``
(e.g. ``grl_sokoban``'s ``/step`` answering 400 "Unable to parse action" to the ``gymnasium_agent``, which fails the
whole rollout; ``scicode``'s ``/verify`` raising on a data file it was not given).

:func:`gym_error_origin` reads the whole body (before the client truncates it for logs):

* ``"model"``: the innermost caller is a model server (``VLLMModel``...): the model backend refused the call (audio or
  images sent to a text-only model, a bad request);
* ``"transport"``: the innermost body is a connection, timeout or cancellation error: a server was unreachable,
  infrastructure whatever the hop;
* ``"environment"``: anything else an agent's inner call failed with: the environment's code (its resources server,
  a tool, the verifier) raised or refused the model's output. :class:`~nemo_gym_adapter.rollouts.trajectory.MaskReason`
  ``VERIFIER_ERROR``, subject to ``nemo_gym.trajectory.verifier_errors``;
* ``None``: not Gym's chain (a proxy's 502, an agent's own crash answered directly): a plain request failure.

Pure, no I/O.
"""

from __future__ import annotations

import re
from typing import Literal

GymErrorOrigin = Literal["model", "transport", "environment"]

_HOP = re.compile(r"Hit an exception in (\w+?)___\S+? calling an inner server: ")
# What the innermost body says when the inner server was not reached or gave up (aiohttp's and asyncio's exception
# reprs, Gym's own cancellation answer): infrastructure, never the environment's verdict on the model's output.
_TRANSPORT = re.compile(
    r"ClientConnectorError|ClientConnectionError|ClientOSError|ServerDisconnectedError|ServerTimeoutError|"
    r"ConnectionRefusedError|ConnectionResetError|Cannot connect to host|TimeoutError|Request was cancelled"
)


def gym_error_origin(body: str) -> GymErrorOrigin | None:
    """Classify a Gym 5xx body (see the module docstring); None when it is not Gym's inner-server chain."""
    hops = list(_HOP.finditer(body))
    if not hops:
        return None
    innermost = hops[-1]
    if innermost.group(1).endswith("Model"):
        return "model"
    if _TRANSPORT.search(body, innermost.end()):
        return "transport"
    return "environment"
