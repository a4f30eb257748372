"""The vLLM token-ID patch on a live server in a Ray actor (verl's shape), applied through ``__ray_call__``.

Each family's actor first drives a multi-turn tool-call conversation *unpatched* (the control: the next prompt is
not the token history), then gets the patch through Ray, then drives it again: the engine prompt reported by
``return_token_ids`` must be exactly ``previous prompt + generation + rendered tail`` on every turn, and ``/tokenize``
must agree. The requests carry what NeMo Gym's ``vllm_model`` sends (ids on assistant messages, ``logprobs`` with
``return_tokens_as_token_ids``, ``top_logprobs: 0``, ``return_token_ids``). The random tiny model is forced into tool
calls with a ``structured_outputs`` regex; the regex writes compact JSON, which the chat template re-renders with
spaces, so an unpatched server cannot reproduce the history.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from nemo_gym_adapter.vllm.patch import apply_patch_to_actors, find_vllm_server_actors
from tests.support.conversations import TERMINATOR, TOOLS, expected_prompt, follow_up
from tests.support.ray_vllm_fixtures import TEST_MAX_MODEL_LEN, served_model_name

# One actor per family (ray_vllm_fixtures.ray_vllm), all tests of a family before the next one starts (~50 s each to
# start here). The default run keeps llama3 (the template family unlike the others); qwen25 and qwen3 are the slow
# tier's: qwen25 is served patched by tests/integration/vllm/test_server.py, and every family's splice runs on its own
# tokenizer and template in the unit tier (tests/unit/tokens/test_splice_property.py). Run them when tokens/ or vllm/
# change.
FAMILIES = [pytest.param("qwen25", marks=pytest.mark.slow), pytest.param("qwen3", marks=pytest.mark.slow), "llama3"]
pytestmark = [pytest.mark.integration, pytest.mark.parametrize("ray_vllm", FAMILIES, indirect=True, scope="module")]
# Compact JSON on purpose (the templates re-render it with spaces). Qwen-style families wrap it in <tool_call> tags.
_CALL = {
    "chatml": r'<tool_call>\n\{"name":"get_weather","arguments":\{"city":"(Paris|Oslo|Skinny)"\}\}\n</tool_call>',
    "llama3": r'\{"name":"get_weather","parameters":\{"city":"(Paris|Oslo|Skinny)"\}\}',
}
_THINK = r"<think>\n(Skinny|weather) (is|was) (fine|cold)\n</think>\n\n"
_ANSWER = r"(It|Skinny) is (sunny|cold|Skinny)\."


def _regex(family: str, kind: str) -> str:
    body = _CALL["llama3" if family == "llama3" else "chatml"] if kind == "call" else _ANSWER
    return (_THINK + body) if family == "qwen3" else body


# The conversation: (what the model is forced to do, what comes after its answer).
SCRIPT = [("call", "tool"), ("call", "tool"), ("answer", "user"), ("call", "tool"), ("free", None)]


class Conversation:
    """Drives one Gym-shaped conversation against ``base_url`` and records every turn's prompt and generation."""

    def __init__(self, base_url: str, family: str) -> None:
        self.base_url = base_url
        self.family = family
        self.model = served_model_name(family)
        self.messages: list[dict] = [
            {"role": "system", "content": "You are a weather bot. Be brief."},
            {"role": "user", "content": "What is the weather in Paris? Skinny answers please."},
        ]
        self.turns: list[dict] = []  # {"messages", "prompt", "generation", "tokenize"}

    def body(self, kind: str, seed: int) -> dict:
        body = {
            "model": self.model,
            "messages": self.messages,
            "tools": TOOLS,
            "tool_choice": "auto",
            "max_tokens": 64 if kind != "free" else 12,
            "temperature": 1.0,
            "seed": seed,
            # What Gym's vllm_model adds with return_token_id_information + request_prompt_and_generation_token_ids.
            "logprobs": True,
            "top_logprobs": 0,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
        }
        if kind != "free":
            body["structured_outputs"] = {"regex": _regex(self.family, kind)}
        return body

    def run(self, client: httpx.Client) -> Conversation:
        for seed, (kind, then) in enumerate(SCRIPT):
            sent = json.loads(json.dumps(self.messages))
            r = client.post(f"{self.base_url}/v1/chat/completions", json=self.body(kind, seed))
            assert r.status_code == 200, r.text
            data = r.json()
            choice = data["choices"][0]
            prompt, generation = data["prompt_token_ids"], choice["token_ids"]
            # Gym cross-checks inline ids against the logprob tokens: they must agree.
            assert [int(e["token"].removeprefix("token_id:")) for e in choice["logprobs"]["content"]] == generation
            tok = client.post(f"{self.base_url}/tokenize", json={"model": self.model, "messages": sent, "tools": TOOLS})
            assert tok.status_code == 200, tok.text
            self.turns.append({"messages": sent, "prompt": prompt, "generation": generation, "tokens": tok.json()})
            self._append_answer(choice, prompt, generation, seed)
            if then:  # None: the conversation ends here
                self.messages.append(follow_up(then, self.messages[-1]))
        return self

    def _append_answer(self, choice: dict, prompt: list[int], generation: list[int], seed: int) -> None:
        message = choice["message"]
        logprobs = [e["logprob"] for e in choice["logprobs"]["content"]]
        answer = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            answer["tool_calls"] = [
                {"id": c["id"] or f"call_{seed}", "type": "function", "function": c["function"]}
                for c in message["tool_calls"]
            ]
        answer.update(prompt_token_ids=prompt, generation_token_ids=generation, generation_log_probs=logprobs)
        self.messages.append(answer)

    def history_kept(self) -> list[bool]:
        """Per turn after the first: does the prompt start with the previous prompt + generation?"""
        return [
            cur["prompt"][: len(prev["prompt"]) + len(prev["generation"])] == prev["prompt"] + prev["generation"]
            for prev, cur in zip(self.turns, self.turns[1:], strict=False)
        ]


@pytest.fixture(scope="module")
def patched(ray_vllm):
    """Per family (``ray_vllm`` is parametrized below): the unpatched control conversation, then the patch via Ray."""
    family = ray_vllm.name.rsplit("_", 1)[-1]
    with httpx.Client(timeout=300) as client:
        t0 = time.monotonic()
        control = Conversation(ray_vllm.base_url, family).run(client)
        control_seconds = time.monotonic() - t0
    actors = find_vllm_server_actors()
    reports = apply_patch_to_actors(actors, timeout=120)
    return {
        "family": family,
        "server": ray_vllm,
        "control": control,
        "control_seconds": control_seconds,
        "actors": actors,
        "reports": reports,
    }


def test_patch_applied_through_ray_to_the_named_actor(patched, record_property):
    family, server = patched["family"], patched["server"]
    record_property("vllm_actor_start_s", round(server.start_seconds, 1))
    assert list(patched["actors"]) == [f"vllm_server_0_0_{family}"]
    (report,) = patched["reports"]
    assert not report.already_patched and report.actor == f"vllm_server_0_0_{family}"
    assert report.hook.endswith("preprocess_chat") and report.vllm_version.startswith("0.")
    # Idempotent: a second application is a no-op that says so.
    (again,) = apply_patch_to_actors([server.handle])
    assert again.already_patched and again.pid == report.pid


def test_unpatched_control_loses_the_token_history(patched):
    kept = patched["control"].history_kept()
    assert len(kept) == len(SCRIPT) - 1
    assert not all(kept), "stock vLLM reproduced the token history: the control cannot show what the patch fixes"


def test_patched_prompt_is_the_exact_token_history_every_turn(patched, record_property):
    from transformers import AutoTokenizer

    family, server = patched["family"], patched["server"]
    tokenizer = AutoTokenizer.from_pretrained(server.model_path)
    t0 = time.monotonic()
    with httpx.Client(timeout=300) as client:
        conv = Conversation(server.base_url, family).run(client)
    record_property("patched_conversation_s", round(time.monotonic() - t0, 1))
    record_property("control_conversation_s", round(patched["control_seconds"], 1))
    assert conv.history_kept() == [True] * (len(SCRIPT) - 1)
    for i, (prev, turn) in enumerate(zip(conv.turns, conv.turns[1:], strict=False), start=1):
        assert turn["prompt"] == expected_prompt(tokenizer, family, turn, prev), f"turn {i}"
        # /tokenize (what Gym calls without inline ids) renders through the same hook.
        assert turn["tokens"]["tokens"] == turn["prompt"], f"turn {i}: /tokenize disagrees with the engine prompt"
    # The forced tool calls came back parsed, as Gym needs them.
    assert sum(1 for m in conv.messages if m.get("tool_calls")) == 3


def test_overlong_spliced_history_is_vllms_context_length_400(patched):
    """Full render fits, the spliced prompt (model's piecewise tokens) does not: 400 with vLLM's own wording."""
    from transformers import AutoTokenizer

    family, server = patched["family"], patched["server"]
    tokenizer = AutoTokenizer.from_pretrained(server.model_path)
    model = served_model_name(family)
    first = [{"role": "user", "content": "Say Skinny a lot."}]
    with httpx.Client(timeout=300) as client:
        prompt = client.post(f"{server.base_url}/tokenize", json={"model": model, "messages": first}).json()["tokens"]
        text = "Skinny weather " * 150  # ~300 tokens when rendered, one token per byte when "generated"
        term = tokenizer.convert_tokens_to_ids(TERMINATOR[family])
        generation = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(ch)[0]) for ch in text] + [term]
        assert len(prompt) + len(generation) > TEST_MAX_MODEL_LEN
        messages = [
            *first,
            {
                "role": "assistant",
                "content": text,
                "prompt_token_ids": prompt,
                "generation_token_ids": generation,
                "generation_log_probs": [0.0] * len(generation),
            },
            {"role": "user", "content": "Again."},
        ]
        stock = client.post(
            f"{server.base_url}/tokenize",
            json={"model": model, "messages": [{k: v for k, v in m.items() if "_ids" not in k} for m in messages]},
        ).json()["count"]
        assert stock < TEST_MAX_MODEL_LEN  # without the ids, vLLM would accept this conversation
        r = client.post(
            f"{server.base_url}/v1/chat/completions", json={"model": model, "messages": messages, "max_tokens": 4}
        )
    assert r.status_code == 400, r.text
    assert f"This model's maximum context length is {TEST_MAX_MODEL_LEN} tokens" in r.json()["error"]["message"]


def test_output_budget_is_clamped_to_the_context_after_the_splice(patched):
    family, server = patched["family"], patched["server"]
    model = served_model_name(family)
    # A long first prompt leaves little room, so the clamped generation below is short.
    first = [{"role": "user", "content": "weather " * (TEST_MAX_MODEL_LEN - 150)}]
    with httpx.Client(timeout=300) as client:
        r1 = client.post(
            f"{server.base_url}/v1/chat/completions",
            json={"model": model, "messages": first, "max_tokens": 5, "return_token_ids": True},
        )
        assert r1.status_code == 200, r1.text
        r1 = r1.json()
        choice = r1["choices"][0]
        ids = {"prompt_token_ids": r1["prompt_token_ids"], "generation_token_ids": choice["token_ids"]}
        messages = [
            *first,
            {
                "role": "assistant",
                "content": choice["message"]["content"] or "",
                **ids,
                "generation_log_probs": [0.0] * len(choice["token_ids"]),
            },
            {"role": "user", "content": "More."},
        ]
        body = {"model": model, "messages": messages, "max_tokens": 1000, "ignore_eos": True, "return_token_ids": True}
        # prompt + max_tokens > max_model_len: the patch clamps max_tokens to what is left of the context.
        r = client.post(f"{server.base_url}/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        data = r.json()
    prompt_len = len(data["prompt_token_ids"])
    assert prompt_len + 1000 > TEST_MAX_MODEL_LEN
    assert data["usage"]["completion_tokens"] == TEST_MAX_MODEL_LEN - prompt_len
    assert data["choices"][0]["finish_reason"] == "length"


def test_token_alignment_error_is_a_clear_400(patched):
    family, server = patched["family"], patched["server"]
    model = served_model_name(family)
    messages = [
        {"role": "user", "content": "Hello"},
        # Ids of a two-turn history on a one-turn conversation: an edited history the splice must refuse.
        {"role": "assistant", "content": "Hi", "prompt_token_ids": [1, 2, 3], "generation_token_ids": [4, 5]},
        {"role": "user", "content": "Bye"},
    ]
    with httpx.Client(timeout=300) as client:
        r = client.post(f"{server.base_url}/v1/chat/completions", json={"model": model, "messages": messages})
        t = client.post(f"{server.base_url}/tokenize", json={"model": model, "messages": messages})
    for resp in (r, t):
        assert resp.status_code == 400, resp.text
        assert "token splice" in resp.json()["error"]["message"]


def test_history_edited_in_place_is_a_400_naming_the_message(patched):
    """A user message rewritten after the model answered it (same number of turns): the patched server refuses the
    request, naming the message, where the count-only splice kept the model's old tokens without a word."""
    family, server = patched["family"], patched["server"]
    model = served_model_name(family)
    first = [{"role": "system", "content": "You are a weather bot."}, {"role": "user", "content": "Weather in Paris?"}]
    with httpx.Client(timeout=300) as client:
        r1 = client.post(
            f"{server.base_url}/v1/chat/completions",
            json={"model": model, "messages": first, "max_tokens": 4, "return_token_ids": True, "seed": 0},
        )
        assert r1.status_code == 200, r1.text
        data = r1.json()
        choice = data["choices"][0]
        answer = {
            "role": "assistant",
            "content": choice["message"]["content"] or "",
            "prompt_token_ids": data["prompt_token_ids"],
            "generation_token_ids": choice["token_ids"],
            "generation_log_probs": [0.0] * len(choice["token_ids"]),
        }
        history = [*first, answer, {"role": "user", "content": "And Oslo?"}]
        unedited = client.post(f"{server.base_url}/tokenize", json={"model": model, "messages": history})
        edited = [first[0], {"role": "user", "content": "Weather in Rome?"}, *history[2:]]
        r = client.post(
            f"{server.base_url}/v1/chat/completions", json={"model": model, "messages": edited, "max_tokens": 4}
        )
    assert unedited.status_code == 200, unedited.text  # the control: the history as the model saw it is accepted
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "messages[1] (user) differs from what the model saw" in message and "Rome" in message

    # The assistant-edit policy travels through Ray into the actor: its own message rewritten, its ids kept.
    rewritten = [*history[:2], {**answer, "content": "Edited by the client."}, history[3]]
    verdicts = {}
    try:
        for policy in ("refuse", "keep_ids"):
            (report,) = apply_patch_to_actors([server.handle], assistant_edits=policy)
            assert report.already_patched and report.assistant_edits == policy
            with httpx.Client(timeout=300) as client:
                verdicts[policy] = client.post(
                    f"{server.base_url}/tokenize", json={"model": model, "messages": rewritten}
                )
    finally:
        apply_patch_to_actors([server.handle])  # later tests of this module expect the default
    assert verdicts["keep_ids"].status_code == 200, verdicts["keep_ids"].text
    assert verdicts["keep_ids"].json()["tokens"] == unedited.json()["tokens"]  # the ids won over the edit
    assert verdicts["refuse"].status_code == 400
    assert (
        "messages[2].content is not what its generation_token_ids say" in verdicts["refuse"].json()["error"]["message"]
    )
