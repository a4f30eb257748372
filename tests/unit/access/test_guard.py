"""The access guard on a real Starlette app (in-process, Starlette's TestClient): every route refuses a request
without the run's key with a 401 before any route runs; the right key gets through; a key change and removal act on
the running app."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.testclient import TestClient

from nemo_gym_adapter.access import guard
from nemo_gym_adapter.errors import SetupError

KEY = "run-key-0123456789"
REACHED: list[str] = []  # paths whose endpoint ran


async def endpoint(request):
    REACHED.append(request.url.path)
    await request.body()
    return JSONResponse({"ok": True})


async def socket(ws):
    await ws.accept()
    await ws.send_text("hi")
    await ws.close()


def _app() -> Starlette:
    metrics = Starlette(routes=[Route("/", endpoint, methods=["GET", "POST"])])  # mounted, as vLLM mounts /metrics
    routes = [Route(p, endpoint, methods=["GET", "POST"]) for p in ("/health", "/tokenize", "/v1/chat/completions")]
    return Starlette(routes=[*routes, Mount("/metrics", metrics), WebSocketRoute("/ws", socket)])


@pytest.fixture
def client():
    REACHED.clear()
    try:
        with TestClient(_app()) as c:  # lifespan runs through the guard untouched
            yield c
    finally:
        guard.remove_guard()


def test_without_the_guard_everything_answers(client):
    assert client.get("/health").status_code == 200 and not guard.is_guarded()


@pytest.mark.parametrize("path", ["/health", "/tokenize", "/v1/chat/completions", "/metrics/", "/no/such/route"])
def test_every_route_refuses_a_request_without_the_key_before_it_runs(client, path):
    report = guard.install_guard([KEY])
    assert report.keys == 1 and not report.already_installed and guard.is_guarded()
    r = client.post(path, content=b"x" * 1_000_000)
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    error = r.json()["error"]
    assert error["code"] == "invalid_api_key" and "no Authorization header" in error["message"]
    assert REACHED == []  # no endpoint ran, the body was never read
    if path != "/no/such/route":
        assert client.post(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (f"Bearer {KEY}x", "not this run's"),
        (f"Basic {KEY}", "not 'Bearer <key>'"),
        ("Bearer", "not 'Bearer <key>'"),
        (f"bearer {KEY[:-1]}", "not this run's"),
    ],
)
def test_a_wrong_key_is_named_without_echoing_it(client, header, why):
    guard.install_guard([KEY])
    r = client.get("/health", headers={"Authorization": header})
    assert r.status_code == 401 and why in r.json()["error"]["message"]
    assert KEY[:8] not in r.text


def test_scheme_is_case_insensitive_and_several_keys_are_accepted(client):
    guard.install_guard([KEY, "second"])
    assert client.get("/health", headers={"Authorization": f"bearer {KEY}"}).status_code == 200
    assert client.get("/health", headers={"Authorization": "Bearer second"}).status_code == 200


def test_websocket_handshake_without_the_key_is_closed(client):
    from starlette.websockets import WebSocketDisconnect

    guard.install_guard([KEY])
    with pytest.raises(WebSocketDisconnect) as info, client.websocket_connect("/ws"):
        pass
    assert info.value.code == 1008
    with client.websocket_connect("/ws", headers={"Authorization": f"Bearer {KEY}"}) as ws:
        assert ws.receive_text() == "hi"


def test_a_live_app_follows_key_changes_and_removal(client):
    guard.install_guard([KEY])
    assert client.get("/health").status_code == 401
    assert guard.install_guard(["new"]).already_installed  # replaced, not wrapped twice
    assert client.get("/health", headers={"Authorization": f"Bearer {KEY}"}).status_code == 401
    assert client.get("/health", headers={"Authorization": "Bearer new"}).status_code == 200
    guard.remove_guard()
    assert client.get("/health").status_code == 200 and not guard.is_guarded()


def test_no_key_is_an_error_not_an_open_door():
    with pytest.raises(SetupError, match="at least one non-empty key"):
        guard.install_guard(["", None])  # type: ignore[list-item]


def test_the_refusal_is_openai_shaped_json():
    status, body = guard.refusal({"type": "http", "headers": []})
    assert status == 401 and set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
