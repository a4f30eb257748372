"""Unit tests of what the policy's vLLM servers say (model card, engine probe) against fake OpenAI servers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nemo_gym_adapter.errors import ServerError
from nemo_gym_adapter.runtime.procs import free_port
from nemo_gym_adapter.wire.policy import base_url, effective_max_model_len, probe_logprob, read_model_card


class FakeVllm:
    """``GET /v1/models`` and ``POST /v1/completions`` (prompt_logprobs) the way vLLM answers them; ``POST /generate``
    (prompt log-probs) the way SGLang's native API answers it."""

    def __init__(self, name: str = "m", max_model_len: int | None = 2048, logprob: float = -2.0) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, obj: object) -> None:
                body = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send({"data": [{"id": fake.name, "max_model_len": fake.max_model_len}]})

            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.requests.append(request)
                if self.path == "/generate":  # SGLang's native API: (logprob, id, text), None for the first token
                    ids = request["input_ids"]
                    logprobs = [(None, ids[0], None)] + [(fake.logprob, t, None) for t in ids[1:]]
                    self._send({"meta_info": {"input_token_logprobs": logprobs}})
                    return
                entries = [None] + [{str(t): {"logprob": fake.logprob}} for t in request["prompt"][1:]]
                self._send({"choices": [{"prompt_logprobs": entries}]})

        self.name, self.max_model_len, self.logprob = name, max_model_len, logprob
        self.requests: list[dict] = []
        self.address = f"127.0.0.1:{free_port()}"
        host, port = self.address.split(":")
        self._server = ThreadingHTTPServer((host, int(port)), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def replicas() -> Iterator[list[FakeVllm]]:
    servers = [FakeVllm(max_model_len=4096), FakeVllm(max_model_len=2048)]
    yield servers
    for server in servers:
        server.stop()


def test_model_card_is_the_common_name_and_the_smallest_context(replicas):
    card = read_model_card({r.address: f"vllm_server_{i}_0" for i, r in enumerate(replicas)})
    assert (card.name, card.max_model_len) == ("m", 2048)
    assert read_model_card({base_url(replicas[0].address): "url"}).max_model_len == 4096  # a base URL works too


def test_model_card_errors_name_the_replica(replicas):
    replicas[1].name = "other"
    with pytest.raises(ServerError, match="different models"):
        read_model_card({r.address: "x" for r in replicas})
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(ServerError, match=f"{dead} \\(vllm_server_9_0\\)"):
        read_model_card({dead: "vllm_server_9_0"}, timeout_s=2)


@pytest.mark.parametrize(
    ("configured", "served", "expected"), [(1024, 2048, 1024), (None, 2048, 2048), (512, None, 512)]
)
def test_effective_max_model_len(configured, served, expected):
    assert effective_max_model_len(configured, served) == expected


def test_probe_is_the_mean_prompt_logprob_and_never_raises(replicas):
    assert probe_logprob(replicas[0].address, "m", [5, 6, 7]) == -2.0
    assert replicas[0].requests[0]["prompt_logprobs"] == 0 and replicas[0].requests[0]["max_tokens"] == 1
    assert probe_logprob(replicas[0].address, "m", [5]) is None  # nothing to score
    assert probe_logprob(f"127.0.0.1:{free_port()}", "m", [5, 6], timeout_s=2) is None


def test_the_sglang_probe_reads_the_native_generate_prompt_logprobs(replicas):
    assert probe_logprob(replicas[0].address, "m", [5, 6, 7], api="generate") == -2.0
    sent = replicas[0].requests[0]
    assert (sent["input_ids"], sent["logprob_start_len"], sent["return_logprob"]) == ([5, 6, 7], 0, True)
    assert sent["sampling_params"]["max_new_tokens"] == 1
