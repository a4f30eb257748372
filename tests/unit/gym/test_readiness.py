"""Unit tests of nemo_gym_adapter.gym.readiness: when a launched Gym serves (Gym's own condition, read early), what
wakes the wait, which model endpoints Gym waits for. The whole start-up against the fake Gym, crash and timeout
diagnosis included, is tests/unit/gym/test_servers.py's."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from nemo_gym_adapter.gym import readiness
from nemo_gym_adapter.gym.head import GymServerInstance
from nemo_gym_adapter.gym.servers import GymServers
from nemo_gym_adapter.runtime.procs import LogWatch
from tests.support.fake_gym_venv import fake_spec


def test_gyms_config_is_read_while_servers_still_start_not_after_the_last_answers(monkeypatch):
    """The model endpoints come from Gym's config (parsed once, cached): read on the first check after the head
    answers, so the check run when the last server comes up is only the HTTP probes."""
    gym = GymServers("http://127.0.0.1:9")
    reads: list[str] = []
    monkeypatch.setattr(readiness, "http_get", lambda url, timeout=5.0: (503, b"{}"))  # head up, its own flag not set
    monkeypatch.setattr(gym, "global_config", lambda refresh=False: reads.append("config") or {})
    inst = GymServerInstance(process_name="a", server_type="t", name="n", host="h", port=1, url="http://h:1")
    monkeypatch.setattr(gym, "server_instances", lambda: {"a": inst})
    monkeypatch.setattr(readiness, "answers", lambda url: False)  # no server answers yet
    assert readiness.serves(gym, fake_spec(Path("/nonexistent"), Path("/tmp"))) is False
    assert reads == ["config"]


def test_log_events_wake_on_a_server_announcement_only(tmp_path):
    log = tmp_path / "gym.log"
    log.write_bytes(b"")
    events = LogWatch(log, readiness.READY_MARKERS)
    with open(log, "ab") as f:
        f.write(b'INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 503 Service Unavailable\n')
    assert events.wait(0.1) is False  # our own probes' access lines are not events

    def announce():
        time.sleep(0.3)
        with open(log, "ab") as f:
            f.write(b"(policy_model) INFO:     Uvicorn run")
            f.flush()
            time.sleep(0.1)
            f.write(b"ning on http://127.0.0.1:5 (Press CTRL+C to quit)\n")

    threading.Thread(target=announce).start()
    t0 = time.monotonic()
    assert events.wait(5) is True  # split across two writes, still seen
    assert time.monotonic() - t0 < 2


def test_model_endpoints_mirror_gyms_list():
    cfg = {
        "policy_model": {"responses_api_models": {"vllm_model": {"base_url": ["http://a:1/v1/", "http://b:2/v1"]}}},
        "judge": {"responses_api_models": {"openai_model": {"openai_base_url": "http://a:1/v1", "port": 3}}},
        "env": {"resources_servers": {"x": {"base_url": "http://not-a-model"}}},
        "policy_base_url": "http://ignored/v1",
    }
    assert readiness.model_endpoints(cfg) == ["http://a:1/v1", "http://b:2/v1"]
