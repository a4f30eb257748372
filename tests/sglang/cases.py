"""What the SGLang cases share: the servers (pytest fixtures), a Gym-shaped conversation, the expectations.

A pytest plugin (``-p tests.sglang.cases``, set by ``tests/integration/sglang/test_sglang_hook.py``), so its
session fixtures exist once per process: SGLang's app is a module-level singleton (``http_server.app``,
``_global_state``), so one server runs at a time and :func:`servers` stops the current one before it starts another
family's. Importable without SGLang (the driver counts the cases in the trainer venv): SGLang and verl are imported
inside the fixtures.

Real in every case: verl 0.9.1's ``SGLangHttpServer`` (``tests.sglang.server``), SGLang's FastAPI app, its OpenAI
handlers, tokenizer manager, detokenizer, tool-call and reasoning parsers; HTTP over loopback. Scripted: the
scheduler (``tests.sglang.engine``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.conversations import TERMINATOR, TOOLS, follow_up, piecewise, plain_messages

MAX_MODEL_LEN = 1024
FAMILIES = ["qwen25", "qwen3", "llama3"]
# What the scripted model "says": compact JSON (the templates re-render it with spaces), Qwen3 thinks first.
CALL = {
    "chatml": '<tool_call>\n{"name":"get_weather","arguments":{"city":"%s"}}\n</tool_call>',
    "llama3": '{"name":"get_weather","parameters":{"city":"%s"}}',
}
THINK = "<think>\nSkinny weather is fine\n</think>\n\n"
SCRIPT = [("call", "tool"), ("call", "tool"), ("answer", "user"), ("call", "tool"), ("answer", None)]
# What Gym's vllm_model adds to every chat request with return_token_id_information: true.
GYM_CAPTURE = {"logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True}


def model_dir(family: str) -> Path:
    root = Path(os.environ.get("NGV_TINY_MODELS") or Path(__file__).resolve().parents[2] / ".cache" / "tiny-models")
    path = root / family
    if not (path / "config.json").exists():
        pytest.fail(f"tiny model {family} missing at {path}: run scripts/setup.sh (it builds the tiny models)")
    return path


@dataclass
class Server:
    """One family's server: verl's server object, an HTTP client on its loopback address, the tokenizer."""

    family: str
    verl_server: Any  # tests.sglang.server.CPUSGLangHttpServer
    client: Any  # httpx.Client
    tokenizer: Any

    @property
    def model(self) -> str:
        return f"tiny-{self.family}"

    @property
    def scheduler(self) -> Any:
        return self.verl_server.scheduler

    def post(self, path: str, body: dict) -> Any:
        return self.client.post(path, json={"model": self.model, **body})

    def chat(self, messages: list[dict], **body: Any) -> Any:
        """A chat request as Gym's vllm_model sends it (log-probs as token ids, prompt and generation ids back)."""
        return self.post(
            "/v1/chat/completions", {"messages": messages, **GYM_CAPTURE, "return_token_ids": True, **body}
        )

    def tokenize(self, messages: list[dict], **body: Any) -> list[int]:
        r = self.post("/tokenize", {"messages": messages, **body})
        assert r.status_code == 200, r.text
        return r.json()["tokens"]

    def terminator(self) -> int:
        return self.tokenizer.convert_tokens_to_ids(TERMINATOR[self.family])


def pytest_collection_modifyitems(items: list) -> None:
    """Cases grouped by the family their server serves (stable: file order within a family), so each family's
    server starts once rather than at every change of family (one server at a time: the module docstring)."""

    def family(item: Any) -> int:
        params = getattr(getattr(item, "callspec", None), "params", {})
        return FAMILIES.index(params.get("family", FAMILIES[0]))

    items.sort(key=family)


@pytest.fixture(scope="session")
def loop():
    from nemo_gym_adapter.runtime.loop_thread import LoopThread

    thread = LoopThread("sglang-server-loop")
    yield thread
    thread.close()


@pytest.fixture(scope="session")
def servers(loop) -> Callable[[str], Server]:
    """Factory: ``servers(family)``: verl's SGLang server for that tiny model (one at a time: module docstring)."""
    import httpx
    from transformers import AutoTokenizer

    from tests.sglang.server import CPUSGLangHttpServer

    current: dict[str, Server] = {}

    def get(family: str) -> Server:
        if family in current:
            return current[family]
        for old in current.values():
            _stop(loop, old)
        current.clear()
        server = CPUSGLangHttpServer(family, str(model_dir(family)), MAX_MODEL_LEN)
        loop.run(server.launch_server())
        host, port = server.get_server_address()
        assert host == "127.0.0.1"
        client = httpx.Client(base_url=f"http://{host}:{port}", timeout=120)
        current[family] = Server(family, server, client, AutoTokenizer.from_pretrained(str(model_dir(family))))
        return current[family]

    yield get
    for old in current.values():
        _stop(loop, old)


def _stop(loop: Any, server: Server) -> None:
    import asyncio

    server.client.close()
    server.scheduler.stop()

    async def stop() -> None:
        task = server.verl_server._server_task
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass
        for t in list(server.verl_server.tokenizer_manager.asyncio_tasks):
            t.cancel()

    loop.run(stop())


@pytest.fixture
def patched(monkeypatch):
    """SGLang with the token-ID patch (default options) for this test."""
    from nemo_gym_adapter.sglang import hooks, patch

    report = patch.apply_patch()
    monkeypatch.setitem(hooks.OPTIONS, "assistant_edits", "keep_ids")
    monkeypatch.setitem(hooks.OPTIONS, "fast_prefix", True)
    return report


@pytest.fixture
def unpatched():
    """Stock SGLang for this test (the control); the next test patches again."""
    from nemo_gym_adapter.sglang import patch

    patch.unpatch()
    yield
    patch.unpatch()


# ------------------------------------------------------------------------------------------- the conversation


def say(family: str, kind: str, seed: int) -> str:
    """What the scripted model says at a turn: a tool call or an answer (Qwen3 thinks first)."""
    city = ["Paris", "Oslo", "Skinny"][seed % 3]
    body = CALL["llama3" if family == "llama3" else "chatml"] % city if kind == "call" else "It is sunny."
    return THINK + body if family == "qwen3" else body


class Conversation:
    """A Gym-shaped tool conversation (:data:`SCRIPT`): ids and log-probs on every assistant message, tools,
    ``/tokenize`` per turn. Ids come from the answer when it has them; stock SGLang returns none, so the control
    takes what the engine actually got and produced from the scheduler (what Gym would have had)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.messages: list[dict] = [
            {"role": "system", "content": "You are a weather bot. Be brief."},
            {"role": "user", "content": "What is the weather in Paris? Skinny answers please."},
        ]
        self.turns: list[dict] = []
        self.responses: list[dict] = []

    def run(self) -> Conversation:
        s = self.server
        s.verl_server.set_script([say(s.family, kind, seed) for seed, (kind, _) in enumerate(SCRIPT)])
        for seed, (_, then) in enumerate(SCRIPT):
            sent = json.loads(json.dumps(self.messages))
            r = s.chat(self.messages, tools=TOOLS, tool_choice="auto", max_tokens=200, seed=seed)
            assert r.status_code == 200, r.text
            data = r.json()
            self.responses.append(data)
            choice = data["choices"][0]
            call = s.scheduler.calls[-1]
            generation = choice.get("token_ids")
            if generation is None:  # stock SGLang: no ids in the answer
                generation = list(s.scheduler.outputs[-1])
            self.turns.append(
                {
                    "messages": sent,
                    "prompt": call.input_ids,
                    "answered_prompt": data.get("prompt_token_ids"),
                    "generation": generation,
                    "tokens": s.tokenize(sent, tools=TOOLS),
                }
            )
            self.messages.append(self._assistant(choice, call.input_ids, generation, seed))
            if then:
                self.messages.append(follow_up(then, self.messages[-1]))
        return self

    @staticmethod
    def _assistant(choice: dict, prompt: list[int], generation: list[int], seed: int) -> dict:
        message = choice["message"]
        answer = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("reasoning_content"):
            answer["reasoning_content"] = message["reasoning_content"]
        if message.get("tool_calls"):
            answer["tool_calls"] = [
                {"id": c["id"] or f"call_{seed}", "type": "function", "function": c["function"]}
                for c in message["tool_calls"]
            ]
        answer.update(prompt_token_ids=prompt, generation_token_ids=generation)
        answer["generation_log_probs"] = [e["logprob"] for e in choice["logprobs"]["content"]]
        return answer

    def history_kept(self) -> list[bool]:
        """Per turn transition: does the next engine prompt start with the previous prompt + generation?"""
        return [
            cur["prompt"][: len(prev["prompt"]) + len(prev["generation"])] == prev["prompt"] + prev["generation"]
            for prev, cur in zip(self.turns, self.turns[1:], strict=False)
        ]


def sglang_tools() -> list[dict]:
    """The tool dicts SGLang hands the chat template (``serving_chat.py:486``: ``Tool.model_dump()``)."""
    from sglang.srt.entrypoints.openai.protocol import Tool

    return [Tool.model_validate(t).model_dump() for t in TOOLS]


def two_turns(server: Server, content: str = "Skinny weather in Paris", pad_words: int = 0, tools=None):
    """``[user, assistant with ids (spelled piecewise), user]`` and the model's history ids."""
    first = [{"role": "user", "content": "What is the weather? " + "weather " * pad_words}]
    prompt = server.tokenize(first, **({"tools": tools} if tools else {}))
    generation = piecewise(server.tokenizer, content) + [server.terminator()]
    assistant = {
        "role": "assistant",
        "content": content,
        "prompt_token_ids": prompt,
        "generation_token_ids": generation,
    }
    return [*first, assistant, {"role": "user", "content": "And Oslo?"}], prompt + generation


__all__ = ["Conversation", "plain_messages", "sglang_tools", "two_turns"]
