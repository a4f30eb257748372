"""A fake NeMo Gym environment server that answers ``/run`` with whatever each row asks of it (the fuzz tests).

Real HTTP (aiohttp on 127.0.0.1, its own thread and loop, like ``fake_gym.FakeEnvServer``), so the rollout client's
whole path runs: connection, headers, streaming, parsing. Each row's ``fuzz`` key says how to answer:

* ``{"kind": "text", "text": ...}``: that text as the body (a mutated result serialised by the test, NaN and all);
* ``{"kind": "other_row", "text": ...}``: the same, for a result made for another row;
* ``{"kind": "endless"}``: 64 KiB chunks, chunked encoding, until the client hangs up;
* ``{"kind": "oversized", "bytes": n}``: a body of ``n`` bytes, ``Content-Length`` declared (refusable unread);
* ``{"kind": "truncated"}``: ``Content-Length`` twice what is sent, then the connection is closed;
* ``{"kind": "reset"}``: half a body (chunked), then the connection is aborted (a reset halfway);
* ``{"kind": "hang"}``: no answer (a verifier that hangs) until the server stops.

The server records, per row, the bytes it wrote (``sent``) and whether the client cut its stream (``cut``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from aiohttp import web

from nemo_gym_adapter.runtime.procs import free_port

CHUNK = b"[" + b"1," * (32 * 1024 - 1) + b"1"  # 64 KiB of the start of a JSON array that never closes


class FuzzingFakeGym:
    """The server (module docstring). ``url``: its base URL; :meth:`stop` ends it and every answer in progress."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.sent: dict[int, int] = {}
        self.cut: set[int] = set()
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="fuzzing-fake-gym")
        self._thread.start()
        assert self._ready.wait(10), "fuzzing fake Gym did not start"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._release = asyncio.Event()  # ends the hanging answers at stop()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/run", self._run)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, handle_signals=False)
        self._loop.run_until_complete(self._runner.setup())
        self._loop.run_until_complete(web.TCPSite(self._runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()

    async def _run(self, request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        self.requests += 1
        row, spec = int(body.get("row", -1)), body.get("fuzz") or {}
        kind = spec.get("kind", "text")
        if kind in ("text", "other_row"):
            return web.Response(body=spec["text"].encode(), content_type="application/json")
        if kind == "hang":
            await self._release.wait()
            raise web.HTTPServiceUnavailable(text="the fuzzing fake Gym stopped")
        if kind == "oversized":
            return await self._stream(request, row, total=int(spec["bytes"]), declare=True)
        if kind == "endless":
            return await self._stream(request, row, total=None, declare=False)
        if kind == "truncated":
            response = web.StreamResponse(headers={"Content-Length": str(2 * len(CHUNK))})
            await response.prepare(request)
            await response.write(CHUNK)
            self.sent[row] = len(CHUNK)
            request.transport.close()
            return response
        if kind == "reset":
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(CHUNK)
            self.sent[row] = len(CHUNK)
            await asyncio.sleep(0.05)
            request.transport.abort()
            return response
        raise web.HTTPBadRequest(text=f"unknown fuzz kind {kind!r}")

    async def _stream(self, request: web.Request, row: int, total: int | None, declare: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": str(total)} if declare else {})
        if not declare:
            response.enable_chunked_encoding()
        await response.prepare(request)
        sent = 0
        try:
            while total is None or sent < total:
                chunk = CHUNK if total is None else CHUNK[: total - sent]
                await response.write(chunk)
                sent += len(chunk)
                self.sent[row] = sent
                if request.transport is None or request.transport.is_closing():
                    raise ConnectionResetError("the client closed the connection")
        except (ConnectionResetError, ConnectionError, RuntimeError):
            self.cut.add(row)
        return response

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._release.set)
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def fuzz_row(index: int, agent: str, spec: dict[str, Any], **verifier_fields: Any) -> dict[str, Any]:
    """A Gym row for :class:`FuzzingFakeGym`: its index, how to answer, and verifier fields (echoed by real Gym)."""
    return {
        "row": index,
        "agent_ref": {"name": agent},
        "responses_create_params": {"input": f"question {index}"},
        "fuzz": spec,
        **verifier_fields,
    }
