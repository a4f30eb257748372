"""``python -m nemo_gym_adapter.vllm.server``: the standalone patched vLLM server keeps the model's token history."""

from __future__ import annotations

import httpx
import pytest

from tests.support import vllm_fixtures
from tests.support.conversations import piecewise

pytestmark = pytest.mark.integration


def test_patched_launcher_serves_the_exact_token_history(monkeypatch, tiny_model_dir, record_property):
    from transformers import AutoTokenizer

    monkeypatch.setattr(vllm_fixtures, "VLLM_LAUNCHER_MODULE", "nemo_gym_adapter.vllm.server")
    path = tiny_model_dir("qwen25")
    tok = AutoTokenizer.from_pretrained(path)
    with vllm_fixtures.start_vllm_server(path, log_name="vllm-patched-launcher") as server:
        record_property("vllm_start_s", round(server.start_seconds, 1))
        root = server.base_url.removesuffix("/v1")
        first = [{"role": "user", "content": "What is the weather in Paris?"}]
        with httpx.Client(timeout=300) as client:
            prompt = client.post(f"{root}/tokenize", json={"model": server.model_name, "messages": first}).json()
            content = "Skinny weather in Paris today"
            generation = piecewise(tok, content) + [tok.convert_tokens_to_ids("<|endoftext|>")]
            history = prompt["tokens"] + generation
            messages = [
                *first,
                {
                    "role": "assistant",
                    "content": content,
                    "prompt_token_ids": prompt["tokens"],
                    "generation_token_ids": generation,
                    "generation_log_probs": [-1.0] * len(generation),
                },
                {"role": "user", "content": "And Oslo?"},
            ]
            body = {"model": server.model_name, "messages": messages, "max_tokens": 4, "return_token_ids": True}
            r = client.post(f"{server.base_url}/chat/completions", json=body)
            assert r.status_code == 200, r.text
            engine_prompt = r.json()["prompt_token_ids"]
            tokenized = client.post(f"{root}/tokenize", json={"model": server.model_name, "messages": messages})
            plain = [{k: v for k, v in m.items() if "_ids" not in k and "log_probs" not in k} for m in messages]
            stock = client.post(f"{root}/tokenize", json={"model": server.model_name, "messages": plain})
    assert engine_prompt[: len(history)] == history
    assert tokenized.json()["tokens"] == engine_prompt
    assert stock.json()["tokens"][: len(history)] != history  # what the unpatched render would have served
