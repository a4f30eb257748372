"""verl's SGLang client and server with the run's key: both of the client's request paths carry ``Authorization``
once wrapped, and the server installs the access guard before it launches. Against fakes of verl's modules (the names
``wrap``/``wrap_server`` touch; verl's real adapter and server with SGLang's real app are ``tests/sglang/ray_cases.py``,
in the SGLang venv)."""

from __future__ import annotations

import asyncio
import contextlib
import types

import pytest
from pydantic import SecretStr

from nemo_gym_adapter.access import key as access_key
from nemo_gym_adapter.sglang import verl_client


class FakeSession:
    def __init__(self) -> None:
        self.headers: dict[str, str] = {}


class FakeAsyncHttpServerAdapter:
    @contextlib.asynccontextmanager
    async def _get_session(self):
        yield FakeSession()


class FakeRequests:
    class exceptions:  # noqa: N801  (requests' own name)
        Timeout = TimeoutError

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict]] = []

    def get(self, url, **kwargs):
        self.calls.append(("get", url, kwargs))

    def post(self, url, **kwargs):
        self.calls.append(("post", url, kwargs))


@pytest.fixture
def fake_engine(monkeypatch):
    module = types.ModuleType("fake_http_server_engine")
    module.AsyncHttpServerAdapter = type("AsyncHttpServerAdapter", (FakeAsyncHttpServerAdapter,), {})
    module.requests = FakeRequests()
    key = access_key.RunKey(SecretStr("k1"), "generated")
    monkeypatch.setattr(access_key, "_connected", lambda: False)
    monkeypatch.setattr(access_key, "_CACHE", {access_key._LOCAL: key})
    return module


def test_both_request_paths_carry_the_key_once_wrapped(fake_engine):
    real = fake_engine.requests
    verl_client.wrap(fake_engine)
    verl_client.wrap(fake_engine)  # idempotent

    async def session_headers():
        async with fake_engine.AsyncHttpServerAdapter()._get_session() as session:
            return session.headers

    assert asyncio.run(session_headers()) == {"Authorization": "Bearer k1"}
    fake_engine.requests.post("http://h:1/flush_cache", json={}, headers={"X": "1"})
    fake_engine.requests.get("http://h:1/v1/models")
    assert [c[2]["headers"] for c in real.calls] == [
        {"Authorization": "Bearer k1", "X": "1"},
        {"Authorization": "Bearer k1"},
    ]
    assert fake_engine.requests.exceptions.Timeout is TimeoutError  # the rest of requests is untouched


def test_without_a_published_key_nothing_is_added(fake_engine, monkeypatch):
    monkeypatch.setattr(access_key, "_CACHE", {})
    verl_client.wrap(fake_engine)
    fake_engine.requests.get("http://h:1/health")
    assert fake_engine.requests._requests.calls[0][2]["headers"] == {}


def test_the_server_is_guarded_before_it_launches(fake_engine, monkeypatch):
    from nemo_gym_adapter.access import guard

    seen = []

    class FakeSGLangHttpServer:
        async def launch_server(self, master_address=None, master_port=None):
            seen.append((guard.is_guarded(), master_address))

    module = types.ModuleType("fake_async_sglang_server")
    module.SGLangHttpServer = FakeSGLangHttpServer
    verl_client.wrap_server(module)
    verl_client.wrap_server(module)  # idempotent
    try:
        asyncio.run(FakeSGLangHttpServer().launch_server("127.0.0.1"))
        assert seen == [(True, "127.0.0.1")]  # the guard was in place when verl's launch ran
    finally:
        guard.remove_guard()


def test_wrapping_waits_for_verls_module_to_be_imported(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, verl_client._MODULE, raising=False)
    verl_client.install()
    verl_client.install()
    assert sum(isinstance(f, verl_client._WrapOnImport) for f in sys.meta_path) == 1
